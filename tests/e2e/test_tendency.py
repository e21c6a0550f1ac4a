"""stats.tendency: the moments of x(t+1) - x(t) over the reference split's pairs of steps equal numpy's.

The pairs are the source's (every cell of the selected region, each pair once), never across a
gap or a split boundary; a real file (the vendored CESM one) through a whole build, and a
generated archive with a gap, a split boundary inside a file, a file boundary, levels (stats.per)
and a variable without every dim, through the plan's own units at two budgets.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import xarray as xr
import yaml

from planning.config import BuildConfig
from planning.plan import make_plan
from planning.specs import tendency_spec
from transforms.tendency import tendency_summary

from helpers import build_quietly, import_generated_parser, refused

TREFHT = "TREFHT.B06.57.atm.1890-1999ANN.nc"


def _close(got, want) -> None:
    np.testing.assert_allclose(np.asarray(got, dtype=np.float64), want, rtol=1e-12, atol=0)


def _numpy(pairs: np.ndarray, per_axis: int | None = None) -> dict:
    """count, mean, variance, min, max of the differences ``pairs`` (float64), per index along ``per_axis``."""
    if per_axis is None:
        pairs, per_axis = pairs[None], 0
    flat = np.moveaxis(pairs, per_axis, 0).reshape(pairs.shape[per_axis], -1)
    return {
        "count": [flat.shape[1]] * len(flat),
        "mean": flat.mean(axis=1),
        "variance": flat.var(axis=1),
        "min": flat.min(axis=1),
        "max": flat.max(axis=1),
    }


def _check(stored: dict, want: dict) -> None:
    """stats.json's fields (one index) against _numpy's."""
    assert stored["count"] == want["count"][0]
    for key in ("mean", "variance", "min", "max"):
        _close(stored[key], want[key][0])


ROLES = {
    "inputs": {"variables": ["TREFHT"], "offsets": {"time": [-1, 0]}},
    "targets": {"variables": ["TREFHT"], "offsets": {"time": [1]}, "crop": {"lat": 8, "lon": 8}},
}


@pytest.fixture(scope="module")
def cesm_build(sample_file, tmp_path_factory):
    work = tmp_path_factory.mktemp("tendency-cesm")
    config = {
        "input": {"paths": str(sample_file(TREFHT))},
        "sample": {"window": {"lat": 16, "lon": 16}, "roles": ROLES},
        "splits": {"train": {"time": ["1890", "1979"]}, "test": {"time": ["1980", "1999"]}},
        "stats": {"tendency": True},
        "output": {"path": str(work / "out")},
    }
    return build_quietly(config, work), sample_file(TREFHT)


def test_tendency_of_a_real_file_equals_numpys_on_the_train_pairs(cesm_build):
    output, source = cesm_build
    stats = json.loads((output / "stats.json").read_text())
    with xr.open_dataset(source) as ds:
        train = ds["TREFHT"].sel(time=slice("1890", "1979")).values.astype(np.float32).astype(np.float64)
    tendency = stats["tendency"]
    assert tendency["reference_split"] == "train" and tendency["dim"] == "time"
    # Every cell of every pair of train steps (none across into test), whatever the samples' windows and offsets.
    _check(tendency["variables"]["TREFHT"], _numpy(np.diff(train, axis=0)))
    assert tendency["variables"]["TREFHT"]["count"] == 89 * 64 * 128
    # The generation's own record holds the same accumulators (what an append merges into).
    generations = json.loads((output / "generations.json").read_text())["generations"]
    assert generations[0]["splits"]["train"]["tendency"]["TREFHT"]["count"] == 89 * 64 * 128


def test_normalize_tendency_makes_the_targets_residuals(cesm_build):
    output, _ = cesm_build
    stats = json.loads((output / "stats.json").read_text())
    constants = stats["tendency"]["normalization"]
    assert list(constants) == ["targets/TREFHT"]  # (inputs/TREFHT at -1 has no step before it in the sample)
    assert constants["targets/TREFHT"]["residual_of"]["feature"] == "inputs/TREFHT"
    mean, std = (np.float32(constants["targets/TREFHT"][k][0][0][0]) for k in ("mean", "std"))
    from schemas.reader import Reader

    raw = Reader(str(output), "test").read_all()
    residual = Reader(str(output), "test", normalize="tendency").read_all()
    before = raw["inputs/TREFHT"][:, 1:2, 4:12, 4:12]  # offset 0, the centred 8 x 8 of the 16 x 16 window
    want = (raw["targets/TREFHT"] - before - mean) / std
    np.testing.assert_allclose(residual["targets/TREFHT"], want, rtol=1e-5, atol=1e-5)
    regular = Reader(str(output), "test", normalize=True).read_all()
    np.testing.assert_array_equal(residual["inputs/TREFHT"], regular["inputs/TREFHT"])  # the others as before
    # TensorFlow's parser (load_dataset and the generated parser.py) agrees, batch by batch in file order.
    from schemas import load_dataset

    parsed = np.concatenate([b["targets/TREFHT"] for b in load_dataset(str(output), "test", 64, normalize="tendency")])
    np.testing.assert_allclose(parsed, residual["targets/TREFHT"], rtol=1e-5, atol=1e-5)
    parser = import_generated_parser(output)
    batches = parser.make_dataset("test", batch_size=64, normalize="tendency").as_numpy_iterator()
    generated = np.concatenate([b["targets/TREFHT"] for b in batches])
    np.testing.assert_allclose(generated, residual["targets/TREFHT"], rtol=1e-5, atol=1e-5)


def _write_archive(directory: Path) -> xr.Dataset:
    """Daily steps in two files, one day missing in the first (a gap); levels; a zonal mean lacking lon."""
    rng = np.random.default_rng(7)
    days = pd.date_range("2000-01-01", periods=14, freq="D").delete(5)  # 2000-01-06 missing
    shape = (len(days), 3, 6, 8)
    t = (rng.normal(size=shape) * np.arange(1, 4)[None, :, None, None] + 280).astype(np.float32)
    data = xr.Dataset(
        {
            "t": (("time", "level", "lat", "lon"), t),
            "zm": (("time", "level", "lat"), t.mean(axis=3) * 2),
            "orog": (("lat", "lon"), rng.normal(size=shape[2:]).astype(np.float32)),
        },
        coords={"time": days, "level": [850, 500, 250], "lat": np.linspace(-50, 50, 6), "lon": np.arange(8) * 45.0},
    )
    directory.mkdir(parents=True, exist_ok=True)
    data.isel(time=slice(0, 7)).to_netcdf(directory / "a.nc")
    data.isel(time=slice(7, None)).drop_vars("orog").to_netcdf(directory / "b.nc")
    return data


@pytest.fixture(scope="module")
def gapped(tmp_path_factory) -> tuple[Path, xr.Dataset]:
    directory = tmp_path_factory.mktemp("tendency-gap")
    return directory, _write_archive(directory / "in")


def _config(directory: Path, **stats) -> BuildConfig:
    return BuildConfig.model_validate(
        {
            "input": {"paths": str(directory / "in" / "*.nc")},
            "variables": ["t", "zm"],
            # Samples of 2 x 2 cells every 4: the tendency still covers every cell.
            "sample": {"window": {"lat": {"size": 2, "stride": 4}, "lon": {"size": 2, "stride": 4}}, "keep": ["level"]},
            # A split boundary inside the first file; test holds the gap and the seam between the files.
            "splits": {"train": {"time": [None, "2000-01-03"]}, "test": {"time": ["2000-01-04", None]}},
            "stats": {"per": ["level"], "tendency": True, **stats},
            "output": {"path": str(directory / "out")},
        }
    )


SPLITS = {"train": slice(None, "2000-01-03"), "test": slice("2000-01-04", None)}


@pytest.mark.parametrize(("split", "budget"), [("train", 64e6), ("test", 64e6), ("test", 300)])
def test_tendency_skips_gaps_and_split_boundaries_per_level_whatever_the_units(gapped, split, budget):
    directory, data = gapped
    plan = make_plan(_config(directory, reference_split=split), unit_budget_bytes=budget)
    if budget < 1000:  # units of one pair and a few cells: pairs across units read the step after them, and
        # zm (no lon) lies whole in each unit along lon: only the first counts it
        assert {unit.ranges[0][1] - unit.ranges[0][0] for unit in plan.tendency.units} == {1}
        assert max(unit.ranges[2][0] for unit in plan.tendency.units) > 0
    summary = tendency_summary(tendency_spec(plan))[split].tendency
    steps = data.sel(time=SPLITS[split])
    regular = np.diff(steps.time.values) == np.timedelta64(1, "D")
    assert regular.sum() == (2 if split == "train" else 8)  # (test: 01-05 to 01-07 is a gap)
    for name in ("t", "zm"):
        pairs = np.diff(steps[name].values.astype(np.float64), axis=0)[regular]
        want = _numpy(pairs, per_axis=1)
        got = summary[name]
        assert got.count.tolist() == want["count"]
        for key, value in (("mean", got.mean), ("variance", got.variance), ("min", got.minimum), ("max", got.maximum)):
            _close(value, want[key])
    assert "orog" not in summary  # (no concat dim: no tendency)


@pytest.mark.filterwarnings("ignore:Consolidated metadata:UserWarning")
def test_a_zarr_stores_tendency_equals_the_files(gapped, tmp_path):
    """The same steps in a store (chunks of 4 steps): its units hold whole chunks and read the next one's first step."""
    directory, data = gapped
    store = tmp_path / "gapped.zarr"
    data.drop_vars("orog").chunk({"time": 4}).to_zarr(store, consolidated=True)
    config = _config(directory, reference_split="test").model_dump(mode="json", exclude_none=True)
    config["input"]["paths"] = [str(store)]
    plan = make_plan(BuildConfig.model_validate(config), unit_budget_bytes=3000)
    assert len(plan.tendency.units) > 1
    got = tendency_summary(tendency_spec(plan))["test"].tendency["t"]
    steps = data.sel(time=SPLITS["test"])
    regular = np.diff(steps.time.values) == np.timedelta64(1, "D")
    want = _numpy(np.diff(steps["t"].values.astype(np.float64), axis=0)[regular], per_axis=1)
    assert got.count.tolist() == want["count"]
    _close(got.mean, want["mean"])
    _close(got.variance, want["variance"])


def test_members_split_the_tendency_by_member(tmp_path):
    """Splits along input.new_dim: the reference split's members only, every pair of steps of each."""
    rng = np.random.default_rng(3)
    days = pd.date_range("2001-01-01", periods=5, freq="D")
    members = {}
    for member in (1, 2, 3):
        values = rng.normal(size=(5, 4, 6)).astype(np.float32) * member
        members[member] = values
        xr.Dataset(
            {"t": (("time", "lat", "lon"), values)},
            coords={"time": days, "lat": np.arange(4.0), "lon": np.arange(6.0)},
        ).to_netcdf(tmp_path / f"run_m{member}.nc")
    config = BuildConfig.model_validate(
        {
            "input": {"paths": str(tmp_path / "run_m*.nc"), "new_dim": {"name": "member", "from": "_m(\\d)\\."}},
            "sample": {"window": {"lat": 2, "lon": 3}},
            "splits": {"train": {"member": [1, 2]}, "test": {"member": [3, 3]}},
            "stats": {"tendency": True},
            "output": {"path": str(tmp_path / "out")},
        }
    )
    for budget in (64e6, 400):  # (400: a unit per member and pair, or less)
        plan = make_plan(config, unit_budget_bytes=budget)
        got = tendency_summary(tendency_spec(plan))["train"].tendency["t"]
        pairs = np.concatenate([np.diff(members[m].astype(np.float64), axis=0).ravel() for m in (1, 2)])
        assert int(got.count) == pairs.size
        _close(got.mean, pairs.mean())
        _close(got.variance, pairs.var())


def test_files_on_gs_give_the_local_files_tendency(gapped, gcs):
    """Remote files (ranged reads on the storage emulator): the same pairs, the same moments to the bit."""
    from conftest import BUCKET

    directory, _ = gapped
    for path in sorted((directory / "in").glob("*.nc")):
        gcs.put(str(path), f"{BUCKET}/tendency/{path.name}")
    summaries = {}
    for where in ("local", "gs"):
        config = _config(directory, reference_split="test").model_dump(mode="json", exclude_none=True)
        if where == "gs":
            config["input"]["paths"] = f"gs://{BUCKET}/tendency/*.nc"
        plan = make_plan(BuildConfig.model_validate(config), unit_budget_bytes=2000)
        summaries[where] = tendency_summary(tendency_spec(plan))["test"].tendency["t"]
    for field in ("count", "mean", "m2", "minimum", "maximum"):
        np.testing.assert_array_equal(getattr(summaries["gs"], field), getattr(summaries["local"], field))


def test_derived_variables_tendency_is_of_the_functions_output(small_archive, tmp_path):
    """input.preprocess: the tendency units read its inputs and difference its outputs, as stored."""
    config = BuildConfig.model_validate(
        {
            "input": {"paths": str(small_archive / "*.nc"), "preprocess": "preprocess_examples:wind_speed"},
            "sample": {"window": {"lat": 4, "lon": 4}, "keep": ["level"]},
            "stats": {"tendency": True, "per": ["level"]},
            "output": {"path": str(tmp_path / "out")},
        }
    )
    got = tendency_summary(tendency_spec(make_plan(config, unit_budget_bytes=20_000)))["data"].tendency["wind_speed"]
    with xr.open_mfdataset(sorted(small_archive.glob("era5_*.nc"))) as ds:
        speed = np.sqrt(ds["u"] ** 2 + ds["v"] ** 2).transpose("time", "level", "lat", "lon").values
    want = _numpy(np.diff(speed.astype(np.float32).astype(np.float64), axis=0), per_axis=1)
    assert got.count.tolist() == want["count"]
    _close(got.mean, want["mean"])
    _close(got.variance, want["variance"])


@pytest.fixture(scope="module")
def plain_builds(gapped, tmp_path_factory) -> dict[str, Path]:
    """The gapped archive built whole, and built from its first file then --append of the second."""
    from pipelines.build import main

    directory, _ = gapped
    work = tmp_path_factory.mktemp("tendency-append")
    config = _config(directory, reference_split="test").model_dump(mode="json", exclude_none=True)
    full = build_quietly({**config, "output": {"path": str(work / "full")}}, work, "full.yaml")
    first = {**config, "input": {**config["input"], "paths": [str(directory / "in" / "a.nc")]}}
    appended = build_quietly({**first, "output": {"path": str(work / "appended")}}, work, "first.yaml")
    (work / "append.yaml").write_text(yaml.safe_dump({**config, "output": {"path": str(appended)}}))
    assert main(["--config", str(work / "append.yaml"), "--quiet", "--append"]) == 0
    return {"full": full, "appended": appended}


def test_an_append_adds_the_pairs_across_its_seam_and_equals_a_rebuild(plain_builds, gapped):
    _, data = gapped
    full, appended = (json.loads((plain_builds[k] / "stats.json").read_text()) for k in ("full", "appended"))
    assert len(appended["generations"]) == 2
    for name in ("t", "zm"):
        want, got = full["tendency"]["variables"][name], appended["tendency"]["variables"][name]
        assert got["count"] == want["count"] and got["dims"] == ["level"]
        for key in ("mean", "variance", "std", "min", "max"):
            _close(got[key], want[key])
    # The second generation's own pairs: from the first file's last step (01-08) on, the seam's included.
    new = np.diff(data["t"].sel(time=slice("2000-01-08", None)).values.astype(np.float64), axis=0)
    own = appended["generations"][1]["tendency"]["t"]
    assert own["count"] == _numpy(new, per_axis=1)["count"] == [6 * 6 * 8] * 3
    _close(own["mean"], _numpy(new, per_axis=1)["mean"])


def test_a_backfill_adds_the_pairs_before_and_across_its_first_step(gapped, tmp_path):
    """--append of earlier steps: the new pairs are those before the held ones and the one across their first."""
    from pipelines.build import main

    directory, _ = gapped
    config = _config(directory, reference_split="test").model_dump(mode="json", exclude_none=True)
    config["splits"] = {"test": {"time": ["2000-01-04", None]}}  # (the held file alone must hold every split)
    outputs = {}
    for name, paths in (("rebuilt", ["a.nc", "b.nc"]), ("backfilled", ["b.nc"])):
        first = {**config, "input": {**config["input"], "paths": [str(directory / "in" / p) for p in paths]}}
        outputs[name] = build_quietly({**first, "output": {"path": str(tmp_path / name)}}, tmp_path, f"{name}.yaml")
    (tmp_path / "backfill.yaml").write_text(yaml.safe_dump({**config, "output": {"path": str(outputs["backfilled"])}}))
    assert main(["--config", str(tmp_path / "backfill.yaml"), "--quiet", "--append"]) == 0
    rebuilt, backfilled = (json.loads((outputs[k] / "stats.json").read_text()) for k in ("rebuilt", "backfilled"))
    for name in ("t", "zm"):
        want, got = rebuilt["tendency"]["variables"][name], backfilled["tendency"]["variables"][name]
        assert got["count"] == want["count"]
        for key in ("mean", "variance", "min", "max"):
            _close(got[key], want[key])
    # Generation 1's own: 01-04 to 01-05 and 01-07 to 01-09 (01-08 to 01-09 across the held first step).
    assert backfilled["generations"][1]["tendency"]["t"]["count"] == [3 * 6 * 8] * 3


def test_normalize_tendency_without_residual_constants_is_refused_in_one_line(plain_builds):
    from schemas.errors import UserError
    from schemas.reader import Reader

    output = str(plain_builds["full"])  # stats.tendency, but no roles: no residual to form
    with pytest.raises(UserError, match="no residual constants for normalize='tendency'"):
        Reader(output, "train", normalize="tendency")
    with pytest.raises(UserError, match="is not True, False or 'tendency'"):
        Reader(output, "train", normalize="residual")


def test_hostile_tendency_configs_are_refused_in_one_line(gapped, tmp_path, capsys):
    directory, _ = gapped
    base = _config(directory).model_dump(mode="json", exclude_none=True)
    base["output"]["path"] = str(tmp_path / "out")
    one_step = {**base, "select": {"time": {"min": "2000-01-03", "max": "2000-01-03"}}, "splits": {}}
    assert "stats.tendency: 'time' holds 1 step(s)" in refused(one_step, tmp_path, capsys)
    # A split of steps none of which is a regular step from the next: nothing to summarise.
    lone = {**base, "splits": {"train": {"time": ["2000-01-05", "2000-01-05"]}, "test": {"time": ["2000-01-07", None]}}}
    assert "split 'train' holds no two consecutive time steps" in refused(lone, tmp_path, capsys)
