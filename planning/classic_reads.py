"""Reading a box of a classic NetCDF variable by byte ranges, decoded exactly as xarray decodes it.

A box of a C-ordered array is a set of equally long runs of bytes: one per index of the dims
before the last dim the box cuts, each spanning the dims from there on. Record variables repeat
that pattern once per record, ``record_size`` bytes apart. Runs separated by a gap of at most a
quarter of a run are fetched as one range: fewer requests, for at most a quarter more bytes.
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Callable, Sequence

import numpy as np
import xarray as xr

from planning.netcdf3 import ClassicVariable

Box = Sequence[tuple[int, int]]
#: Fetches byte ranges [start, stop) of the file, in order.
Fetch = Callable[[list[tuple[int, int]]], list[bytes]]


def box_runs(variable: ClassicVariable, record_size: int, box: Box) -> tuple[np.ndarray, int]:
    """Byte offsets of the runs ``box`` covers, in the box's C order, and their common length in bytes."""
    if len(box) != len(variable.dims):
        raise ValueError(f"{variable.name}: box {list(box)} does not match dims {variable.dims}")
    inner_box = list(box[1:] if variable.is_record else box)
    shape = variable.inner_shape
    if any(stop <= start for start, stop in box):
        return np.zeros(0, dtype=np.int64), 0
    # Dims from `whole` on are covered entirely: each run spans them.
    whole = len(shape)
    while whole > 0 and tuple(inner_box[whole - 1]) == (0, shape[whole - 1]):
        whole -= 1
    strides = [math.prod(shape[i + 1 :]) for i in range(len(shape))]
    if whole == 0:
        run = math.prod(shape)
        offsets = np.zeros(1, dtype=np.int64)
    else:
        cut = whole - 1
        start, stop = inner_box[cut]
        run = (stop - start) * strides[cut]
        steps = [np.arange(a, b, dtype=np.int64) * strides[i] for i, (a, b) in enumerate(inner_box[:cut])]
        offsets = (functools.reduce(np.add.outer, steps, np.zeros((), dtype=np.int64)) + start * strides[cut]).ravel()
    item = variable.dtype.itemsize
    offsets = variable.begin + offsets * item
    if variable.is_record:
        first, last = box[0]
        records = np.arange(first, last, dtype=np.int64) * record_size
        offsets = np.add.outer(records, offsets).ravel()
    return offsets, run * item


def coalesce(starts: np.ndarray, length: int) -> list[tuple[int, int, int, int]]:
    """Ranges to fetch for runs at ascending ``starts``: (byte start, byte stop, first run, end run).

    A gap is bridged when it is at most a quarter of a run, so the ranges hold at most 1.25
    times the runs' bytes.
    """
    if len(starts) == 0:
        return []
    gaps = starts[1:] - (starts[:-1] + length)
    cuts = (np.flatnonzero(gaps > length // 4) + 1).tolist()
    firsts, ends = [0, *cuts], [*cuts, len(starts)]
    return [(int(starts[a]), int(starts[b - 1]) + length, a, b) for a, b in zip(firsts, ends)]


def read_raw(fetch: Fetch, variable: ClassicVariable, record_size: int, box: Box) -> np.ndarray:
    """The stored values over ``box``, undecoded, in native byte order (what the netCDF library returns)."""
    starts, length = box_runs(variable, record_size, box)
    shape = tuple(stop - start for start, stop in box)
    out = np.empty(math.prod(shape) * variable.dtype.itemsize, dtype=np.uint8)
    ranges = coalesce(starts, length)
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


def decode(variable: ClassicVariable, raw: np.ndarray) -> np.ndarray:
    """CF decoding (fill and missing values, scale and offset, _Unsigned) by xarray's own rules."""
    encoded = xr.Variable(variable.dims, raw, dict(variable.attrs))
    with warnings.catch_warnings():
        # As on opening: a NaN _FillValue on integer data is dropped, with a warning nobody can act on.
        warnings.simplefilter("ignore", xr.SerializationWarning)
        return np.asarray(xr.conventions.decode_cf_variable(variable.name, encoded, decode_times=False).values)


def read_box(fetch: Fetch, variable: ClassicVariable, record_size: int, box: Box) -> np.ndarray:
    """The decoded values of ``variable`` over ``box`` ((start, stop) per dim of the variable)."""
    return decode(variable, read_raw(fetch, variable, record_size, box))
