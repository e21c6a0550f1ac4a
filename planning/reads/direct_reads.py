"""Reading local NetCDF-4 variables straight from their bytes, where the probe found them plainly stored.

Opening a file and each dataset through HDF5 costs about 0.2 ms a small file, most of a build
over thousands of them, while the values of a contiguous dataset are one run of bytes at an
offset. The probe records that offset (planning.inputs.local_probe) for datasets whose bytes are their
values as xarray decodes them: contiguous, plain numbers in this machine's byte order, no
attribute that decoding would apply (NaN fill values aside). Planning keeps an offset only where
the file's shape and dtype for the variable are the plan's; a worker reads by offset whole rows along
the concat dim (the first dim) for a box holding three quarters of them or more, after checking that the file's
size and version are those planned, and that a few of the variable's bytes hash with its name
and offset to the check its probe recorded (planning.formats.hdf5_layout.layout_check): neither a file
replaced under the same size and times nor an edited probe cache makes it read another
variable's bytes. Everything else goes through HDF5 as before.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping, Sequence

import numpy as np

from planning.formats.hdf5_layout import check_window, layout_check
from planning.formats.sources import SourceFile
from planning.inputs.probe import FileProbe
from planning.run.variables import VariablePlan
from schemas.errors import UserError
from schemas.urls import is_remote


@dataclasses.dataclass(frozen=True)
class DirectReads:
    """Per variable read by offset: its stored shape with the concat dim first (its length there is 0:
    each file's own), and per file the variable's byte offset (-1: read it through HDF5) and its
    layout's check (planning.formats.hdf5_layout.layout_check)."""

    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    offsets: np.ndarray  # int64, files x names
    checks: np.ndarray  # int64, files x names


def plan_direct_reads(
    files: Sequence[SourceFile],
    probes: Mapping[str, FileProbe],
    variables: Sequence[VariablePlan],
    sizes: Mapping[str, int],
    concat_dim: str,
    member_dim: str | None = None,
) -> DirectReads | None:
    """The offsets workers may read ``variables`` at in ``files`` (None: none); ``probes`` by path,
    ``sizes``: the unselected dataset's dim sizes; ``member_dim``: input.new_dim, not a dim of the files."""
    chosen = []
    for variable in variables:
        dims = tuple(d for d in variable.dims if d != member_dim)
        if variable.static_path is None and dims[:1] == (concat_dim,):
            chosen.append((variable.name, (0, *(sizes[d] for d in dims[1:])), np.dtype(variable.dtype).str))
    if not chosen:
        return None
    offsets = np.full((len(files), len(chosen)), -1, dtype=np.int64)
    checks = np.zeros_like(offsets)
    for row, source in enumerate(files):
        probe = probes.get(source.path)
        layouts = None if probe is None else probe.layouts
        if not layouts or is_remote(source.path):
            continue
        for column, (name, shape, dtype) in enumerate(chosen):
            layout = layouts.get(name)
            if layout is None:
                continue
            offset, stored_shape, stored_dtype, check = layout
            if tuple(stored_shape) == (source.stop - source.start, *shape[1:]) and stored_dtype == dtype:
                offsets[row, column], checks[row, column] = offset, check
    if (offsets < 0).all():
        return None
    return DirectReads(tuple(n for n, _, _ in chosen), tuple(s for _, s, _ in chosen), offsets, checks)


def read_direct(
    source: SourceFile, variables: Sequence[VariablePlan], box: Mapping[str, tuple[int, int]], concat_dim: str
) -> dict[str, np.ndarray] | None:
    """Each variable's values over ``box`` (ranges within the file), read by offset; None where one cannot be
    (no offset planned, a box holding under three quarters of its rows' bytes): HDF5 reads the file instead.

    The rows along the concat dim are read whole and the box taken from them (a view): a box that leaves a
    margin of the other dims (9x9 patches leave the last row and columns of a 64x128 grid) costs a few more
    bytes read, where HDF5 would take its lock, one reader at a time.
    """
    layouts = source.layouts
    if not layouts:
        return None
    wanted = []
    for variable in variables:
        layout = layouts.get(variable.name)
        if layout is None or variable.dims[:1] != (concat_dim,):
            return None
        offset, shape, check = layout
        inner = [box[d] for d in variable.dims[1:]]
        if any(stop > n for (_, stop), n in zip(inner, shape[1:])):
            return None  # beyond what was probed: HDF5 names what the file holds
        if 4 * math.prod(stop - start for start, stop in inner) < 3 * math.prod(shape[1:]):
            return None  # the rows would hold more than a third again of the box: the unit budget would not
        wanted.append((variable, offset, shape, check))
    begin, end = box[concat_dim]
    out = {}
    with open(source.path, "rb", buffering=0) as stream:
        for variable, offset, shape, check in wanted:
            values = np.empty((end - begin, *shape[1:]), np.dtype(variable.dtype))
            row = math.prod(shape[1:]) * values.itemsize
            start = offset + begin * row
            stream.seek(start)
            # Into the array itself: one copy from the page cache, and the values stay writable. A
            # read returns at most about 2 GB on Linux: read on until the array is full.
            view, filled = memoryview(values.reshape(-1)).cast("B"), 0
            while filled < len(view):
                read = stream.readinto(view[filled:])
                if not read:
                    raise UserError(
                        f"{source.path}: reading {variable.name!r} met the end of the file; the file may be truncated"
                    )
                filled += read
            window, length = check_window(offset, shape[0] * row)
            if start <= window and window + length <= start + len(view):  # read already: most units read whole files
                seen = bytes(view[window - start : window - start + length])
            else:
                seen = os.pread(stream.fileno(), length, window)
            if layout_check(variable.name, offset, seen) != check:
                raise UserError(
                    f"{source.path}: the bytes at the offset planned for {variable.name!r} are not those probed (the "
                    "file was replaced keeping its size and times, or the output's _inventory.json was edited); "
                    "delete _inventory.json from the output directory and run the build again"
                )
            inner = tuple(slice(*box[d]) for d in variable.dims[1:])
            out[variable.name] = values[(slice(None), *inner)]  # the whole rows when the box spans them
    return out
