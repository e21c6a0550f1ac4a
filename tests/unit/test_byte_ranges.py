"""Byte ranges merged into few requests: every range asked for inside one, never more than 1.25x the bytes."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from planning.formats.byte_ranges import MAX_JOINED_BYTES, box_runs, merge_ranges


def _asked_bytes(starts: np.ndarray, stops: np.ndarray) -> int:
    """Bytes of the union of the ranges (sorted by start)."""
    total, reach = 0, -1
    for start, stop in zip(starts.tolist(), stops.tolist()):
        total += max(stop - max(start, reach), 0)
        reach = max(reach, stop)
    return total


def _check(starts: np.ndarray, stops: np.ndarray) -> list[tuple[int, int, int, int]]:
    merged = merge_ranges(starts, stops)
    # The merged ranges partition the asked ones, in order, and hold each of them whole.
    assert [a for _, _, a, _ in merged] == [0, *(b for _, _, _, b in merged[:-1])]
    assert merged[-1][3] == len(starts)
    for start, stop, a, b in merged:
        assert start == starts[a] and stop == stops[a:b].max()
    fetched = sum(stop - start for start, stop, _, _ in merged)
    assert 4 * fetched <= 5 * _asked_bytes(starts, stops)
    return merged


@given(st.lists(st.tuples(st.integers(0, 10_000), st.integers(1, 3_000)), min_size=1, max_size=60))
def test_any_ranges_merge_within_a_quarter_more_bytes(pairs):
    pairs.sort()
    starts = np.array([s for s, _ in pairs], dtype=np.int64)
    _check(starts, starts + np.array([n for _, n in pairs], dtype=np.int64))


def test_the_planes_of_a_box_a_row_apart_are_one_request():
    # A unit of an ERA5-like contiguous variable (time, level, lat, lon) cut to whole 9x9 patches:
    # 63 of 64 rows and 126 of 128 columns, so the rows of a plane and the planes are a few bytes apart.
    starts, length = box_runs(1000, (4, 27, 64, 128), 4, [(0, 2), (0, 27), (0, 63), (0, 126)])
    assert len(starts) == 2 * 27 * 63
    (only,) = _check(starts, starts + length)
    # What it fetches beyond the box: the rows' last two columns and a plane's last row (1/64 each).
    assert only[1] - only[0] < 1.04 * len(starts) * length


def test_joins_stop_at_the_joined_size_so_a_large_read_stays_parallel():
    mib = 1024 * 1024
    # 1 MiB runs 260 KiB apart (more than a quarter of a run: not bridged run by run); six of them joined hold
    # gaps of a fifth of their bytes, a seventh would pass MAX_JOINED_BYTES (8 MiB).
    starts = np.arange(24, dtype=np.int64) * (mib + 260 * 1024)
    merged = _check(starts, starts + mib)
    assert [b - a for _, _, a, b in merged] == [6, 6, 6, 6]
    assert all(stop - start <= MAX_JOINED_BYTES for start, stop, _, _ in merged)


def test_points_far_apart_stay_apart():
    starts = np.arange(100, dtype=np.int64) * 1_000_000  # a time series at one grid point
    assert len(_check(starts, starts + 4)) == 100
