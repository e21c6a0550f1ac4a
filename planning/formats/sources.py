"""The input NetCDF files: listing them, checking them, and opening them (locally or through fsspec)."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import glob
import logging
import os
import stat
import threading
import warnings
from collections.abc import Iterator, Mapping, Sequence

import fsspec
import xarray as xr

from planning.formats.netcdf3 import expected_size
from schemas.errors import UserError
from schemas.urls import is_remote, special_kind

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class ListedFile:
    """A file as its listing shows it; ``version`` changes whenever its content may have (see _version)."""

    path: str
    nbytes: int
    version: str


#: What tells a remote object's content apart besides its size: GCS's generation (new on every write) and
#: checksums (crc32c; md5Hash, absent for composite objects), S3's ETag.
_CONTENT_KEYS = ("generation", "crc32c", "md5Hash", "ETag", "etag")
#: Otherwise, the first of these times a store lists.
_TIME_KEYS = ("mtime", "updated", "LastModified", "created")


def _version(info: dict) -> str:
    if "local_version" in info:
        return info["local_version"]
    found = [f"{key}={info[key]}" for key in _CONTENT_KEYS if info.get(key)]
    if found:
        return ";".join(found)
    return next((_time(info[key]) for key in _TIME_KEYS if info.get(key) is not None), "")


def _time(value) -> str:
    """A listed time as one text whatever its type: stores give the same time as a datetime in one call (info) and
    as seconds in another (a listing's details: fsspec's memory filesystem)."""
    if isinstance(value, datetime.datetime):
        value = value.timestamp()
    return repr(float(value)) if isinstance(value, int | float) else str(value)


def _local_version(status: os.stat_result) -> str:
    """A local file's identity besides its size: the modification time can be copied (touch -r, cp -p,
    rsync -t) or too coarse to tell two writes apart; the inode and the change time are the file's own
    (a copy, or a file written under a temporary name and renamed over it, gets another)."""
    return f"mtime_ns={status.st_mtime_ns};ino={status.st_ino};ctime_ns={status.st_ctime_ns}"


def _refuse_special(path: str, mode: int) -> None:
    """Refuse a FIFO, socket or device among the inputs, from its stat alone: opening a FIFO blocks forever."""
    kind = special_kind(mode)
    if kind is None:
        return
    raise UserError(
        f"input: {path} is not a regular file ({kind}); remove it from input.paths or narrow the glob to the data files"
    )


def _local_listing(pattern: str) -> dict[str, dict]:
    """What fsspec's local listing gives (absolute path: size, type; and the file's version), at a tenth of its cost."""
    infos = {}
    pattern = pattern.removeprefix("file://")  # a file:// URL names a local path
    for path in glob.glob(os.path.abspath(pattern), recursive=True):
        with contextlib.suppress(FileNotFoundError):
            status = os.stat(path)
            _refuse_special(path, status.st_mode)
            kind = "directory" if stat.S_ISDIR(status.st_mode) else "file"
            infos[path] = {"size": status.st_size, "type": kind, "local_version": _local_version(status)}
    return infos


def _listing(pattern: str) -> tuple[fsspec.AbstractFileSystem | None, dict[str, dict]]:
    if not is_remote(pattern):
        return None, _local_listing(pattern)
    fs, path = fsspec.core.url_to_fs(pattern)
    # One listing with every match's details: an info call a file, even answered from the listing's cache, costs
    # the launcher ~0.2 ms each (0.5 s of 2,100 files' planning, none of it shared with the probes' pool).
    if any(character in path for character in "*?["):  # a glob, as fsspec tells them
        return fs, fs.glob(path, detail=True)
    try:
        return fs, {path: fs.info(path)}  # a file, or a folder: named as such in the error
    except FileNotFoundError:
        return fs, {}


def list_files(patterns: Sequence[str]) -> list[ListedFile]:
    """Every file the globs match, each once, sorted, with its size and version; an error names a pattern
    that matches none. Sizes come from the listing (gcsfs caches it), not from a request per file."""
    found: dict[str, ListedFile] = {}
    for pattern in patterns:
        fs, infos = _listing(pattern)
        if not infos:
            raise UserError(f"input: {pattern!r} matches no file; check the path or glob (quote it in the shell)")
        files = {path: info for path, info in infos.items() if info.get("type") != "directory"}
        if not files:
            raise UserError(f"input: {pattern!r} matches only directories; add a file glob such as '/*.nc'")
        for path, info in files.items():
            name = path if fs is None else fs.unstrip_protocol(path)
            found[name] = ListedFile(name, int(info["size"]), _version(info))
    return [found[name] for name in sorted(found)]


HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"


def is_hdf5(path: str) -> bool:
    """Whether a local file starts as an HDF5 file (NetCDF-4) does."""
    with open(path, "rb") as stream:
        return stream.read(len(HDF5_SIGNATURE)) == HDF5_SIGNATURE


def size_and_version(path: str) -> tuple[int, str]:
    """A file's size and version now, as list_files reports them."""
    if not is_remote(path):
        status = os.stat(path)
        return status.st_size, _local_version(status)
    fs, _, (resolved,) = fsspec.get_fs_token_paths(path)
    info = fs.info(resolved)
    return int(info["size"]), _version(info)


def check_not_truncated(path: str) -> int:
    """A local file's size, after checking a classic NetCDF file holds all the bytes its header declares.

    (Remote classic files are checked from the header planning reads anyway: planning.inputs.metadata.)
    """
    size = os.path.getsize(path)
    with open(path, "rb") as stream:
        try:
            expected = expected_size(stream)
        except (EOFError, ValueError) as error:
            raise UserError(f"{path}: corrupt NetCDF header ({error}); fix or remove the file") from None
    refuse_truncated(path, size, expected)
    return size


def refuse_truncated(path: str, size: int, expected: int | None) -> None:
    """Refuse a classic file shorter than its header says it is."""
    if expected is not None and size < expected:
        raise UserError(
            f"{path}: truncated: {size} bytes but its header needs {expected} "
            "(the netCDF library would read the missing part as zeros); copy the file again"
        )


#: The netCDF and HDF5 C libraries are not thread-safe (concurrent opens crash the process), and
#: Beam's multi_threading mode runs several units at once: one file is open at a time per process.
#: Reentrant: a worker holds it across a run of small local files (planning.reads.slabs).
NETCDF_LOCK = threading.RLock()


#: What NetCDF files start with: classic (CDF-1, CDF-2, CDF-5) and NetCDF-4 (HDF5's signature).
_NETCDF_MAGIC = (b"CDF\x01", b"CDF\x02", b"CDF\x05", b"\x89HDF\r\n\x1a\n")


def netcdf_engine(target) -> str | None:
    """ "netcdf4" for a local file that starts as a NetCDF file does (netCDF4 reads classic and NetCDF-4 alike);
    None for anything else (a GRIB file, a store, a file object), which xarray's own guess then names.

    Left to guess, xarray imports every installed package's backend first (kerchunk's imports zarr and numcodecs,
    cfgrib's ecCodes), at every open of every build.
    """
    if not isinstance(target, (str, os.PathLike)) or is_remote(str(target)):
        return None
    try:
        with open(target, "rb") as stream:
            start = stream.read(8)
    except OSError:
        return None
    return "netcdf4" if start.startswith(_NETCDF_MAGIC) else None


def _with_engine(target, kwargs: dict) -> dict:
    if "engine" in kwargs:
        return kwargs
    engine = netcdf_engine(target)
    return kwargs if engine is None else {**kwargs, "engine": engine}


@contextlib.contextmanager
def open_locked(target, **kwargs) -> Iterator[xr.Dataset]:
    """``xr.open_dataset`` of a path or file object, holding the process's NetCDF lock until closed."""
    with NETCDF_LOCK, warnings.catch_warnings():
        # Packed files often carry a NaN _FillValue on integer data, which xarray rightly drops
        # (NaN cannot be an integer fill); its warning says nothing the user can act on.
        warnings.simplefilter("ignore", xr.SerializationWarning)
        # No pandas indexes: we index by position, and building them is a quarter of an open.
        dataset = xr.open_dataset(target, cache=False, create_default_indexes=False, **_with_engine(target, kwargs))
        try:
            yield dataset
        finally:
            dataset.close()


@contextlib.contextmanager
def _open_any(path: str, decode_times: bool) -> Iterator[xr.Dataset]:
    if not is_remote(path):
        with open_locked(path, decode_times=decode_times) as dataset:
            yield dataset
    else:
        # Planning reads only metadata and coordinates: HDF5 reads them with range requests.
        # (Remote classic files are read from their header instead: planning.inputs.metadata.)
        with (
            fsspec.open(path, "rb", cache_type="blockcache", block_size=2**20) as stream,
            open_locked(stream, engine="h5netcdf", decode_times=decode_times) as dataset,
        ):
            yield dataset


@contextlib.contextmanager
def open_netcdf(path: str, decode_times: bool = True) -> Iterator[xr.Dataset]:
    """Open one NetCDF file lazily (nothing is read until a variable's values are asked for).

    Local paths open in place; remote NetCDF-4 files (gs://, any fsspec URL) through h5netcdf with
    range requests. (Remote classic files are never opened this way: planning.inputs.metadata reads their
    header, planning.reads.slabs their byte ranges.)
    """
    with contextlib.ExitStack() as stack:
        try:
            dataset = stack.enter_context(_open_any(path, decode_times))
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
    version: str = ""  # its version when listed (planning.formats.sources._version; "" when the filesystem gives none)
    member: int = 0  # its index along input.new_dim (its member's range along the concat dim is its own)
    #: variables a worker may read by offset (planning.reads.direct_reads): name -> (byte offset, stored shape, check)
    layouts: Mapping[str, tuple[int, tuple[int, ...], int]] | None = None
    classic: bool | None = None  # its format, as its probe found it: classic NetCDF, or not (None: not known)
    group: int = 0  # its group of variables, where variables come from separate files (planning.inputs.variable_groups)
