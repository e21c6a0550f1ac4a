"""The input NetCDF files: listing them, checking them, and opening them (locally or through fsspec)."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import logging
import os
import tempfile
import threading
import warnings
from collections.abc import Iterator, Sequence

import fsspec
import xarray as xr
from fsspec.implementations.local import LocalFileSystem

from planning.netcdf3 import expected_size
from schemas.errors import UserError
from schemas.urls import is_remote

logger = logging.getLogger(__name__)

_HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"
_HEADER_READ = 2**20


def expand_paths(patterns: Sequence[str]) -> list[str]:
    """Every file the globs match, each once, sorted; an error names a pattern that matches none."""
    found: list[str] = []
    for pattern in patterns:
        fs, _, paths = fsspec.get_fs_token_paths(pattern)
        paths = [p for p in paths if fs.exists(p)]
        if not paths:
            raise UserError(f"input: {pattern!r} matches no file; check the path or glob (quote it in the shell)")
        files = [p for p in paths if not fs.isdir(p)]
        if not files:
            raise UserError(f"input: {pattern!r} matches only directories; add a file glob such as '/*.nc'")
        local = isinstance(fs, LocalFileSystem)
        found.extend(p if local else fs.unstrip_protocol(p) for p in files)
    return sorted(dict.fromkeys(found))


def file_size(path: str) -> int:
    fs, _, (resolved,) = fsspec.get_fs_token_paths(path)
    return int(fs.size(resolved))


def check_not_truncated(path: str) -> int:
    """The file's size, after checking a classic NetCDF file holds all the bytes its header declares."""
    size = file_size(path)
    with fsspec.open(path, "rb") as raw:
        # The header is parsed a few bytes at a time: buffer it, or each read of a remote file
        # would wait on a request of its own.
        stream = io.BufferedReader(raw, buffer_size=_HEADER_READ) if is_remote(path) else raw
        try:
            expected = expected_size(stream)
        except (EOFError, ValueError) as error:
            raise UserError(f"{path}: corrupt NetCDF header ({error}); fix or remove the file") from None
    if expected is not None and size < expected:
        raise UserError(
            f"{path}: truncated: {size} bytes but its header needs {expected} "
            "(the netCDF library would read the missing part as zeros); copy the file again"
        )
    return size


def _is_hdf5(path: str) -> bool:
    with fsspec.open(path, "rb") as stream:
        return stream.read(8) == _HDF5_MAGIC


@contextlib.contextmanager
def _local_copy(path: str) -> Iterator[str]:
    """A remote file downloaded to local temp (the netCDF library reads only local files)."""
    suffix = os.path.splitext(path)[1] or ".nc"
    handle, local = tempfile.mkstemp(prefix="xtf-", suffix=suffix)
    os.close(handle)
    try:
        fs, _, (resolved,) = fsspec.get_fs_token_paths(path)
        fs.get(resolved, local)
        yield local
    finally:
        os.remove(local)


#: The netCDF and HDF5 C libraries are not thread-safe (concurrent opens crash the process), and
#: Beam's multi_threading mode runs several units at once: one file is open at a time per process.
NETCDF_LOCK = threading.Lock()


@contextlib.contextmanager
def _opened(target, **kwargs) -> Iterator[xr.Dataset]:
    with NETCDF_LOCK, warnings.catch_warnings():
        # Packed files often carry a NaN _FillValue on integer data, which xarray rightly drops
        # (NaN cannot be an integer fill); its warning says nothing the user can act on.
        warnings.simplefilter("ignore", xr.SerializationWarning)
        # No pandas indexes: we index by position, and building them is a quarter of an open.
        dataset = xr.open_dataset(target, cache=False, create_default_indexes=False, **kwargs)
        try:
            yield dataset
        finally:
            dataset.close()


@contextlib.contextmanager
def _open_any(path: str, decode_times: bool, download: bool) -> Iterator[xr.Dataset]:
    if not is_remote(path):
        with _opened(path, decode_times=decode_times) as dataset:
            yield dataset
    elif download or not _is_hdf5(path):
        # Workers read most of a file, so one download beats many range requests, and the same
        # engine as for local files reads the same bytes into the same values. Classic NetCDF
        # (CDF) files can only be read from a local file.
        with _local_copy(path) as local, _opened(local, decode_times=decode_times) as dataset:
            yield dataset
    else:
        # Planning reads only metadata and coordinates: HDF5 reads them with range requests.
        with (
            fsspec.open(path, "rb", cache_type="blockcache", block_size=2**20) as stream,
            _opened(stream, engine="h5netcdf", decode_times=decode_times) as dataset,
        ):
            yield dataset


@contextlib.contextmanager
def open_netcdf(path: str, decode_times: bool = True, download: bool = False) -> Iterator[xr.Dataset]:
    """Open one NetCDF file lazily (nothing is read until a variable's values are asked for).

    Local paths open in place. Remote files (gs://, any fsspec URL) are downloaded to a local
    temp file if ``download`` or if they are classic NetCDF; NetCDF-4 metadata is read remotely.
    """
    with contextlib.ExitStack() as stack:
        try:
            dataset = stack.enter_context(_open_any(path, decode_times, download))
        except FileNotFoundError:
            raise UserError(f"{path}: file not found (was it moved or deleted during the build?)") from None
        except Exception as error:  # netCDF4, h5netcdf and scipy each raise their own types
            reason = str(error).splitlines()[0] if str(error) else type(error).__name__
            if "did not find a match in any of xarray's currently installed IO backends" in reason:
                reason = "not a NetCDF file"
            raise UserError(
                f"{path}: cannot be read as NetCDF ({reason[:200]}); fix or remove the file, or narrow the input glob"
            ) from None
        yield dataset


@dataclasses.dataclass(frozen=True)
class SourceFile:
    """One input file, its size when planned, and the range [start, stop) it covers along the concat dim."""

    path: str
    start: int
    stop: int
    nbytes: int
