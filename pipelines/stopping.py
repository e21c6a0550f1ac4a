"""Stopping a build on Ctrl-C or SIGTERM without raising into the code the signal interrupts.

Python runs a signal handler in the main thread between two bytecodes, wherever that thread
is: an exception raised there can leave a lock held (logging's, a queue's) that Beam's threads
then wait on for ever, while the unwinding main thread waits on them (issue 21, item 9). So the
handler raises nothing. The signal reaches a thread of this module through a pipe
(``signal.set_wakeup_fd``: written even while the main thread is stuck in C code), which:

1. cancels the run (planning.run.cancellation): no write starts any more, and the main thread's
   checkpoints raise where it holds nothing; a job running on other machines (Dataflow, a Dask
   cluster: ``watch_job``) is cancelled and waited for first, and its files are left if it cannot be;
2. kills this process's child processes (Beam's worker processes ignore the signal; the
   probing pool's would keep the main thread waiting);
3. waits for the main thread to unwind and clean up (the orderly stop, ``GRACE`` seconds; no
   wait once Beam's worker processes had to be killed: its runner would wait on them for
   ever); if it does not, cleans up itself: waits for the writes in flight, removes the run's files,
   prints the one line and ends the process (``os._exit``). A last timer ends the process
   even if that clean-up hangs.

A failure that no exception brings to the main thread (a Beam worker process that died: its
runner waits for it for ever) ends the build the same way, with its own line and exit code 1
(``fail_run``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol, TextIO

from pipelines.cli import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_TERMINATED
from planning.run.cancellation import cancel, cancel_writes
from transforms.compat.beam import BEAM_WORKER_MODULE

#: Seconds the main thread has to unwind and clean up after the signal before this module does.
GRACE = 10.0
#: Seconds after the grace at which the process ends, whatever that clean-up is doing.
CLEANUP_LIMIT = 15.0
#: Seconds to wait for the writes in flight when cleaning up for a main thread that did not unwind.
WRITES_WAIT = 5.0

EXIT_CODES = {signal.SIGINT: EXIT_INTERRUPTED, signal.SIGTERM: EXIT_TERMINATED}


#: Folders a process removes as it ends, even through ``os._exit`` (a stopped build's way out, which
#: skips atexit and weakref finalizers): Beam's temp folder of each pipeline made (pipelines.graph).
_REMOVED_AT_EXIT: set[str] = set()


def remove_at_exit(folder: str) -> None:
    """Have ``folder`` removed when the process ends, however it ends short of being killed."""
    _REMOVED_AT_EXIT.add(folder)


def remove_now(folder: str) -> None:
    """Remove ``folder`` (registered or not) and forget it."""
    _REMOVED_AT_EXIT.discard(folder)
    shutil.rmtree(folder, ignore_errors=True)


def exit_now(code: int) -> None:
    """``os._exit(code)``, after removing the folders registered with ``remove_at_exit``."""
    for folder in list(_REMOVED_AT_EXIT):
        remove_now(folder)
    os._exit(code)


class Job(Protocol):
    """A job on other machines, as a stop handles it (pipelines.remote_job.RemoteJob)."""

    name: str
    problem: str | None  # why it could not be stopped, once a stop failed

    def stop(self) -> bool: ...


_job: Job | None = None


def watch_job(job: Job | None) -> None:
    """The job a stop must cancel, and wait for, before the run's files are removed (None: none)."""
    global _job
    _job = job


def watched_job() -> Job | None:
    return _job


#: Seconds a stop may spend on a remote job before the clean-up's own limits start (remote_job.STOP_WAIT and more).
JOB_LIMIT = 330.0


def stopped_line(signum: int) -> str:
    what = "stopped by SIGTERM" if signum == signal.SIGTERM else "interrupted"
    job = _job
    if job is not None and job.problem is not None:
        return (
            f"error: {what}; {job.problem}: cancel it yourself; its files were left, and the output is not "
            "complete (--overwrite removes them once it has stopped)"
        )
    cancelled = f"{job.name} was cancelled, " if job is not None else ""
    return f"error: {what}; {cancelled}the run's files were removed and the output is not complete"


def failed_line(reason: str, fix: str = "") -> str:
    fix = f"; {fix}" if fix else ""
    return f"error: {reason}; the run's files were removed and the output is not complete{fix}"


_active: StopOnSignal | None = None


def fail_run(reason: str, fix: str = "") -> bool:
    """End the build with ``reason`` as a stop would, for a failure the main thread may never hear of (a Beam
    worker process that died: its runner may wait for it for ever). The main thread has ``GRACE`` seconds to unwind
    and end with this line; else the stop ends the build itself. Ignored once a stop is on (what it kills dies of
    it). Whether a stop takes it: False where none watches (the build is not run by its command)."""
    stop = _active
    return stop is not None and stop.fail(reason, fix)


class RunCleanup:
    """Removing a run's files once, by whichever comes first: the main thread unwinding, or the stop."""

    def __init__(self, remove: Callable[[], bool]):
        self._remove = remove
        self._lock = threading.Lock()
        self._done = False
        self._owned = True

    def __call__(self) -> bool:
        """Whether the output was still this run's when its files were removed (see remove_run_files)."""
        # The second caller waits for the first to finish: neither ends the process mid-clean-up.
        with self._lock:
            if not self._done:
                self._done = True
                self._owned = self._remove()
            return self._owned


_run_cleanup: RunCleanup | None = None


def clean_up_on_stop(cleanup: RunCleanup | None) -> None:
    """From now on, a stop that the main thread does not finish in time runs ``cleanup`` (None: nothing)."""
    global _run_cleanup
    _run_cleanup = cleanup


def _children() -> list[tuple[int, bool]]:
    """This process's child processes (Linux, through /proc; elsewhere none): (pid, is a Beam worker)."""
    me = str(os.getpid())
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if (proc / "stat").read_text().rsplit(")", 1)[1].split()[1] == me:
                found.append((int(proc.name), BEAM_WORKER_MODULE in (proc / "cmdline").read_bytes()))
        except (OSError, IndexError, ValueError):  # gone meanwhile, or not ours to read
            continue
    return found


def kill_children(reap: bool, wait: float = 2.0) -> list[tuple[int, bool]]:
    """SIGKILL this process's child processes; ``reap``: wait for them too, so none is left even as a zombie."""
    killed = []
    for pid, beam in _children():
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
            killed.append((pid, beam))
    if reap:
        deadline = time.monotonic() + wait
        for pid, _ in killed:
            try:
                while not os.waitpid(pid, os.WNOHANG)[0] and time.monotonic() < deadline:
                    time.sleep(0.005)
            except ChildProcessError:  # reaped already, by the thread or pool that started it
                pass
    return killed


class StopOnSignal:
    """From ``start()`` to ``close()`` (in the main thread): the signals stop the build as the module docstring says.

    ``requested`` is the signal once one came. The main thread, unwinding after it, calls
    ``end()`` before printing its line, which waits there if the stop is ending the process itself.
    """

    def __init__(self, signals: list[int], stream: TextIO):
        self._signals = signals
        self._stream = stream
        self.requested: int | None = None
        self.failure: str | None = None  # why the build failed, when fail() ended it
        self._fix = ""  # and what to do about it
        self._ending = threading.Lock()  # taken by whichever ends the process: the main thread or the stop
        self._returned = threading.Event()
        self._main_ends = False
        self._stopping = False
        self._starting = threading.Lock()  # one stop: by a signal or by a failure, whichever comes first
        self._installed = False

    def start(self) -> StopOnSignal:
        if not self._signals or threading.current_thread() is not threading.main_thread():
            return self
        self._read, self._write = os.pipe()
        os.set_blocking(self._write, False)  # as set_wakeup_fd requires; a full pipe loses nothing needed
        self._previous_fd = signal.set_wakeup_fd(self._write, warn_on_full_buffer=False)
        self._previous = {signum: signal.signal(signum, self._note) for signum in self._signals}
        self._installed = True
        threading.Thread(target=self._watch, name="stop-on-signal", daemon=True).start()
        global _active
        _active = self
        return self

    def ended(self) -> bool:
        """Whether the build ends by this stop: a signal came, or fail() was called."""
        return self.requested is not None or self.failure is not None

    def line(self) -> str:
        """The build's last line after the stop: the failure's, else the signal's."""
        return failed_line(self.failure, self._fix) if self.failure is not None else stopped_line(self.requested)

    def exit_code(self) -> int:
        return EXIT_FAILED if self.failure is not None else EXIT_CODES.get(self.requested, 128 + self.requested)

    def fail(self, reason: str, fix: str = "") -> bool:
        """Stop the build for a failure (fail_run): as a signal does, with ``reason`` in its line and exit code 1."""
        with self._starting:
            if self._returned.is_set():
                return False
            if self.requested is not None or self._stopping:
                return True  # a stop is on: what it kills dies of it
            self._stopping = True
            self.failure, self._fix = reason, fix
        threading.Thread(target=self._stop, name="stop", daemon=True).start()
        return True

    def end(self) -> None:
        """The main thread is ending the process after a stop: wait here if the stop is ending it instead."""
        self._ending.acquire()
        self._main_ends = True

    def close(self) -> None:
        if not self._installed:
            return
        global _active
        if _active is self:
            _active = None
        if not self._main_ends:
            self._ending.acquire()  # a stop that is ending the process now must not be cut short
        self._returned.set()
        signal.set_wakeup_fd(self._previous_fd)
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        os.write(self._write, b"\0")  # the watching thread ends on it and closes the pipe

    def _watch(self) -> None:
        while True:
            byte = os.read(self._read, 1)
            if not byte or byte == b"\0" or self._returned.is_set():
                os.close(self._read)
                os.close(self._write)
                return
            with self._starting:
                start = byte[0] in self._signals and not self._stopping
                if start:
                    self._stopping = True
                    if self.requested is None:
                        self.requested = byte[0]
            if start:
                threading.Thread(target=self._stop, name="stop", daemon=True).start()

    def _note(self, signum, frame) -> None:
        """Python's handler of the signals, in the main thread: it notes the signal, and that is all.

        Returning, it leaves the interrupted code to carry on, holding and releasing its locks as
        it would have; the byte in the pipe sets the stop going. Noted here, the signal is known
        before the main thread meets what it made fail (a pool process it killed, say).
        """
        if self.requested is None:
            self.requested = signum

    def _stop(self) -> None:
        code = self.exit_code()
        job = _job
        limit = GRACE + CLEANUP_LIMIT + (JOB_LIMIT if job is not None else 0.0)
        threading.Thread(target=self._last_resort, args=(code, limit), name="stop-last-resort", daemon=True).start()
        cancel()
        if self.failure is not None:
            # The failure's own way out first (fail_run's caller makes the runner unwind): the other worker
            # processes are not killed meanwhile, as the runner's unwinding waits for them to end their bundles.
            self._returned.wait(GRACE)
            self._end(code, cleanup=True)
            return
        if job is not None and not self._stop_job(job):
            # Removing files a running job writes would only make it commit a broken output.
            self._end(code, cleanup=False)
            return
        deadline = time.monotonic() + GRACE
        while True:
            # Again and again: Beam starts each worker process from a thread of its own, some late.
            # Its runner does not notice that they are gone: the main thread would wait on them
            # for ever, so the stop ends the build at once then. Otherwise the main thread unwinds.
            beam_killed = any(beam for _, beam in kill_children(reap=False))
            if beam_killed or time.monotonic() >= deadline or self._returned.wait(0.05):
                break
        self._end(code, cleanup=True)

    def _stop_job(self, job: Job) -> bool:
        """Cancel the remote job, waiting until none of it runs; whether it stopped."""
        with contextlib.suppress(Exception):
            self._stream.write(f"stopping: cancelling {job.name} and waiting for it to end\n")
            self._stream.flush()
        return job.stop()

    def _end(self, code: int, cleanup: bool) -> None:
        """End the process for a main thread that did not unwind in time (unless it is ending it itself)."""
        if self._returned.is_set() or not self._ending.acquire(blocking=False):
            return  # the main thread ended, or is ending, the build itself
        cancel_writes(WRITES_WAIT)
        remove = _run_cleanup if cleanup else None
        if remove is not None:
            with contextlib.suppress(Exception):
                remove()
        kill_children(reap=True)
        with contextlib.suppress(Exception):
            self._stream.write(self.line() + "\n")
            self._stream.flush()
        exit_now(code)

    def _last_resort(self, code: int, limit: float) -> None:
        if self._returned.wait(limit):
            return
        kill_children(reap=True)
        what = "stopped by SIGTERM" if code == EXIT_CODES[signal.SIGTERM] else "interrupted"
        what = self.failure if self.failure is not None else what
        line = f"error: {what}; cleaning up took too long: the output is not complete (--overwrite replaces it)\n"
        with contextlib.suppress(OSError):
            os.write(2, line.encode())
        exit_now(code)
