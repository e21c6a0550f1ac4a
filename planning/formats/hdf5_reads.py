"""Reading a box of NetCDF-4 (HDF5) variables through h5py, decoded by xarray's CF rules.

Local files are read in place. For remote files: h5py reads a hyperslab of a contiguous
dataset one row piece at a time, and chunks one after another: each would be a request of its
own. So the byte ranges the box needs (the runs of a contiguous dataset, the chunks a chunked
one stores for the box) are located first from the file's metadata, fetched concurrently, and
served to h5py from memory.

The stored values and their decoding attributes are read straight from h5py and decoded by
``xr.conventions.decode_cf_variable``, which is what ``xr.open_dataset`` does after its own,
much slower, open (4.6 ms against 0.4 ms for a small file: most of a build over thousands of
files). Anything unusual (groups, non-numeric types, filters h5py lacks) is left to xarray.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence

import h5py
import numpy as np
import xarray as xr

from planning.formats.byte_ranges import Box, box_runs, merge_ranges
from planning.formats.cf_decoding import decode_values
from planning.formats.hdf5_chunks import UNIT_CHUNKS, cached, chunk_corners, chunk_shape, read_chunked
from planning.formats.remote_files import BlockReader, RemoteFile
from planning.formats.sources import NETCDF_LOCK, open_locked
from planning.run.variables import VariablePlan
from schemas.errors import UserError
from schemas.urls import is_remote


def _chunk_ranges(dataset: h5py.Dataset, box: Box, path: str = "", name: str = "") -> list[tuple[int, int]]:
    ranges = []
    for corner in chunk_corners(box, dataset.chunks):
        if cached(path, name, corner):
            continue  # decoded already by another piece of the unit's box
        info = dataset.id.get_chunk_info_by_coord(corner)
        if info.byte_offset is not None:  # else never written: read as fill values
            ranges.append((info.byte_offset, info.byte_offset + info.size))
    return ranges


def dataset_ranges(dataset: h5py.Dataset, box: Box, path: str = "", name: str = "") -> list[tuple[int, int]]:
    """Byte ranges of the file that hold ``dataset`` over ``box`` (of the file at ``path``, its variable ``name``:
    chunks the unit decoded already left out)."""
    if any(stop <= start for start, stop in box):
        return []
    if dataset.chunks is not None:
        return _chunk_ranges(dataset, box, path, name)
    offset = dataset.id.get_offset()
    if offset is None:  # compact (stored in the metadata), or never written
        return []
    starts, length = box_runs(offset, dataset.shape, dataset.dtype.itemsize, box)
    return list(zip(starts.tolist(), (starts + length).tolist()))


def _slab_ranges(reader: BlockReader, path: str, variables: Sequence[VariablePlan], box: dict[str, tuple[int, int]]):
    with NETCDF_LOCK, h5py.File(reader, "r") as file:
        ranges = []
        for variable in variables:
            dataset = file.get(variable.name)
            if isinstance(dataset, h5py.Dataset) and dataset.ndim == len(variable.dims):
                ranges.extend(dataset_ranges(dataset, [box[d] for d in variable.dims], path, variable.name))
    ranges.sort()
    merged = merge_ranges(np.array([a for a, _ in ranges]), np.array([b for _, b in ranges]))
    return [(start, stop) for start, stop, _, _ in merged]


#: The attributes xarray's CF decoding reads (times are not decoded on workers).
_DECODING_ATTRS = frozenset((b"_FillValue", b"missing_value", b"scale_factor", b"add_offset", b"_Unsigned", b"dtype"))


#: HDF5 memory types by numpy dtype: h5py builds one for every read it is not given (most of a small
#: attribute's read, which probing thousands of files does several times a file).
_MEMORY_TYPES: dict[np.dtype, h5py.h5t.TypeID] = {}


def _memory_type(dtype: np.dtype) -> h5py.h5t.TypeID:
    mtype = _MEMORY_TYPES.get(dtype)
    if mtype is None:
        mtype = _MEMORY_TYPES[dtype] = h5py.h5t.py_create(dtype)
    return mtype


def read_attribute(dataset: h5py.h5d.DatasetID, name: bytes):
    """An attribute as the netCDF library returns it: text as str, a single value as a numpy scalar."""
    attr = h5py.h5a.open(dataset, name)
    dtype = attr.dtype
    if dtype.kind in "fiubS":  # numbers, and text as netCDF writes it (fixed length)
        value = np.empty(attr.shape, dtype)
        attr.read(value, _memory_type(dtype))
    else:  # variable-length text: the high-level API knows its encodings
        value = h5py.Dataset(dataset).attrs[name.decode()]
    if isinstance(value, np.ndarray) and value.size == 1:
        value = value.reshape(())[()]
    if isinstance(value, bytes):
        value = value.decode("utf-8", errors="replace")
    return value


def decoding_attributes(dataset: h5py.h5d.DatasetID) -> dict:
    """The attributes of a dataset that its CF decoding reads (one listing: cheaper than asking for each)."""
    names: list[bytes] = []
    h5py.h5a.iterate(dataset, names.append)
    return {name.decode(): read_attribute(dataset, name) for name in names if name in _DECODING_ATTRS}


def _read_stored(
    dataset: h5py.h5d.DatasetID, dtype: np.dtype, ranges: list[tuple[int, int]], stored_shape: tuple[int, ...]
) -> np.ndarray:
    """The stored values over ``ranges`` of a dataset of ``stored_shape``, as h5py's ``dataset[slices]`` reads
    them, without its per-call cost."""
    shape = tuple(stop - start for start, stop in ranges)
    out = np.empty(shape, dtype)
    if out.size == 0:
        return out
    if shape == stored_shape:  # the whole dataset (ranges lie inside it): no selection to make
        dataset.read(h5py.h5s.ALL, h5py.h5s.ALL, out)
        return out
    space = dataset.get_space()
    space.select_hyperslab(tuple(start for start, _ in ranges), shape)
    dataset.read(h5py.h5s.create_simple(shape), space, out)
    return out


def _copied_from(
    reader: BlockReader, dataset: h5py.h5d.DatasetID, dtype: np.dtype, ranges: list[tuple[int, int]], shape
) -> np.ndarray | None:
    """The stored values over ``ranges`` of a contiguous dataset, copied in strided steps from the bytes
    prefetched for them; None if the dataset is not stored contiguously in the file or a row of the box was not
    prefetched whole (h5py reads it then).

    What this saves: h5py reads a hyperslab of a file object one row piece at a time, a call back into
    Python each (tens of thousands a unit: the largest part of a remote unit's read).
    """
    plist = dataset.get_create_plist()
    if plist.get_layout() != h5py.h5d.CONTIGUOUS or plist.get_external_count():
        return None
    offset = dataset.get_offset()
    if offset is None or any(stop <= start for start, stop in ranges):
        return None
    strides = tuple(dtype.itemsize * math.prod(shape[i + 1 :]) for i in range(len(shape)))
    first = offset + sum(start * stride for (start, _), stride in zip(ranges, strides))
    out = np.empty(tuple(stop - start for start, stop in ranges), dtype)
    return out if _copy_box(reader, out, first, strides) else None


def _copy_box(reader: BlockReader, out: np.ndarray, first: int, strides: tuple[int, ...]) -> bool:
    """Copy into ``out`` the box whose first element is at byte ``first`` of the file, from one prefetched range,
    else slice by slice of its first dim (the prefetched ranges end between planes or rows); False if a row is
    not prefetched whole."""
    last = first + sum((n - 1) * stride for n, stride in zip(out.shape, strides)) + out.itemsize
    span = reader.prefetched_view(first, last)
    if span is not None:
        out[...] = np.ndarray(out.shape, out.dtype, buffer=span, strides=strides)
        return True
    if out.ndim <= 1:
        return False
    return all(_copy_box(reader, out[i], first + i * strides[0], strides[1:]) for i in range(out.shape[0]))


def read_box(
    target, variables: Sequence[VariablePlan], box: dict[str, tuple[int, int]], path: str | None = None
) -> dict[str, np.ndarray] | None:
    """The decoded values of ``variables`` over ``box`` in an HDF5 file (a path, or a file object over ``path``).

    Within a unit's ledger (planning.formats.hdf5_chunks), chunked variables are read a chunk at a
    time, each chunk once.

    None where xarray must read the file instead: not HDF5 (or damaged: xarray names the
    problem), a variable missing or not a plain numeric array, a filter h5py cannot decode.
    The low-level API: the high-level one costs three times as much on a small file.
    """
    with NETCDF_LOCK, contextlib.ExitStack() as stack:
        try:
            if isinstance(target, str):
                file = h5py.h5f.open(target.encode(), h5py.h5f.ACC_RDONLY)
            else:
                file = stack.enter_context(h5py.File(target, "r")).id
        except OSError:
            return None
        try:
            where = target if isinstance(target, str) else path or ""
            prefetched = target if isinstance(target, BlockReader) else None
            stored = _read_stored_values(file, where, variables, box, prefetched)
        finally:
            file.close()
    if stored is None:
        return None
    # Decoded outside the lock: other units' reads go on meanwhile.
    return {name: decode_values(name, *parts) for name, parts in stored.items()}


def _read_stored_values(
    file: h5py.h5f.FileID,
    path: str,
    variables: Sequence[VariablePlan],
    box: dict[str, tuple[int, int]],
    prefetched: BlockReader | None = None,
):
    """Each variable's (dims, stored values over ``box``, decoding attributes); None: xarray must read the file.

    ``prefetched``: the remote file's reader, whose prefetched bytes a contiguous dataset's box is copied from.
    """
    stored = {}
    ledger = UNIT_CHUNKS.get()
    for variable in variables:
        try:
            dataset = h5py.h5d.open(file, variable.name.encode())  # (a group of that name: not a dataset, raises)
        except (KeyError, OSError):
            return None
        dtype, shape = dataset.dtype, dataset.shape
        if len(shape) != len(variable.dims) or dtype.kind not in "fiub" or dtype.byteorder == ">":
            return None
        ranges = [box.get(d, (0, n)) for d, n in zip(variable.dims, shape)]
        if any(stop > n for (_, stop), n in zip(ranges, shape)):
            return None  # smaller than planned: xarray's read shows what the file holds
        chunks = chunk_shape(dataset) if ledger is not None else None
        try:
            if chunks is None:
                raw = _copied_from(prefetched, dataset, dtype, ranges, shape) if prefetched is not None else None
                if raw is None:
                    raw = _read_stored(dataset, dtype, ranges, shape)
            else:
                raw = read_chunked(dataset, path, variable.name, variable.dims, dtype, ranges, chunks, ledger)
        except OSError:  # e.g. a compression filter this h5py lacks
            return None
        stored[variable.name] = (variable.dims, raw, decoding_attributes(dataset))
    return stored


def _cannot_read(path: str, error: Exception) -> UserError:
    reason = str(error).splitlines()[0] if str(error) else type(error).__name__
    return UserError(f"{path}: cannot be read as NetCDF ({reason[:200]}); fix or remove the file")


def prefetched(remote: RemoteFile, variables: Sequence[VariablePlan], box: dict[str, tuple[int, int]]) -> BlockReader:
    """A file object over ``remote`` with what ``variables`` hold over ``box`` already fetched."""
    reader = BlockReader(remote)
    try:
        ranges = _slab_ranges(reader, remote.path, variables, box)
    except OSError as error:  # h5py: not an HDF5 file, or a damaged one
        raise _cannot_read(remote.path, error) from None
    reader.prefetch(ranges)  # outside the lock: other units' reads go on meanwhile
    return reader


@contextlib.contextmanager
def open_with_xarray(target, path: str) -> Iterator[xr.Dataset]:
    """A NetCDF-4 file (a path or a file object) opened through xarray (h5netcdf), for what read_box leaves to it."""
    with contextlib.ExitStack() as stack:
        try:
            dataset = stack.enter_context(open_locked(target, engine="h5netcdf", decode_times=False))
        except Exception as error:  # h5netcdf and h5py raise their own types
            raise _cannot_read(path, error) from None
        yield dataset


def chunk_shapes(path: str, names: Sequence[str]) -> dict[str, tuple[int, ...]]:
    """The chunk shape of each of ``names`` stored chunked in a NetCDF-4 file, local or remote (its metadata
    fetched in blocks); contiguous ones, and what is not a dataset, left out; nothing where the file cannot be
    read through HDF5."""
    out = {}
    with NETCDF_LOCK, contextlib.ExitStack() as stack:
        try:
            if is_remote(path):
                file = stack.enter_context(h5py.File(BlockReader(RemoteFile(path)), "r")).id
            else:
                file = h5py.h5f.open(path.encode(), h5py.h5f.ACC_RDONLY)
                stack.callback(file.close)
        except (OSError, FileNotFoundError):
            return {}
        for name in names:
            try:
                dataset = h5py.h5d.open(file, name.encode())
            except (KeyError, OSError):
                continue
            chunks = chunk_shape(dataset)
            if chunks is not None:
                out[name] = chunks
    return out
