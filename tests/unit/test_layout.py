"""The shards' byte layout planned before any data is read: every written record once, tiled in key order."""

from __future__ import annotations

import numpy as np
import pytest

from planning.config import parse_config
from planning.keys import keys_and_shards
from planning.layout import plan_layout
from planning.plan import make_plan
from schemas.example_codec import ExampleEncoder
from schemas.tfrecord import frame


def _plan(archive, seed: int = 0):
    """Two splits with steps between them that belong to neither, so some samples are not written."""
    config = {
        "input": {"paths": str(archive / "*.nc")},
        "variables": ["t"],
        "sample": {"window": {"lat": 5, "lon": {"size": 6, "stride": 3}}, "keep": ["level"]},
        "splits": {"train": {"time": [None, "2020-01-01T12"]}, "valid": {"time": ["2020-01-02T06", None]}},
        "shuffle": {"seed": seed},
        "output": {"path": "unused", "num_shards": 3},
    }
    return make_plan(parse_config(config))


@pytest.fixture(scope="module")
def plan(small_archive):
    return _plan(small_archive)


def _records(plan, ids: np.ndarray) -> list[bytes]:
    """The framed records of these samples, their variables zero: only positions change a record's size."""
    positions = list(np.unravel_index(ids, plan.grid.shape))
    columns = {name: values for name, (_, values) in plan.positions.columns(positions).items()}
    for feature in plan.schema.features:
        columns.setdefault(feature.name, np.zeros((len(ids), *feature.shape), dtype=feature.dtype))
    return [frame(record) for record in ExampleEncoder(plan.schema.features).encode(columns)]


def test_every_written_record_has_its_place_and_the_places_tile_each_shard_in_key_order(plan, tmp_path):
    layout = plan_layout(plan, str(tmp_path / "layout"))
    shard_of_id, offset_of_id = np.asarray(layout.shard_of_id()), np.asarray(layout.offset_of_id())
    ids = np.arange(plan.grid.num_samples)
    labels = plan.positions.split_labels(list(np.unravel_index(ids, plan.grid.shape)))
    assert (labels < 0).any() and (labels >= 0).any()
    assert (shard_of_id[labels < 0] == -1).all()  # outside the splits: no place
    written = ids[labels >= 0]
    assert len(written) == plan.num_samples == sum(layout.records)
    keys, shards = keys_and_shards(written, labels[labels >= 0], plan.seed, plan.splits)
    np.testing.assert_array_equal(shard_of_id[written], shards)
    sizes = np.array([len(record) for record in _records(plan, written)])
    for shard in range(plan.num_shards):
        mine = shards == shard
        order = np.argsort(keys[mine])  # a shard is sorted by shuffle key: the shuffle
        starts, lengths = offset_of_id[written[mine]][order], sizes[mine][order]
        assert starts[0] == 0 and (starts[1:] == starts[:-1] + lengths[:-1]).all(), shard  # no gap, no overlap
        assert starts[-1] + lengths[-1] == layout.bytes[shard] and mine.sum() == layout.records[shard]


def test_another_seed_places_the_same_records_elsewhere(plan, small_archive, tmp_path):
    first = plan_layout(plan, str(tmp_path / "a"))
    reseeded = plan_layout(_plan(small_archive, seed=1), str(tmp_path / "b"))
    assert sum(first.records) == sum(reseeded.records)
    assert sum(first.bytes) == sum(reseeded.bytes)
    np.testing.assert_array_equal(np.asarray(first.shard_of_id()) >= 0, np.asarray(reseeded.shard_of_id()) >= 0)
    assert not np.array_equal(np.asarray(first.offset_of_id()), np.asarray(reseeded.offset_of_id()))
