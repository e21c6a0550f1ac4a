"""shuffle.mode: read's shards: each split's samples in unit order, cut into runs of equal counts; every unit
summarised once."""

from __future__ import annotations

import numpy as np
import pytest

from planning.positions import Positions
from planning.sampling import Axis, SampleGrid, Units
from planning.unit_runs import UnitRuns, plan_unit_runs, run_units, split_ranks
from schemas.errors import UserError


def _grid_positions(labels, across_gap=None, split_dim=None) -> Positions:
    grid = SampleGrid((Axis.iterate("member", 3), Axis.iterate("time", 10), Axis.window("lat", 20, 5, 5)))
    return Positions(grid, "time", labels, {}, split_dim, across_gap)


#: Units: member slowest, then time, lat fastest; spans of uneven lengths.
UNITS = Units.of([[[0, 3]], [[0, 3], [3, 6], [6, 10]], [[0, 1], [1, 4]]], (0, 1, 2))
UNITS_MANY = Units.of([[[0, 2], [2, 3]], [[0, 3], [3, 6], [6, 10]], [[0, 1], [1, 4]]], (1, 0, 2))

CASES = {
    # splits along time: train, a gap of no split, test
    "time splits": (_grid_positions(np.array([0, 0, 0, 0, -1, 1, 1, 1, 1, 1], dtype=np.int16)), UNITS, [3, 4]),
    # one split; the concat dim's gaps make no samples; units ordered time first
    "gaps, one split": (
        _grid_positions(None, np.array([0, 0, 1, 0, 0, 0, 0, 1, 0, 0], dtype=bool), "member"),
        UNITS_MANY,
        [5],
    ),
    # splits along members (input.new_dim), with gaps along time
    "member splits": (
        _grid_positions(np.array([1, 0, 1], dtype=np.int16), np.array([0] * 9 + [1], dtype=bool), "member"),
        UNITS_MANY,
        [2, 7],
    ),
}


def _samples_in_unit_order(positions: Positions, units: Units, split: int) -> list[tuple[int, int]]:
    """Every sample of ``split`` as (unit, rank in the unit), in unit order: worked out sample by sample."""
    out = []
    for unit in units:
        labels = positions.split_labels(positions.grid.unit_positions(unit))
        out += [(unit.index, rank) for rank in range(int((np.asarray(labels) == split).sum()))]
    return out


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_shard_holds_its_equal_share_of_the_splits_samples_in_unit_order(name):
    positions, units, shards = CASES[name]
    samples = [len(_samples_in_unit_order(positions, units, s)) for s in range(len(shards))]
    runs = UnitRuns.from_bytes(plan_unit_runs(positions, units, samples, shards).to_bytes())  # (as workers load it)
    assert runs.split_of_shard.tolist() == [s for s, n in enumerate(shards) for _ in range(n)]
    owners = []
    for shard in range(sum(shards)):
        split = int(runs.split_of_shard[shard])
        number = shard - sum(shards[:split])
        expected = _samples_in_unit_order(positions, units, split)
        expected = expected[number * len(expected) // shards[split] : (number + 1) * len(expected) // shards[split]]
        held = [
            (part.unit.index, rank) for part in run_units(runs, units, shard) for rank in range(part.first, part.stop)
        ]
        assert held == expected, shard
        owners += [part.unit.index for part in run_units(runs, units, shard, at_a_time=2) if part.owns]
    # Every unit summarised once, by the first split holding samples of it.
    assert sorted(owners) == list(range(len(units)))


def test_a_unit_holding_samples_of_no_split_is_summarised_by_the_first_split_with_shards():
    positions = _grid_positions(np.array([-1, -1, -1, 0, 0, 0, 0, 0, 0, 0], dtype=np.int16))
    runs = plan_unit_runs(positions, UNITS, [84, 0], [2, 0])
    # 3 members x the time span's positions in the split x the lat span's positions
    assert runs.counts(0, 0, 6).tolist() == [0, 0, 3 * 3 * 1, 3 * 3 * 3, 3 * 4 * 1, 3 * 4 * 3]
    parts = [part for shard in range(2) for part in run_units(runs, UNITS, shard)]
    assert sorted(p.unit.index for p in parts if p.owns) == list(range(6))
    assert all(p.stop == p.first for p in parts if p.unit.index < 2)  # owned, but holding nothing


def test_ranks_count_a_units_samples_of_the_split_in_sample_id_order():
    positions, units, _ = CASES["time splits"]
    unit = units[3]  # time [3, 6): train at 3, none at 4, test at 5
    ids = positions.grid.sample_ids(unit)
    labels = np.asarray(positions.split_labels(positions.grid.unit_positions(unit)))
    for split in (0, 1):
        mine = ids[labels == split]
        assert split_ranks(positions, unit, split, mine).tolist() == list(range(len(mine)))
        assert split_ranks(positions, unit, split, mine[::-1]).tolist() == list(range(len(mine)))[::-1]


def test_a_run_file_past_int32_units_is_refused_in_one_line():
    # Its starts are stored as int32 (8 bytes a shard): a unit number past 2^31 would wrap, not fail.
    starts = np.array([[0, 0], [2**31, 0]], dtype=np.int64)
    runs = UnitRuns(starts, np.zeros(2, dtype=np.int64), ((np.ones(1),),), (2**31 + 1,), (0,), 2**31 + 1)
    with pytest.raises(UserError, match=r"shuffle.mode: read: unit 2,147,483,648 .* shuffle.mode: write"):
        runs.to_bytes()
