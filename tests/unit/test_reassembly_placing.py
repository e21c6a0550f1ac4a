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
    with reassemble._OpenBuckets(plan, "predictions.npz") as buckets:
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


def _steps_in_name_order(work, source_names) -> dict[int, list[int]]:
    """Two scans of the same samples, one per source; each chunk's steps as its task reads them (paths sorted)."""
    plan = types.SimpleNamespace(work=str(work))
    paths: dict[int, list[str]] = {}
    for source in source_names:
        with reassemble._OpenBuckets(plan, source) as buckets:
            for step in range(8):  # with one bucket open, each write finishes the other chunk's: 4 files a chunk
                for chunk, path in buckets.write(step % 2, {"index/time": np.array([step])}):
                    paths.setdefault(chunk, []).append(path)
            for chunk, path in buckets.close():
                paths.setdefault(chunk, []).append(path)
    steps: dict[int, list[int]] = {}
    for chunk, found in paths.items():
        for path in sorted(found):
            with open(path, "rb") as stream:
                for frame in reassemble.iter_bucket(stream, path):
                    steps.setdefault(chunk, []).extend(frame["index/time"].tolist())
    return steps


def test_a_chunks_buckets_sort_by_the_file_scanned_then_as_its_scan_wrote_them(tmp_path, monkeypatch):
    """A chunk's task places its buckets' samples in name order, so overlapping predictions blend in one order
    every run (a sum in another order differs in its last bits): by the file scanned, then the scan's order."""
    monkeypatch.setitem(reassemble.OPEN_BUCKETS, "local", 1)
    first = _steps_in_name_order(tmp_path / "first", ["b.npz", "a.npz"])
    assert {chunk: sorted(steps) for chunk, steps in first.items()} == {
        0: [0, 0, 2, 2, 4, 4, 6, 6],
        1: [1, 1, 3, 3, 5, 5, 7, 7],
    }
    for chunk, steps in first.items():  # one file's samples, then the other's, each in the order it was scanned
        assert steps[:4] == steps[4:] == list(range(chunk, 8, 2)), steps
    # Again, the files scanned the other way round (as another run's workers may): the same order.
    assert _steps_in_name_order(tmp_path / "second", ["a.npz", "b.npz"]) == first
