"""Running one competitor in its own process: wall time, CPU time and the peak RSS of its whole process tree.

Under ``XTF_BENCH_SMOKE=1`` (the benchmarks' smoke tests) a ``python -m MODULE ...`` (or ``-c``) competitor is
forked from one warmed interpreter (multiprocessing's fork server, Beam and xarray imported once)
instead of a fresh one: a smoke test proves each script runs end to end, and a fresh interpreter
spends about two thirds of a tiny build's CPU on imports. Its walls and RSS then measure nothing.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import gc
import multiprocessing
import os
import resource
import runpy
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence

import psutil

POLL_SECONDS = 0.05
_OUTPUT_TAIL_CHARS = 4000
SMOKE_VARIABLE = "XTF_BENCH_SMOKE"
#: What the fork server imports once for every warm child (what a build imports).
WARM_MODULES = ["pipelines.graph", "planning.plan", "xarray", "netCDF4", "numpy"]


@dataclasses.dataclass(frozen=True)
class Measurement:
    """What the orchestrator sees of one competitor's run."""

    wall_seconds: float
    peak_rss_bytes: int
    returncode: int
    output_tail: str
    load_before: float
    load_after: float
    #: CPU seconds (user, system) of the competitor's process tree: the processes it waited for; none forked warm
    cpu: tuple[float, float] = (0.0, 0.0)

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


def smoke() -> bool:
    """Whether this is a smoke run (``XTF_BENCH_SMOKE=1``): competitors forked warm, nothing measured."""
    return os.environ.get(SMOKE_VARIABLE) == "1"


def _warm_target(
    command: Sequence[str], flags: tuple[str, ...] = ("-m",), warm: bool | None = None
) -> tuple[str, str, list[str]] | None:
    """``(flag, module or code, arguments)`` of a ``python -m``/``-c`` command to fork warm (default: smoke runs)."""
    warm = smoke() if warm is None else warm
    if warm and len(command) >= 3 and command[0] == sys.executable and command[1] in flags:
        return command[1], command[2], list(command[3:])
    return None


class _Popen:
    """A fresh interpreter running ``command``: what run_measured waits on."""

    def __init__(self, command: Sequence[str], cwd: str, env: dict[str, str] | None, log) -> None:
        self._process = subprocess.Popen(command, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT)
        self.pid = self._process.pid

    def wait(self, timeout: float | None) -> int | None:
        try:
            return self._process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None


class _WarmChild:
    """``python -m MODULE`` (or ``-c CODE``) forked from the warmed fork server (smoke runs): no imports paid."""

    _context = None

    def __init__(self, target: tuple[str, str, list[str]], cwd: str, env: dict[str, str] | None, out, err) -> None:
        if _WarmChild._context is None:
            _WarmChild._context = multiprocessing.get_context("forkserver")
            _WarmChild._context.set_forkserver_preload(WARM_MODULES)
            atexit.register(_stop_fork_server)
        target_args = (*target, cwd, dict(env if env is not None else os.environ), out, err)
        self._process = _WarmChild._context.Process(target=_run_module, args=target_args)
        self._process.start()
        self.pid = self._process.pid

    def wait(self, timeout: float | None) -> int | None:
        self._process.join(timeout)
        return self._process.exitcode


def _stop_fork_server() -> None:
    """End the fork server with this process, not after it (its children's CPU then counts as ours)."""
    from multiprocessing import forkserver

    with contextlib.suppress(AttributeError, OSError):
        forkserver._forkserver._stop()


def _run_module(flag: str, what: str, arguments: list[str], cwd: str, env: dict[str, str], out: str, err: str) -> None:
    """In the warm child: what ``python -m what *arguments`` (or ``-c what``) would do, its output into files."""
    gc.freeze()  # the server's imports live as long as the child: the collector need not walk them (pipelines.cli)
    os.chdir(cwd)
    sys.path.insert(0, cwd if flag == "-m" else "")  # what the interpreter puts first for -m (-c: the cwd, as '')
    os.environ.clear()
    os.environ.update(env)
    os.dup2(os.open(out, os.O_WRONLY | os.O_APPEND), 1)
    os.dup2(os.open(err, os.O_WRONLY | os.O_APPEND), 2)
    try:
        if flag == "-m":
            sys.argv = [what, *arguments]
            runpy.run_module(what, run_name="__main__", alter_sys=True)
        else:
            sys.argv = ["-c", *arguments]
            exec(compile(what, "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
    finally:  # multiprocessing's child ends with os._exit: what a normal exit does, done here
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()


def run_measured(
    command: Sequence[str], cwd: str, env: dict[str, str] | None = None, timeout: float | None = None
) -> Measurement:
    """Run ``command`` to completion, sampling its tree's RSS every POLL_SECONDS."""
    # Output goes to a file, not a pipe: worker processes that inherit the handle and outlive
    # the parent by a moment would otherwise hold communicate() open.
    with tempfile.NamedTemporaryFile() as log:
        load_before = os.getloadavg()[0]
        # (this process's own threads start no process; a warm child's CPU is its fork server's, and reads as 0)
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        warm = _warm_target(command, ("-m", "-c"))
        process = _WarmChild(warm, cwd, env, log.name, log.name) if warm else _Popen(command, cwd, env, log)
        sampler = _PeakSampler(process.pid)
        sampler.start()
        returncode = process.wait(timeout)
        if returncode is None:
            _kill_tree(process.pid)
            returncode = process.wait(None)
        wall = time.perf_counter() - started
        peak = sampler.stop()
        log.seek(0)
        output = log.read().decode(errors="replace")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - children.ru_utime, after.ru_stime - children.ru_stime)
    return Measurement(wall, peak, returncode, output[-_OUTPUT_TAIL_CHARS:], load_before, os.getloadavg()[0], cpu)


def run_captured(
    command: Sequence[str],
    cwd: str | None = None,
    env: dict[str, str] | None = None,
    timeout: float | None = None,
    warm: bool | None = None,
) -> subprocess.CompletedProcess:
    """``subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)``.

    A ``python -m``/``-c`` command is forked warm instead when ``warm`` (default: in a smoke run).
    """
    target = _warm_target(command, ("-m", "-c"), warm)
    if target is None:
        return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    with tempfile.NamedTemporaryFile() as out, tempfile.NamedTemporaryFile() as err:
        child = _WarmChild(target, cwd or os.getcwd(), env, out.name, err.name)
        returncode = child.wait(timeout)
        if returncode is None:
            _kill_tree(child.pid)
            child.wait(None)
            raise subprocess.TimeoutExpired(list(command), timeout)
        printed = [stream.read().decode(errors="replace") for stream in (out, err)]
    return subprocess.CompletedProcess(list(command), returncode, *printed)
