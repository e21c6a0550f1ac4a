"""Stopping a local run's worker threads from writing once the build is interrupted (Ctrl-C, SIGTERM).

Python cannot stop a thread. So every write into the output or its working directory goes
through ``writing()``, which refuses to start once the run is cancelled; the driver cancels,
waits for the writes in flight to end, and only then removes the run's files, which no worker
can then create again.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

_cancelled = threading.Event()
#: A stop was asked (Ctrl-C, SIGTERM): unlike a failed build's cancelled writes, it ends the command.
_stopped = threading.Event()
_in_flight = 0
_lock = threading.Condition()


class Cancelled(KeyboardInterrupt):
    """Raised in a worker thread that was about to write after the build was interrupted."""


def check_cancelled() -> None:
    """Raise Cancelled if writes are refused (a stop, or a failed build cleaning up): called holding no lock."""
    if _cancelled.is_set():
        raise Cancelled("the build was interrupted")


def check_stopped() -> None:
    """Raise Cancelled if a stop was asked (Ctrl-C, SIGTERM): the checkpoints where a stopped build unwinds.

    Not after a failed build: its refused writes must not stop planning or a next build in the process.
    """
    if _stopped.is_set():
        raise Cancelled("the build was interrupted")


def is_stopped() -> bool:
    """Whether a stop was asked (Ctrl-C, SIGTERM): for waits that poll rather than raise (check_stopped)."""
    return _stopped.is_set()


@contextlib.contextmanager
def writing() -> Iterator[None]:
    """Hold for the length of one write; raises Cancelled if the run is cancelled before it starts."""
    global _in_flight
    with _lock:
        check_cancelled()
        _in_flight += 1
    try:
        yield
    finally:
        with _lock:
            _in_flight -= 1
            _lock.notify_all()


def cancel() -> None:
    """A stop: refuse every write from now on and make ``check_stopped`` raise, until ``reset``."""
    _stopped.set()
    _cancelled.set()


def cancel_writes(timeout: float = 30.0) -> bool:
    """Refuse every write from now on and wait for those in flight; False if some still run after ``timeout``."""
    _cancelled.set()
    deadline = time.monotonic() + timeout
    with _lock:
        while _in_flight:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            _lock.wait(remaining)
    return True


def allow_writes() -> None:
    """Allow writes again for a new build in this process (an earlier one that failed refused them), unless a
    stop was asked: a signal that came before the build started must still stop it."""
    if not _stopped.is_set():
        _cancelled.clear()


def reset() -> None:
    """A new command in this process: no stop asked, writes allowed."""
    _stopped.clear()
    _cancelled.clear()
