"""A remote input file as a worker reads it: by byte ranges, never a whole-file copy, counting every byte fetched."""

from __future__ import annotations

import bisect
import functools
import io
import math

import fsspec
from fsspec.asyn import AsyncFileSystem

from planning.formats.netcdf3 import ClassicHeader, read_header
from schemas.errors import UserError

#: First read of a file: its format and, for classic files, the whole header in most files
#: (a few KB; read again four times larger when it is not).
HEADER_BYTES = 4 * 1024
#: Block size of HDF5's reads outside the prefetched slab (its metadata, mostly), which h5py
#: makes one after another. Measured per unit on ERA5-like files (benchmarks/unit_memory.py):
#: 16 KiB fetches 1.15x (contiguous) and 1.29x (chunked) the slab's stored bytes in 19 and 55
#: round trips; 64 KiB 1.45x and 2.1x in 18 and 51; 4 KiB 1.08x and 1.13x but in 22 and 89.
HDF5_BLOCK_BYTES = 16 * 1024
#: Blocks kept per open file: the file is opened twice (to locate the slab, then to read it).
BLOCK_CACHE_BYTES = 4 * 1024 * 1024
#: Range requests in flight per file: a unit's few hundred ranges go in a dozen waves of latency.
REQUESTS_IN_FLIGHT = 16


class RemoteFile:
    """One remote file (any fsspec URL), and the bytes and range requests read from it so far."""

    def __init__(self, path: str, size: int | None = None):
        self.path = path
        self._size = size
        self.bytes_read = 0
        self.requests = 0
        self.round_trips = 0  # waves of requests in flight: what latency multiplies

    @functools.cached_property
    def _located(self) -> tuple[fsspec.AbstractFileSystem, str]:
        return fsspec.core.url_to_fs(self.path)

    def fetch(self, ranges: list[tuple[int, int]]) -> list[bytes]:
        """The bytes of each range [start, stop), in order."""
        if not ranges:
            return []
        fs, resolved = self._located
        extra = {"batch_size": REQUESTS_IN_FLIGHT} if isinstance(fs, AsyncFileSystem) else {}
        parts = fs.cat_ranges(
            [resolved] * len(ranges),
            [start for start, _ in ranges],
            [stop for _, stop in ranges],
            on_error="raise",
            **extra,
        )
        self.bytes_read += sum(len(p) for p in parts)
        self.requests += len(ranges)
        self.round_trips += math.ceil(len(ranges) / REQUESTS_IN_FLIGHT)
        return parts

    def classic_header(self) -> ClassicHeader | None:
        """The header if this is a classic NetCDF file (CDF-1, -2, -5), else None."""
        size = HEADER_BYTES
        while True:
            (data,) = self.fetch([(0, size)])
            try:
                return read_header(io.BytesIO(data))
            except EOFError:
                if len(data) < size:
                    raise UserError(f"{self.path}: ends inside its NetCDF header; copy the file again") from None
                size *= 4
            except ValueError as error:
                raise UserError(f"{self.path}: corrupt NetCDF header ({error}); fix or remove the file") from None

    @property
    def size(self) -> int:
        if self._size is None:
            fs, resolved = self._located
            self._size = int(fs.size(resolved))
        return self._size


class BlockReader(io.RawIOBase):
    """A read-only file over a RemoteFile, for h5py: prefetched ranges first, else exact or cached-block reads.

    What a slab needs is prefetched, its ranges fetched concurrently (``prefetch``); HDF5's
    reads inside them cost nothing more. Other reads of a block or more are fetched exactly.
    Smaller ones (HDF5 reads its metadata a few bytes at a time, near each other) go through
    aligned blocks, the last few kept, so they take a few requests.
    """

    def __init__(self, remote: RemoteFile, block_bytes: int | None = None):
        self._remote = remote
        self._block_bytes = block_bytes or HDF5_BLOCK_BYTES
        self._position = 0
        # A cache of a function of the file, not of this reader's bound method: that would be a reference
        # cycle, kept (with every byte prefetched) until the cyclic GC runs, maybe after thousands of files.
        fetch_block = functools.partial(_fetch_block, remote, self._block_bytes)
        self._block = functools.lru_cache(max(1, BLOCK_CACHE_BYTES // self._block_bytes))(fetch_block)
        self._ready_starts: list[int] = []
        self._ready: list[bytes] = []

    def prefetch(self, ranges: list[tuple[int, int]], parts: list[bytes] | None = None) -> None:
        """Fetch these ranges (sorted, not overlapping) now, concurrently, and serve reads inside them.

        ``parts``: their bytes, if fetched already (planning fetches many files' ends at once).
        """
        if parts is None:
            parts = self._remote.fetch(ranges)
        else:
            self._remote.bytes_read += sum(len(part) for part in parts)
        self._ready = parts
        self._ready_starts = [start for start, _ in ranges]

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._position, io.SEEK_END: self._remote.size}[whence]
        self._position = base + offset
        return self._position

    def prefetched_view(self, start: int, stop: int) -> memoryview | None:
        """The bytes [start, stop) of the file, without a copy, if one prefetched range holds them all; else None."""
        at = bisect.bisect_right(self._ready_starts, start) - 1
        if at < 0 or stop > self._ready_starts[at] + len(self._ready[at]):
            return None
        offset = start - self._ready_starts[at]
        return memoryview(self._ready[at])[offset : offset + stop - start]

    def readinto(self, buffer) -> int:
        view = memoryview(buffer).cast("B")
        start = self._position
        stop = min(start + len(view), self._remote.size)
        if stop <= start:
            return 0
        data = self.prefetched_view(start, stop)
        if data is None and stop - start >= self._block_bytes:
            (data,) = self._remote.fetch([(start, stop)])
        elif data is None:
            first, last = start // self._block_bytes, (stop - 1) // self._block_bytes
            joined = b"".join(self._block(n) for n in range(first, last + 1))
            offset = start - first * self._block_bytes
            data = joined[offset : offset + stop - start]
        view[: len(data)] = data
        self._position += len(data)
        return len(data)


def _fetch_block(remote: RemoteFile, block_bytes: int, number: int) -> bytes:
    start = number * block_bytes
    (data,) = remote.fetch([(start, min(start + block_bytes, remote.size))])
    return data
