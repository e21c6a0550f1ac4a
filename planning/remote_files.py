"""A remote input file as a worker reads it: by byte ranges, never a whole-file copy, counting every byte fetched."""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator

import fsspec
import xarray as xr
from fsspec.asyn import AsyncFileSystem

from planning.netcdf3 import ClassicHeader, read_header
from planning.sources import open_locked
from schemas.errors import UserError

#: First read of a file: its format and, for classic files, the whole header in most files
#: (a few KB; read again four times larger when it is not).
HEADER_BYTES = 16 * 1024
#: Block size of the cache HDF5 reads through. Every metadata read and every chunk costs at
#: least one block: smaller blocks fetch fewer unneeded bytes, larger ones fewer requests
#: (benchmarks/unit_memory.py measures bytes read per stored byte of the slab).
HDF5_BLOCK_BYTES = 256 * 1024
#: Range requests in flight per file: enough to overlap latency, few enough for a server's queue.
REQUESTS_IN_FLIGHT = 8


class RemoteFile:
    """One remote file (any fsspec URL) and the bytes read from it so far."""

    def __init__(self, path: str):
        self.path = path
        self._fs, self._resolved = fsspec.core.url_to_fs(path)
        self.bytes_read = 0

    def fetch(self, ranges: list[tuple[int, int]]) -> list[bytes]:
        """The bytes of each range [start, stop), in order."""
        if not ranges:
            return []
        extra = {"batch_size": REQUESTS_IN_FLIGHT} if isinstance(self._fs, AsyncFileSystem) else {}
        parts = self._fs.cat_ranges(
            [self._resolved] * len(ranges),
            [start for start, _ in ranges],
            [stop for _, stop in ranges],
            on_error="raise",
            **extra,
        )
        self.bytes_read += sum(len(p) for p in parts)
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

    @contextlib.contextmanager
    def open_hdf5(self) -> Iterator[xr.Dataset]:
        """The file opened lazily through h5netcdf, read by cached blocks (NetCDF-4 and other HDF5 files)."""
        with self._fs.open(self._resolved, "rb", cache_type="blockcache", block_size=HDF5_BLOCK_BYTES) as stream:
            fetch_range = stream.cache.fetcher

            def counted(start: int, stop: int) -> bytes:
                data = fetch_range(start, stop)
                self.bytes_read += len(data)
                return data

            stream.cache.fetcher = counted
            with contextlib.ExitStack() as stack:
                try:
                    dataset = stack.enter_context(open_locked(stream, engine="h5netcdf", decode_times=False))
                except Exception as error:  # h5py raises OSError, ValueError, ... for what it cannot read
                    reason = str(error).splitlines()[0] if str(error) else type(error).__name__
                    raise UserError(
                        f"{self.path}: cannot be read as NetCDF ({reason[:200]}); fix or remove the file"
                    ) from None
                yield dataset
