"""Reading a box of remote NetCDF-4 (HDF5) variables: the slab's bytes prefetched, then h5netcdf and xarray decode.

h5py reads a hyperslab of a contiguous dataset one row piece at a time, and chunks one after
another: each would be a request of its own. So the byte ranges the box needs (the runs of
a contiguous dataset, the chunks a chunked one stores for the box) are located first from the
file's metadata, fetched concurrently, and served to h5py from memory. The values are then
read exactly as ``xr.open_dataset(..., engine="h5netcdf")`` reads them.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator, Sequence

import h5py
import numpy as np
import xarray as xr

from planning.byte_ranges import Box, box_runs, merge_ranges
from planning.features import VariablePlan
from planning.remote_files import BlockReader, RemoteFile
from planning.sources import NETCDF_LOCK, open_locked
from schemas.errors import UserError


def _chunk_ranges(dataset: h5py.Dataset, box: Box) -> list[tuple[int, int]]:
    chunks = dataset.chunks
    corners = itertools.product(*[range(a - a % c, b, c) for (a, b), c in zip(box, chunks)])
    ranges = []
    for corner in corners:
        info = dataset.id.get_chunk_info_by_coord(corner)
        if info.byte_offset is not None:  # else never written: read as fill values
            ranges.append((info.byte_offset, info.byte_offset + info.size))
    return ranges


def dataset_ranges(dataset: h5py.Dataset, box: Box) -> list[tuple[int, int]]:
    """Byte ranges of the file that hold ``dataset`` over ``box``."""
    if any(stop <= start for start, stop in box):
        return []
    if dataset.chunks is not None:
        return _chunk_ranges(dataset, box)
    offset = dataset.id.get_offset()
    if offset is None:  # compact (stored in the metadata), or never written
        return []
    starts, length = box_runs(offset, dataset.shape, dataset.dtype.itemsize, box)
    return list(zip(starts.tolist(), (starts + length).tolist()))


def _slab_ranges(reader: BlockReader, variables: Sequence[VariablePlan], box: dict[str, tuple[int, int]]):
    with NETCDF_LOCK, h5py.File(reader, "r") as file:
        ranges = []
        for variable in variables:
            dataset = file.get(variable.name)
            if isinstance(dataset, h5py.Dataset) and dataset.ndim == len(variable.dims):
                ranges.extend(dataset_ranges(dataset, [box[d] for d in variable.dims]))
    ranges.sort()
    merged = merge_ranges(np.array([a for a, _ in ranges]), np.array([b for _, b in ranges]))
    return [(start, stop) for start, stop, _, _ in merged]


def _cannot_read(path: str, error: Exception) -> UserError:
    reason = str(error).splitlines()[0] if str(error) else type(error).__name__
    return UserError(f"{path}: cannot be read as NetCDF ({reason[:200]}); fix or remove the file")


@contextlib.contextmanager
def open_prefetched(
    remote: RemoteFile, variables: Sequence[VariablePlan], box: dict[str, tuple[int, int]]
) -> Iterator[xr.Dataset]:
    """The file opened through h5netcdf, with what ``variables`` hold over ``box`` already fetched."""
    reader = BlockReader(remote)
    try:
        ranges = _slab_ranges(reader, variables, box)
    except OSError as error:  # h5py: not an HDF5 file, or a damaged one
        raise _cannot_read(remote.path, error) from None
    reader.prefetch(ranges)  # outside the lock: other units' reads go on meanwhile
    with contextlib.ExitStack() as stack:
        try:
            dataset = stack.enter_context(open_locked(reader, engine="h5netcdf", decode_times=False))
        except Exception as error:  # h5netcdf and h5py raise their own types
            raise _cannot_read(remote.path, error) from None
        yield dataset
