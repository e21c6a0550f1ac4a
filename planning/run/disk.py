"""The disk under shards written in place: their space reserved up front, their bytes handed to it as they come.

Both on Linux; elsewhere neither, and the commit's fsync writes everything, as before.

Reserving (``reserve_space``, Linux's ``fallocate``): a shard's blocks are the build's from the start, so no other
writer can fill the disk under it minutes in, and they lie in a few extents; records then land in blocks already
allocated (the build's kernel time 0.86x, 4 alternated pairs at 4x).

Writeback (``WRITEBACK``): records written in place sit in the page cache until the commit's fsync, which then
waited for the whole output (at 4x the benchmark's data, 3.3 GB: 4.5 s of a 21.7 s build, the cores idle). A
thread of the worker process asks the kernel to start writing a shard's dirty pages each time
``BYTES_PER_WRITEBACK`` more of them have been written (``sync_file_range(SYNC_FILE_RANGE_WRITE)``, as RocksDB's
``bytes_per_sync``), so the disk writes while the cores cut and encode. It only starts writes and never waits for
them: an I/O error stays recorded on the file for the commit's fsync to report (an fsync here would report it
once, and then never again to the commit).
"""

from __future__ import annotations

import ctypes
import errno
import os
import threading
import weakref

#: Dirty bytes of one shard file, written since the last request, that make the next one.
BYTES_PER_WRITEBACK = 16 * 2**20
_START_WRITES = 2  # SYNC_FILE_RANGE_WRITE: start writing the range's dirty pages; do not wait for them


def _libc(name: str, *argtypes):
    """libc's function ``name``, or None where there is none."""
    try:
        function = getattr(ctypes.CDLL(None, use_errno=True), name)
    except (AttributeError, OSError):
        return None
    function.argtypes = list(argtypes)
    function.restype = ctypes.c_int
    return function


# Not os.posix_fallocate: where a filesystem cannot allocate, glibc's writes a byte to every block instead.
_fallocate = _libc("fallocate", ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64)
_KEEP_SIZE, _PUNCH_HOLE = 0x01, 0x02  # FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE


def reserve_space(path: str, nbytes: int) -> bool:
    """Make ``path`` (created if need be, never truncated) ``nbytes`` long with its blocks allocated; whether they
    are. False where the filesystem or the system cannot (the file is then left as it was, or created empty).

    Raises OSError(ENOSPC) when the disk has not the room.
    """
    if _fallocate is None or nbytes <= 0:
        return False
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o666)
    try:
        size = os.fstat(descriptor).st_size
        if _fallocate(descriptor, 0, 0, nbytes) == 0:
            return True
        code = ctypes.get_errno()
        if code == errno.ENOSPC:
            # ext4 keeps what it allocated before it ran out (measured: every free block of the disk): give the
            # blocks past the file's own bytes back, then its size.
            _fallocate(descriptor, _PUNCH_HOLE | _KEEP_SIZE, size, max(nbytes - size, 1))
            os.ftruncate(descriptor, size)
            raise OSError(code, os.strerror(code), path)
        return False  # EOPNOTSUPP (no fallocate on this filesystem), EFBIG, ...
    finally:
        os.close(descriptor)


class Writeback:
    """Counts what a process writes into each file and hands each file to the disk every ``every`` bytes."""

    def __init__(self, every: int = BYTES_PER_WRITEBACK):
        self.every = every
        self._start = _libc("sync_file_range", ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint)
        self._reset()
        if hasattr(os, "register_at_fork"):
            mine = weakref.ref(self)
            os.register_at_fork(after_in_child=lambda: (me := mine()) is not None and me._reset())

    def _reset(self) -> None:
        """No file, no thread (also in a forked child: the parent's thread and its lock's state did not come along)."""
        self._changed = threading.Condition()
        self._dirty: dict[str, int] = {}
        self._pending: dict[str, None] = {}  # (ordered, each file once)
        self._running = False
        self.handed = 0  # files handed to the disk (a file handed again counts again)
        self._thread: threading.Thread | None = None

    def wrote(self, path: str, nbytes: int) -> None:
        """``nbytes`` more were written into ``path``."""
        if self._start is None:
            return
        with self._changed:
            dirty = self._dirty.pop(path, 0) + nbytes
            if dirty < self.every:
                self._dirty[path] = dirty
                return
            self._pending[path] = None
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="writeback", daemon=True)
                self._thread.start()
            self._changed.notify()

    def idle(self, timeout: float | None = None) -> bool:
        """Wait until no request is pending (tests); whether none is."""
        with self._changed:
            return self._changed.wait_for(lambda: not self._pending and not self._running, timeout)

    def _run(self) -> None:
        while True:
            with self._changed:
                self._running = False
                self._changed.notify_all()
                self._changed.wait_for(lambda: self._pending)
                path = next(iter(self._pending))
                del self._pending[path]
                self._running = True
            self._start_writes(path)

    def _start_writes(self, path: str) -> None:
        try:
            # Its own descriptor: the writer's may be closed, its number reused, by the time this runs.
            descriptor = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:  # removed (a stopped or failed build), or renamed by the commit, which syncs it
            return
        try:
            # (Its I/O errors are the commit's fsync's to report; a refusal leaves the file to the commit.)
            if self._start(descriptor, 0, 0, _START_WRITES) == 0:
                self.handed += 1
        finally:
            os.close(descriptor)


#: The process's one writeback thread, shared by its writers.
WRITEBACK = Writeback()
