"""Unit tests start no process: tests/unit holds pure functions run in the test's own process (checked as they run)."""

from __future__ import annotations

import contextlib
import multiprocessing.process
import platform
import sys

#: The interpreter's audit events that start a process: subprocess (Beam's worker pool, the storage emulator,
#: ``python -c``), a fork (a DataLoader's or a process pool's workers), os.system and the exec/spawn families.
STARTS_A_PROCESS = frozenset(
    {
        "subprocess.Popen",
        "os.fork",
        "os.forkpty",
        "os.posix_spawn",
        "os.posix_spawnp",
        "os.spawn",
        "os.system",
        "os.exec",
    }
)

_started: list[str] | None = None  # while a guarded phase runs: what it started


def _audit(event: str, args: tuple) -> None:
    if _started is not None and event in STARTS_A_PROCESS:
        _started.append(f"{event} {list(args[1] if event == 'subprocess.Popen' else args)!r}"[:200])


_start = multiprocessing.process.BaseProcess.start


def _start_watched(self) -> None:
    # A spawn or forkserver context starts its process without an audit event (_posixsubprocess directly).
    if _started is not None:
        _started.append(f"multiprocessing {type(self).__name__} {self.name}")
    _start(self)


# Python learns the processor's name by running `uname -p` once, on first asking, and keeps it; h5py asks as it is
# imported. Asked here, before any test, so that a unit test that first imports h5py is not charged with that process.
platform.processor()
sys.addaudithook(_audit)  # (for the process's life: an audit hook cannot be removed; idle while _started is None)
multiprocessing.process.BaseProcess.start = _start_watched


@contextlib.contextmanager
def no_process_started(nodeid: str):
    """Fail ``nodeid``'s phase run inside if it started a process, naming the first one and where it belongs."""
    global _started
    _started = started = []
    try:
        yield
    finally:
        _started = None
    if started:
        raise AssertionError(
            f"{nodeid} started a process ({started[0]}): tests/unit is for pure functions in this process; "
            "move it to tests/process"
        )
