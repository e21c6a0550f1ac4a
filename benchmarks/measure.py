"""Running one competitor in its own process: wall time and the peak RSS of its whole process tree."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import subprocess
import tempfile
import threading
import time
from collections.abc import Sequence

import psutil

POLL_SECONDS = 0.05
_OUTPUT_TAIL_CHARS = 4000


@dataclasses.dataclass(frozen=True)
class Measurement:
    """What the orchestrator sees of one competitor's run."""

    wall_seconds: float
    peak_rss_bytes: int
    returncode: int
    output_tail: str
    load_before: float
    load_after: float

    @property
    def ok(self) -> bool:
        return self.returncode == 0


def tree_rss(process: psutil.Process) -> int:
    """RSS of a process and all its descendants, summed (shared pages count once per process)."""
    try:
        members = [process, *process.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0
    total = 0
    for member in members:
        # A member that exited between listing and reading holds no memory any more.
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            total += member.memory_info().rss
    return total


class _PeakSampler(threading.Thread):
    """Polls the tree's RSS until stopped, keeping the maximum."""

    def __init__(self, pid: int):
        super().__init__(daemon=True)
        self._process = psutil.Process(pid)
        self._stop_event = threading.Event()
        self.peak = 0

    def run(self) -> None:
        while True:
            self.peak = max(self.peak, tree_rss(self._process))
            if self._stop_event.wait(POLL_SECONDS):
                return

    def stop(self) -> int:
        self._stop_event.set()
        self.join()
        return self.peak


def _kill_tree(pid: int) -> None:
    """End a competitor that overran, and the workers it started, each by its own id."""
    try:
        root = psutil.Process(pid)
        members = [*root.children(recursive=True), root]
    except psutil.NoSuchProcess:
        return
    for member in members:
        with contextlib.suppress(psutil.NoSuchProcess):
            member.kill()


def run_measured(
    command: Sequence[str], cwd: str, env: dict[str, str] | None = None, timeout: float | None = None
) -> Measurement:
    """Run ``command`` to completion, sampling its tree's RSS every POLL_SECONDS."""
    # Output goes to a file, not a pipe: worker processes that inherit the handle and outlive
    # the parent by a moment would otherwise hold communicate() open.
    with tempfile.TemporaryFile() as log:
        load_before = os.getloadavg()[0]
        started = time.perf_counter()
        process = subprocess.Popen(command, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT)
        sampler = _PeakSampler(process.pid)
        sampler.start()
        try:
            returncode = process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_tree(process.pid)
            returncode = process.wait()
        wall = time.perf_counter() - started
        peak = sampler.stop()
        log.seek(0)
        output = log.read().decode(errors="replace")
    return Measurement(wall, peak, returncode, output[-_OUTPUT_TAIL_CHARS:], load_before, os.getloadavg()[0])
