"""Reassembly's placing: each sample's cells inside a region (slices or index arrays), and scans' bucket files."""

from __future__ import annotations

import types

import numpy as np
import pytest

import transforms.reassemble as reassemble
from schemas.reassembly import _cells_inside


@pytest.mark.parametrize(
    "local",
    [np.arange(5), np.array([0]), np.array([0, 2, 4]), np.array([-1, 0, 2]), np.array([3, 1])],
    ids=["window", "one", "every-other", "uneven", "descending"],
)
def test_cells_inside_a_region_are_those_a_cell_by_cell_check_finds(local):
    length = 7
    starts = np.arange(-6, 10)
    for start, cells in zip(starts, _cells_inside(starts, local, length)):
        where = start + local
        inside = (where >= 0) & (where < length)
        if not inside.any():
            assert cells is None, start
            continue
        grid = np.arange(length)[cells[0]]  # the region's cells it names, in order
        sample = np.arange(len(local))[cells[1]]  # and the sample's
        np.testing.assert_array_equal(grid, where[inside], err_msg=str(start))
        np.testing.assert_array_equal(sample, np.flatnonzero(inside), err_msg=str(start))
        if len(local) == 1 or ((np.diff(local) > 0).all() and len(set(np.diff(local))) == 1):
            assert isinstance(cells[0], slice) and isinstance(cells[1], slice)  # evenly spaced: basic slicing


def test_a_scan_over_its_open_bucket_limit_finishes_the_least_recent_and_loses_nothing(tmp_path, monkeypatch):
    monkeypatch.setitem(reassemble.OPEN_BUCKETS, "local", 2)
    plan = types.SimpleNamespace(work=str(tmp_path))
    sent: dict[int, list[int]] = {}
    finished = []
    with reassemble._OpenBuckets(plan) as buckets:
        for step, chunk in enumerate([0, 1, 0, 2, 1, 3, 0]):  # 2 and 3 push out 1, then 0; 0 and 1 come back
            sent.setdefault(chunk, []).append(step)
            finished += buckets.write(chunk, {"index/time": np.array([step]), "t": np.full((1, 2), step, "f4")})
            assert len(buckets.open) <= 2
        finished += buckets.close()
    assert [c for c, _ in finished[:2]] == [1, 0]  # the least recently written first
    got: dict[int, list[int]] = {}
    for chunk, path in finished:
        assert path.startswith(str(tmp_path)) and f"chunk-{chunk:06d}-" in path
        with open(path, "rb") as stream:
            for frame in reassemble.iter_bucket(stream, path):
                np.testing.assert_array_equal(frame["t"], np.repeat(frame["index/time"][:, None], 2, 1))
                got.setdefault(chunk, []).extend(frame["index/time"].tolist())
    assert {c: sorted(v) for c, v in got.items()} == sent
    assert len(finished) == 6  # 0 and 1 each in two files
