"""One build at a time into an output: a lock held for the whole run, released by the system when the process ends.

The lock is an ``flock`` on a file in this machine's temp directory named after the output
(never a file in the output itself, which may be a bucket or a directory of someone else's
files). A crashed or killed build holds nothing: the kernel releases its lock, so a stale lock
cannot block the next build. Two builds on different machines into one output are not seen.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import socket
import tempfile
import time
from collections.abc import Iterator

from schemas.errors import UserError
from schemas.urls import is_remote


def _lock_path(output: str) -> str:
    if is_remote(output):
        # The same gs:// URL on a storage emulator is another storage (tests run side by side).
        canonical = f"{os.environ.get('STORAGE_EMULATOR_HOST', '')} {output.rstrip('/')}"
    else:
        canonical = os.path.realpath(os.path.expanduser(output))
    digest = hashlib.sha256(canonical.encode()).hexdigest()[:24]
    directory = os.path.join(tempfile.gettempdir(), "xarray-tfrecords-locks")
    os.makedirs(directory, exist_ok=True)
    return os.path.join(directory, f"{digest}.lock")


def _holder(fd: int) -> str:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        holder = json.loads(os.read(fd, 4096) or b"{}")
        started = time.strftime("%H:%M:%S", time.localtime(holder["started"]))
        return f" (process {holder['pid']} on {holder['host']}, started {started})"
    except (ValueError, KeyError, TypeError, OSError):
        return ""


@contextlib.contextmanager
def output_lock(output: str) -> Iterator[None]:
    """Hold the lock on ``output`` until the block ends; refuse in one line if another build holds it."""
    fd = os.open(_lock_path(output), os.O_RDWR | os.O_CREAT, 0o666)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise UserError(
                f"output: another build is writing {output}{_holder(fd)}; wait for it to end, or choose another output"
            ) from None
        holder = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time(), "output": output}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(holder).encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock
