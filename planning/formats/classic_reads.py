"""Reading a box of a classic NetCDF variable by byte ranges, decoded exactly as xarray decodes it."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from planning.formats.byte_ranges import Box, box_runs, merge_ranges
from planning.formats.cf_decoding import decode_values
from planning.formats.netcdf3 import ClassicVariable

#: Fetches byte ranges [start, stop) of the file, in order.
Fetch = Callable[[list[tuple[int, int]]], list[bytes]]


def variable_runs(variable: ClassicVariable, record_size: int, box: Box) -> tuple[np.ndarray, int]:
    """Byte offsets and length of the runs of ``box`` ((start, stop) per dim of the variable)."""
    if len(box) != len(variable.dims):
        raise ValueError(f"{variable.name}: box {list(box)} does not match dims {variable.dims}")
    record = record_size if variable.is_record else None
    return box_runs(variable.begin, variable.inner_shape, variable.dtype.itemsize, box, record)


def read_raw(fetch: Fetch, variable: ClassicVariable, record_size: int, box: Box) -> np.ndarray:
    """The stored values over ``box``, undecoded, in native byte order (what the netCDF library returns)."""
    starts, length = variable_runs(variable, record_size, box)
    shape = tuple(stop - start for start, stop in box)
    out = np.empty(math.prod(shape) * variable.dtype.itemsize, dtype=np.uint8)
    ranges = merge_ranges(starts, starts + length)
    position = 0
    for (begin, end, first, last), data in zip(ranges, fetch([(b, e) for b, e, _, _ in ranges])):
        if len(data) != end - begin:
            raise EOFError(f"{variable.name}: read {len(data)} of {end - begin} bytes at offset {begin}")
        buffer = np.frombuffer(data, dtype=np.uint8)
        if (last - first) * length == end - begin:  # the runs abut: one copy
            out[position : position + len(buffer)] = buffer
            position += len(buffer)
            continue
        for offset in (starts[first:last] - begin).tolist():
            out[position : position + length] = buffer[offset : offset + length]
            position += length
    raw = out.view(variable.dtype).reshape(shape)
    if not raw.dtype.isnative:
        raw = raw.byteswap(inplace=True).view(raw.dtype.newbyteorder("="))
    return raw


def read_box(fetch: Fetch, variable: ClassicVariable, record_size: int, box: Box) -> np.ndarray:
    """The decoded values of ``variable`` over ``box`` ((start, stop) per dim of the variable)."""
    raw = read_raw(fetch, variable, record_size, box)
    return decode_values(variable.name, variable.dims, raw, variable.attrs)
