"""choose_write_strategy: every branch, and what it hands the write stage (its folders; lay_out: its layout)."""

from __future__ import annotations

import types

import numpy as np
import pytest

from planning.config import parse_config
from planning.plan import make_plan
from planning.specs import compile_specs
from planning.write_strategy import MAX_IN_PLACE_SAMPLES, WritePlan, WriteStrategy, choose_write_strategy, lay_out
from schemas.schema import Feature

FLOAT = Feature("t", "float32", (2,), ("level",), "variable")
INDEX = Feature("index/time", "int64", (), (), "index")


def hand_made(**changes) -> types.SimpleNamespace:
    """The facts of a plan the choice reads: by default, one that can be written in place."""
    facts = {
        "output": "/data/out",
        "in_place": True,
        "nan_policy": "keep",
        "examples_per_record": 1,
        "compression": None,
        "schema": types.SimpleNamespace(features=(FLOAT, INDEX)),
        "grid": types.SimpleNamespace(num_samples=1000),
        "run_id": "0123456789ab",
        "shuffle_mode": "write",
    }
    return types.SimpleNamespace(**{**facts, **changes})


@pytest.mark.parametrize("work", [None, "/work"])
def test_shuffle_mode_read_writes_each_shard_whole_from_its_units_on_any_runner(work):
    """No sort, no bucket files, no spill objects: a worker streams its run of units into the shard."""
    write = choose_write_strategy(hand_made(shuffle_mode="read"), work)
    assert write.strategy is WriteStrategy.UNIT_RUNS and "shuffle.mode: read" in write.reason
    assert (write.bucket_dir, write.spill_dir, write.layout, write.work_dir) == (None, None, None, work)


@pytest.mark.parametrize("output", ["gs://bucket/out", "/data/out"])
def test_workers_that_share_no_filesystem_get_spill_objects_under_the_outputs_tmp_whatever_the_plan(output):
    """No payload through the runner's GroupByKey: Dataflow bills its shuffle by the byte, Dask holds it in memory."""
    write = choose_write_strategy(hand_made(output=output), None)
    assert write.strategy is WriteStrategy.SPILL_OBJECTS and "share no filesystem" in write.reason
    assert write.work_dir == f"{output}/_tmp/0123456789ab" and write.spill_dir == f"{write.work_dir}/spill"
    assert (write.bucket_dir, write.layout) == (None, None)
    # Progress markers are local files the driver reads: none in a URL.
    assert write.progress_dir == (None if output.startswith("gs://") else f"{write.work_dir}/progress")
    # A shared filesystem decides as before.
    assert choose_write_strategy(hand_made(), "/work").strategy is WriteStrategy.IN_PLACE
    assert choose_write_strategy(hand_made(), "/work").spill_dir is None


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"in_place": False}, "output.in_place is false"),
        ({"output": "gs://bucket/out"}, "the output is a URL"),
        ({"nan_policy": "drop"}, "nan_policy: drop"),
        ({"examples_per_record": 4}, "packed or compressed"),
        ({"compression": "gzip"}, "packed or compressed"),
        (
            {"schema": types.SimpleNamespace(features=(Feature("n", "int64", (), (), "variable"), INDEX))},
            "integer variables",
        ),
        (
            {"schema": types.SimpleNamespace(features=(FLOAT, Feature("coord/x", "int64", (), (), "aux_coord")))},
            "integer variables or coords",
        ),
        ({"grid": types.SimpleNamespace(num_samples=MAX_IN_PLACE_SAMPLES + 1)}, "more than 20,000,000 samples"),
    ],
)
def test_a_shared_filesystem_writes_bucket_files_where_offsets_cannot_be_known(tmp_path, changes, reason):
    work = str(tmp_path / "work")
    write = choose_write_strategy(hand_made(**changes), work)
    assert write.strategy is WriteStrategy.BUCKET_FILES and reason in write.reason
    assert write.bucket_dir == f"{work}/buckets" and write.progress_dir == f"{work}/progress"
    assert write.layout is None and not (tmp_path / "work").exists()  # the stage makes its folders


def test_in_place_is_chosen_at_the_limits_and_deciding_writes_nothing(tmp_path):
    plan = hand_made(grid=types.SimpleNamespace(num_samples=MAX_IN_PLACE_SAMPLES), nan_policy="fill")
    write = choose_write_strategy(plan, str(tmp_path / "work"))
    assert write.strategy is WriteStrategy.IN_PLACE and write.layout is None and write.bucket_dir is None
    assert write.progress_dir == f"{tmp_path}/work/progress" and not (tmp_path / "work").exists()


def test_lay_out_saves_every_records_offset_and_the_write_spec_carries_the_layout(small_archive, tmp_path):
    config = parse_config(
        {
            "input": {"paths": str(small_archive / "*.nc")},
            "variables": ["t"],
            "sample": {"window": {"lat": 10, "lon": 12}, "keep": ["level"]},
            "output": {"path": str(tmp_path / "out"), "num_shards": 2},
        }
    )
    plan = make_plan(config)
    # The plan holds the facts compiled from the config, not the config: one home for each.
    assert not hasattr(plan, "config")
    assert (plan.output, plan.seed, plan.in_place, plan.nan_policy, plan.reference_split) == (
        f"{tmp_path}/out",
        0,
        True,
        "keep",
        "data",
    )
    write = lay_out(plan, choose_write_strategy(plan, str(tmp_path / "work")))
    assert write.strategy is WriteStrategy.IN_PLACE
    layout = write.layout
    assert layout.directory == f"{tmp_path}/work/layout" and sum(layout.records) == plan.num_samples
    shards, offsets = np.asarray(layout.shard_of_id()), np.asarray(layout.offset_of_id())
    assert sorted(set(shards.tolist())) == [0, 1] and len(set(zip(shards.tolist(), offsets.tolist()))) == len(shards)
    spec = compile_specs(plan, write).write
    assert (spec.strategy, spec.layout, spec.bucket_dir, spec.progress_dir) == (
        WriteStrategy.IN_PLACE,
        layout,
        None,
        write.progress_dir,
    )
    assert compile_specs(plan, write).finalize.work_dir == f"{tmp_path}/work"
    # Any other write needs no layout: it is handed back as it is.
    buckets = WritePlan(WriteStrategy.BUCKET_FILES, "output.in_place is false", str(tmp_path / "other"))
    assert lay_out(plan, buckets) is buckets and not (tmp_path / "other").exists()
