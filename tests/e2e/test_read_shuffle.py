"""shuffle.mode: read: the write-shuffled build's samples and statistics, stored in unit order, read in a fresh global
order every epoch through the shards' indexes."""

from __future__ import annotations

import functools
import json
import warnings
from itertools import islice
from pathlib import Path

import numpy as np
import pytest
import yaml

import schemas.stored_order as stored_order
from pipelines import graph
from pipelines.build import main
from pipelines.inspect import main as inspect_main
from planning.config import parse_config
from planning.plan import make_plan
from schemas import Reader, epoch_order, load_dataset, load_schema, open_source, shuffled_stream
from schemas.shard_index import index_name

from conftest import BUCKET
from helpers import import_generated_parser

#: Small units, so that the small archive makes many: shards start and end inside units, splits cut through some.
UNIT_BUDGET_BYTES = 100_000
SPLITS = {"train": {"time": ["2020-01-01", "2020-01-02T06"]}, "test": {"time": ["2020-01-02T12", None]}}
INDEX = ("index/time", "index/lat", "index/lon")


def _config(archive: Path, output: str, mode: str, **output_options) -> dict:
    return {
        "input": {"paths": str(archive / "*.nc")},
        "variables": ["t", "q"],
        "sample": {"window": {"lat": 5, "lon": 6}, "offsets": {"time": [0, 1]}, "keep": ["level"]},
        "splits": SPLITS,
        "shuffle": {"seed": 3, "mode": mode},
        "output": {"path": output, "num_shards": 3, **output_options},
    }


def _build(config: dict, folder: Path, *flags: str) -> int:
    path = folder / f"config-{len(list(folder.glob('config-*')))}.yaml"
    path.write_text(yaml.safe_dump(config))
    return main(["--config", str(path), "--quiet", *flags])


@pytest.fixture(scope="module")
def built(small_archive, tmp_path_factory) -> dict[str, Path]:
    """The same build written shuffled (the default) and in unit order."""
    folder = tmp_path_factory.mktemp("modes")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(graph, "make_plan", functools.partial(make_plan, unit_budget_bytes=UNIT_BUDGET_BYTES))
        for mode in ("write", "read"):
            assert _build(_config(small_archive, str(folder / mode), mode), folder) == 0
    return {"write": folder / "write", "read": folder / "read", "folder": folder}


def _samples(reader) -> dict[tuple, dict[str, np.ndarray]]:
    """Each sample's features, by its index/* values."""
    return {tuple(int(sample[k]) for k in INDEX): sample for sample in reader}


@pytest.mark.parametrize("split", sorted(SPLITS))
def test_the_unit_order_holds_the_shuffled_builds_samples_value_for_value(built, split):
    shuffled, stored = _samples(Reader(str(built["write"]), split)), _samples(Reader(str(built["read"]), split))
    assert stored.keys() == shuffled.keys() and len(stored) > 20
    for key, sample in stored.items():
        assert all(np.array_equal(sample[name], shuffled[key][name]) for name in sample), key


def test_its_statistics_are_the_shuffled_builds_bit_for_bit(built):
    assert (built["read"] / "stats.json").read_bytes() == (built["write"] / "stats.json").read_bytes()


def test_each_split_is_cut_into_shards_of_equal_counts_in_unit_order(built):
    schema = load_schema(str(built["read"]))
    assert schema.sample["stored_order"] == "units" and "stored_order" not in load_schema(str(built["write"])).sample
    plan = make_plan(parse_config(schema.config), unit_budget_bytes=UNIT_BUDGET_BYTES)
    assert len(plan.units) > 6  # (several units per shard, some cut by two shards or two splits)
    axes = plan.grid.grid_axes
    unit_of = {}  # each grid position's unit
    for unit in plan.units:
        for position in zip(*plan.grid.unit_positions(unit)):
            unit_of[tuple(int(p) for p in position)] = unit.index
    for split, shards in schema.splits.items():
        counts = [shard.examples for shard in shards]
        assert max(counts) - min(counts) <= 1, counts
        stored = list(Reader(str(built["read"]), split))
        positions = [tuple(int(s[f"index/{a.dim}"]) // a.stride for a in axes) for s in stored]
        units = [unit_of[p] for p in positions]
        assert units == sorted(units)  # unit after unit
        # Within a unit, sample-id order: the grid positions row-major.
        for i in range(1, len(units)):
            if units[i] == units[i - 1]:
                assert positions[i] > positions[i - 1]


def test_readers_take_a_fresh_full_global_order_every_epoch(built):
    path = str(built["read"])
    stored = [tuple(int(s[k]) for k in INDEX) for s in Reader(path, "train")]
    source = open_source(path, "train")
    assert [tuple(int(source[i][k]) for k in INDEX) for i in range(len(source))] == stored
    n = len(stored)
    orders = [epoch_order(n, 0, epoch) for epoch in (0, 1)]
    assert sorted(orders[0].tolist()) == list(range(n)) and orders[0].tolist() != list(range(n))
    assert orders[0].tolist() != orders[1].tolist()

    streamed = [tuple(int(s[k]) for k in INDEX) for s in islice(shuffled_stream(path, "train", seed=5), n)]
    assert sorted(streamed) == sorted(stored) and streamed != stored
    stream = shuffled_stream(path, "train", seed=5)
    list(islice(stream, 11))
    resumed = shuffled_stream(path, "train", seed=5, rank=1, world_size=2, state=stream.state())
    assert [tuple(int(s[k]) for k in INDEX) for s in islice(resumed, 3)] == streamed[12:17:2]  # an exact resume

    batches = list(load_dataset(path, "train", batch_size=7, epoch=0).as_numpy_iterator())
    read = [tuple(int(b[k][i]) for k in INDEX) for b in batches for i in range(len(b[INDEX[0]]))]
    assert read == [stored[i] for i in orders[0]]
    assert inspect_main([path, "--verify"]) == 0


def test_a_sequential_read_in_unit_order_warns_once_and_a_shuffled_ones_never(built, monkeypatch):
    monkeypatch.setattr(stored_order, "_warned", set())
    with pytest.warns(stored_order.UnitOrderWarning, match=r"unit \(archive\) order .* epoch=e"):
        load_dataset(str(built["read"]), "train")
    with warnings.catch_warnings():
        warnings.simplefilter("error", stored_order.UnitOrderWarning)
        load_dataset(str(built["read"]), "test")  # (once per output)
        load_dataset(str(built["write"]), "train")
        load_dataset(str(built["read"]), "train", epoch=2)


def test_inspect_and_the_generated_parser_say_the_order(built, capsys):
    assert inspect_main([str(built["read"])]) == 0
    assert "records stored in unit order (shuffle.mode: read)" in capsys.readouterr().out
    assert inspect_main([str(built["write"])]) == 0
    assert "records stored shuffled at write" in capsys.readouterr().out
    assert "# Its records lie in unit (archive) order" in (built["read"] / "parser.py").read_text()
    parser = import_generated_parser(built["read"])
    with pytest.warns(UserWarning, match="unit"):
        batch = next(iter(parser.make_dataset("train", batch_size=4)))
    assert batch["t"].shape[0] == 4


def test_an_append_in_unit_order_adds_a_generation_holding_the_new_samples(small_archive, built, capsys):
    folder = built["folder"]
    files = sorted(str(p) for p in small_archive.glob("*.nc"))
    output = folder / "appended"
    config = _config(small_archive, str(output), "read")
    assert _build({**config, "input": {"paths": files[:2]}}, folder) == 0
    before = {p.name: p.read_bytes() for p in output.glob("*.tfrecord")}
    capsys.readouterr()
    # An output is appended to in the mode it was built with: its sequential order would otherwise change midway.
    assert _build({**config, "shuffle": {"seed": 3, "mode": "write"}}, folder, "--append") == 2
    (line,) = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert line.startswith("error: shuffle.mode: 'write' differs from the 'read' the output was built with")
    assert _build(config, folder, "--append") == 0
    schema, full = load_schema(str(output)), load_schema(str(built["read"]))
    assert schema.sample["stored_order"] == "units"
    for name, data in before.items():
        assert (output / name).read_bytes() == data  # the first generation's shards untouched
    for split in SPLITS:
        assert sorted(_samples(Reader(str(output), split))) == sorted(_samples(Reader(str(built["read"]), split)))
        assert schema.num_examples(split) == full.num_examples(split)
    appended, rebuilt = (
        json.loads((output / "stats.json").read_text()),
        json.loads((built["read"] / "stats.json").read_text()),
    )
    for split in SPLITS:
        for name, entry in rebuilt["splits"][split]["variables"].items():
            assert np.allclose(appended["splits"][split]["variables"][name]["mean"], entry["mean"], rtol=1e-12)
    assert inspect_main([str(output), "--verify"]) == 0


def test_a_gs_output_in_unit_order_holds_the_local_outputs_bytes(small_archive, built, gcs, tmp_path):
    output = f"gs://{BUCKET}/unit-order/out"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(graph, "make_plan", functools.partial(make_plan, unit_budget_bytes=UNIT_BUDGET_BYTES))
        assert _build(_config(small_archive, output, "read"), tmp_path) == 0
    schema = load_schema(output)
    assert schema.splits == load_schema(str(built["read"])).splits
    for shards in schema.splits.values():
        for shard in shards:
            for name in (shard.file, index_name(shard.file)):
                assert gcs.cat(f"{output}/{name}") == (built["read"] / name).read_bytes(), name
    assert not gcs.exists(f"{output}/_tmp")


def test_nan_policy_drop_in_unit_order_keeps_the_shuffled_builds_samples(tmp_path):
    """Dropped samples are counted in their unit's ranks at planning: shards hold the kept ones of their runs."""
    import pandas as pd
    import xarray as xr

    time = pd.date_range("2000-01-01", periods=8, freq="6h")
    values = np.random.default_rng(0).normal(size=(8, 6, 6)).astype("f4")
    values[:2] = np.nan  # every sample of the first steps' units
    values[np.random.default_rng(1).random(values.shape) < 0.03] = np.nan  # and some samples of most others
    xr.Dataset(
        {"t": (("time", "lat", "lon"), values)}, coords={"time": time, "lat": np.arange(6.0), "lon": np.arange(6.0)}
    ).to_netcdf(tmp_path / "nan.nc")
    outputs = {}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(graph, "make_plan", functools.partial(make_plan, unit_budget_bytes=300))
        for mode in ("write", "read"):
            config = {
                "input": {"paths": str(tmp_path / "nan.nc")},
                "sample": {"window": {"lat": 3, "lon": 3, "time": 1}},
                "nan_policy": "drop",
                "shuffle": {"mode": mode},
                "output": {"path": str(tmp_path / mode), "num_shards": 3},
            }
            assert _build(config, tmp_path) == 0
            outputs[mode] = tmp_path / mode
    shuffled, stored = (_samples(Reader(str(outputs[mode]))) for mode in ("write", "read"))
    assert stored.keys() == shuffled.keys() and 0 < len(stored) < 8 * 16
    assert all(not np.isnan(sample["t"]).any() for sample in stored.values())
    assert (outputs["read"] / "stats.json").read_bytes() == (outputs["write"] / "stats.json").read_bytes()
    assert load_schema(str(outputs["read"])).counts == load_schema(str(outputs["write"])).counts
