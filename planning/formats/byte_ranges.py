"""Where a box of an array lies in a file, and how to fetch those bytes in few requests.

A box of a C-ordered array is a set of equally long runs of bytes: one per index of the dims
before the last dim the box cuts, each spanning the dims from there on. A classic NetCDF
record variable repeats that pattern once per record, ``record_size`` bytes apart. Ranges
separated by small gaps are fetched as one (see merge_ranges): fewer requests, for at most a
quarter more bytes.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import numpy as np

Box = Sequence[tuple[int, int]]
#: Merged ranges are joined up to this size: each request then carries enough bytes that its own cost (a
#: round trip, a connection's share, an HTTP exchange's CPU) is small beside them, and a unit of tens of MB
#: still goes as several requests in flight.
MAX_JOINED_BYTES = 8 * 1024 * 1024


def box_runs(
    begin: int, shape: Sequence[int], itemsize: int, box: Box, record_size: int | None = None
) -> tuple[np.ndarray, int]:
    """Byte offsets of the runs ``box`` covers, in the box's C order, and their common length in bytes.

    ``begin``: offset of the array's first element; ``shape``: the array's shape, or with
    ``record_size``, the shape of one record's part, ``box`` then starting with the records.
    """
    inner_box = list(box[1:] if record_size is not None else box)
    if len(inner_box) != len(shape):
        raise ValueError(f"box {list(box)} does not match shape {tuple(shape)}")
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
    offsets = begin + offsets * itemsize
    if record_size is not None:
        first, last = box[0]
        offsets = np.add.outer(np.arange(first, last, dtype=np.int64) * record_size, offsets).ravel()
    return offsets, run * itemsize


def merge_ranges(starts: np.ndarray, stops: np.ndarray) -> list[tuple[int, int, int, int]]:
    """Ranges to fetch for byte ranges sorted by start: (start, stop, first range, end range) each.

    A gap is bridged when it is at most a quarter of the range before it; then neighbouring
    merged ranges are joined while the gaps inside stay within a quarter of the bytes asked for
    (a box's rows merge per plane first, then the planes, a skipped row apart, into one range).
    Either way the merged ranges hold at most 1.25 times the bytes asked for, and none is joined
    past MAX_JOINED_BYTES, so a large read still goes as several requests in flight.
    """
    if len(starts) == 0:
        return []
    starts, stops = np.asarray(starts, dtype=np.int64), np.asarray(stops, dtype=np.int64)
    gaps = starts[1:] - stops[:-1]
    cuts = np.flatnonzero(gaps > (stops[:-1] - starts[:-1]) // 4) + 1
    firsts, ends = np.concatenate(([0], cuts)), np.concatenate((cuts, [len(starts)]))
    # Per merged range: its span and the gap bytes inside it (overlapping ranges leave no gap).
    inner_gaps = np.concatenate(([0], np.cumsum(np.maximum(gaps, 0))))
    group_stops = np.maximum.reduceat(stops, firsts)
    group_gaps = inner_gaps[ends - 1] - inner_gaps[firsts]
    merged = []
    for a, b, stop, gap in zip(firsts.tolist(), ends.tolist(), group_stops.tolist(), group_gaps.tolist()):
        start = int(starts[a])
        if merged:
            first_start, last_stop, first, _, joined_gaps = merged[-1]
            between = max(start - last_stop, 0)
            all_gaps = joined_gaps + between + gap
            joined_stop = max(stop, last_stop)
            if 4 * all_gaps <= joined_stop - first_start - all_gaps and joined_stop - first_start <= MAX_JOINED_BYTES:
                merged[-1] = (first_start, joined_stop, first, b, all_gaps)
                continue
        merged.append((start, stop, a, b, gap))
    return [(start, stop, a, b) for start, stop, a, b, _ in merged]
