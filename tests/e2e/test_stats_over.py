"""stats.json counts what it says: the values the records store (stats.over: samples) or the field (stats.over: field).

One generated archive (two files, a split boundary inside the second, levels, NaN filled and
masked, float64 values stored as float32) built with overlapping windows, sample.roles with a
crop, and stats.per; every statistic is computed again here from the source arrays with numpy,
sample by sample for the default and step by step for the field, and compared within 1e-9.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import xarray as xr
import yaml

from helpers import build_quietly, refused

LEVELS, LAT, LON = 3, 8, 10
WINDOW, STRIDE, CROP = 4, 2, 2
#: Split positions along time (both ends included), as index ranges of the 12 daily steps.
SPLITS = {"train": (0, 6), "test": (7, 11)}
ROLES = {
    "inputs": {"variables": ["t", "u"], "offsets": {"time": [-1, 0]}},
    "targets": {"variables": ["t"], "offsets": {"time": [1]}, "crop": {"lat": CROP, "lon": CROP}},
}


@pytest.fixture(scope="module")
def archive(tmp_path_factory) -> tuple[Path, xr.Dataset]:
    directory = tmp_path_factory.mktemp("stats-over")
    rng = np.random.default_rng(11)
    days = pd.date_range("2000-01-01", periods=12, freq="D")
    shape = (len(days), LEVELS, LAT, LON)
    # float64 in the files (stored as float32), a large mean beside a small spread, a spread per level
    t = rng.normal(size=shape) * np.arange(1, LEVELS + 1)[None, :, None, None] + 280.0
    u = (rng.normal(size=shape) * 5).astype(np.float32)
    t[3, 1, 2, 3] = t[8, 0, 5, 5] = np.nan
    u[4, 2, 0, 0] = np.nan
    data = xr.Dataset(
        {"t": (("time", "level", "lat", "lon"), t), "u": (("time", "level", "lat", "lon"), u)},
        coords={"time": days, "level": [850, 500, 250], "lat": np.arange(LAT) * 10.0, "lon": np.arange(LON) * 30.0},
    )
    data.isel(time=slice(0, 6)).to_netcdf(directory / "a.nc")
    data.isel(time=slice(6, None)).to_netcdf(directory / "b.nc")
    return directory, data


def _config(directory: Path, output: Path, roles: dict, **stats) -> dict:
    return {
        "input": {"paths": str(directory / "*.nc")},
        "sample": {
            "window": {"lat": {"size": WINDOW, "stride": STRIDE}, "lon": {"size": WINDOW, "stride": STRIDE}},
            "keep": ["level"],
            "roles": roles,
        },
        "splits": {"train": {"time": [None, "2000-01-07"]}, "test": {"time": ["2000-01-08", None]}},
        "stats": {"per": ["level"], **stats},
        "nan_policy": "fill",
        "fill_value": -999.0,
        "nan_mask": True,
        "output": {"path": str(output)},
    }


def _stored(data: xr.Dataset, name: str) -> np.ndarray:
    """The variable as the records hold it (float32), in float64, dims (time, level, lat, lon)."""
    return data[name].transpose("time", "level", "lat", "lon").values.astype(np.float32).astype(np.float64)


def _sample_cells(values: np.ndarray, name: str, roles: dict, split: str) -> list[np.ndarray]:
    """Per sample of the split, the cells its records store of the variable (level first): every role's steps and
    crop, a cell two roles hold counted once."""
    low, high = SPLITS[split]
    out = []
    for step in range(low, high + 1):
        offsets = sorted({o for r in roles.values() for o in r["offsets"]["time"]})
        if step + offsets[0] < low or step + offsets[-1] > high:
            continue  # (a sample's steps all lie in its split)
        for y in range(0, LAT - WINDOW + 1, STRIDE):
            for x in range(0, LON - WINDOW + 1, STRIDE):
                held = np.zeros((len(values), LEVELS, WINDOW, WINDOW), dtype=bool)  # per step of the source
                for role in roles.values():
                    if name not in role["variables"]:
                        continue
                    crop = role.get("crop", {})
                    cy, cx = crop.get("lat", WINDOW), crop.get("lon", WINDOW)
                    y0, x0 = (WINDOW - cy) // 2, (WINDOW - cx) // 2
                    for offset in role["offsets"]["time"]:
                        held[step + offset, :, y0 : y0 + cy, x0 : x0 + cx] = True
                window = values[:, :, y : y + WINDOW, x : x + WINDOW]
                out.append(np.moveaxis(window, 1, 0)[np.moveaxis(held, 1, 0)].reshape(LEVELS, -1))
    return out


def _numpy(per_level: np.ndarray) -> dict:
    """count, filled, mean, variance, min, max per level of the values (level first; NaN: filled)."""
    real = [row[~np.isnan(row)] for row in per_level]
    return {
        "count": [len(r) for r in real],
        "filled_count": [int(np.isnan(row).sum()) for row in per_level],
        "mean": [r.mean() for r in real],
        "variance": [r.var() for r in real],
        "min": [r.min() for r in real],
        "max": [r.max() for r in real],
    }


def _check(stored: dict, want: dict) -> None:
    assert stored["dims"] == ["level"]
    assert stored["count"] == want["count"] and stored["filled_count"] == want["filled_count"]
    assert stored["nan_count"] == [0] * LEVELS  # (every NaN was filled)
    for key in ("mean", "variance", "min", "max"):
        np.testing.assert_allclose(stored[key], want[key], rtol=1e-9, atol=0, err_msg=key)


@pytest.fixture(scope="module")
def builds(archive, tmp_path_factory) -> dict[str, dict]:
    """stats.json of the archive built over the samples (the default) and over the field (with the tendency)."""
    directory, _ = archive
    work = tmp_path_factory.mktemp("stats-over-builds")
    out = {}
    for over, stats in (("samples", {}), ("field", {"over": "field", "tendency": True})):
        output = build_quietly(_config(directory, work / over, ROLES, **stats), work, f"{over}.yaml")
        out[over] = json.loads((output / "stats.json").read_text())
        out[over]["output"] = output
    return out


@pytest.mark.parametrize("split", ["train", "test"])
@pytest.mark.parametrize("name", ["t", "u"])
def test_the_default_counts_exactly_the_values_the_records_store(archive, builds, split, name):
    """Roles: the union of the variable's role features' steps and crops, once per sample, the overlapping windows'
    shared cells once per window; not the whole cut sample (every step of every role, uncropped)."""
    _, data = archive
    stats = builds["samples"]
    assert stats["over"] == "samples" and "records store" in stats["description"]
    want = _numpy(np.concatenate(_sample_cells(_stored(data, name), name, ROLES, split), axis=1))
    _check(stats["splits"][split]["variables"][name], want)
    if split == "train":
        _check(stats["variables"][name], want)


@pytest.mark.parametrize("split", ["train", "test"])
@pytest.mark.parametrize("name", ["t", "u"])
def test_over_field_counts_every_cell_and_step_of_the_split_once(archive, builds, split, name):
    _, data = archive
    stats = builds["field"]
    assert stats["over"] == "field" and "every grid point and step of the split once" in stats["description"]
    low, high = SPLITS[split]
    values = _stored(data, name)[low : high + 1]
    _check(stats["splits"][split]["variables"][name], _numpy(np.moveaxis(values, 1, 0).reshape(LEVELS, -1)))
    # The samples are counted as written, whatever the statistics count.
    assert stats["splits"][split]["samples"] == builds["samples"]["splits"][split]["samples"]


def test_over_field_normalises_with_the_fields_moments_and_its_tendency_is_the_fields_too(archive, builds):
    _, data = archive
    stats = builds["field"]
    for feature, name in (("inputs/t", "t"), ("targets/t", "t"), ("inputs/u", "u")):
        mean = np.ravel(stats["normalization"][feature]["mean"])
        np.testing.assert_allclose(mean, stats["variables"][name]["mean"], rtol=1e-12)
    assert stats["tendency"]["over"] == "field"
    low, high = SPLITS["train"]
    pairs = np.diff(_stored(data, "u")[low : high + 1], axis=0)
    real = [row[np.isfinite(row)] for row in np.moveaxis(pairs, 1, 0).reshape(LEVELS, -1)]
    np.testing.assert_allclose(stats["tendency"]["variables"]["u"]["mean"], [r.mean() for r in real], rtol=1e-9)


@pytest.mark.parametrize("over", ["samples", "field"])
def test_inspect_says_what_the_statistics_count(builds, over, capsys):
    from pipelines.inspect import main

    capsys.readouterr()
    assert main([str(builds[over]["output"])]) == 0
    assert f"Statistics (stats.json, split train, over the {over}; used by normalize=True)" in capsys.readouterr().out


def test_a_cell_two_roles_store_counts_once_per_sample(archive, tmp_path):
    """Hostile: forcings hold t's whole window at the step targets crop; the union, not the sum of the features."""
    directory, data = archive
    roles = {**ROLES, "forcings": {"variables": ["t"], "offsets": {"time": [1]}}}
    output = build_quietly(_config(directory, tmp_path / "out", roles), tmp_path)
    stats = json.loads((output / "stats.json").read_text())
    want = _numpy(np.concatenate(_sample_cells(_stored(data, "t"), "t", roles, "train"), axis=1))
    _check(stats["variables"]["t"], want)
    samples = stats["splits"]["train"]["samples"]
    assert want["count"][0] + want["filled_count"][0] == samples * 3 * WINDOW * WINDOW  # three whole steps


def test_an_append_with_roles_equals_a_rebuild_and_an_output_counted_the_old_way_is_refused(
    archive, builds, tmp_path, capsys
):
    """An append counts its role features' cells as generation 0 did. An output built with roles before stats.over
    existed counted every cut value: merging the two would be neither count, so its append is refused in one line."""
    from pipelines.build import main

    _, data = archive
    directory = tmp_path / "in"
    directory.mkdir()
    data.isel(time=slice(0, 10)).to_netcdf(directory / "a.nc")  # (test's first sample in generation 0, the rest new)
    data.isel(time=slice(10, None)).to_netcdf(directory / "b.nc")
    output = tmp_path / "out"
    config = _config(directory, output, ROLES)
    build_quietly({**config, "input": {"paths": [str(directory / "a.nc")]}}, tmp_path, "first.yaml")
    (tmp_path / "append.yaml").write_text(yaml.safe_dump(config))
    schema = output / "schema.json"
    recorded = schema.read_text()
    document = json.loads(recorded)
    del document["config"]["stats"]["over"]  # (what an earlier version recorded)
    schema.write_text(json.dumps(document))
    capsys.readouterr()
    assert main(["--config", str(tmp_path / "append.yaml"), "--quiet", "--append"]) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and "built with sample.roles before its statistics counted only" in lines[0], lines
    schema.write_text(recorded)
    assert main(["--config", str(tmp_path / "append.yaml"), "--quiet", "--append"]) == 0
    union = json.loads((output / "stats.json").read_text())
    assert len(union["generations"]) == 2
    for split in ("train", "test"):
        for name in ("t", "u"):
            got, want = union["splits"][split]["variables"][name], builds["samples"]["splits"][split]["variables"][name]
            assert got["count"] == want["count"] and got["filled_count"] == want["filled_count"]
            np.testing.assert_allclose(got["mean"], want["mean"], rtol=1e-12)
            np.testing.assert_allclose(got["variance"], want["variance"], rtol=1e-12)


def test_an_unknown_stats_over_is_refused_in_one_line(archive, tmp_path, capsys):
    directory, _ = archive
    line = refused(_config(directory, tmp_path / "out", ROLES, over="grid"), tmp_path, capsys)
    assert "stats.over" in line and "'samples'" in line and "'field'" in line


def _plain(values: np.ndarray, per_axis: int | None = None) -> dict:
    """count, mean, variance, min, max of float64 values (no NaN), per index along ``per_axis``."""
    flat = (
        values.reshape(1, -1)
        if per_axis is None
        else np.moveaxis(values, per_axis, 0).reshape(values.shape[per_axis], -1)
    )
    return {
        "count": [flat.shape[1]] * len(flat),
        "mean": flat.mean(axis=1),
        "variance": flat.var(axis=1),
        "min": flat.min(axis=1),
        "max": flat.max(axis=1),
    }


def _same(got, want: dict) -> None:
    """Moments against _plain's."""
    assert np.ravel(got.count).tolist() == want["count"]
    assert not np.any(got.filled_count) and not np.any(got.nan_count)
    for key, value in (("mean", got.mean), ("variance", got.variance), ("min", got.minimum), ("max", got.maximum)):
        np.testing.assert_allclose(np.ravel(value), want[key], rtol=1e-9, atol=0, err_msg=key)


@pytest.mark.filterwarnings("ignore:Consolidated metadata:UserWarning")
@pytest.mark.parametrize(("budget", "store"), [(64e6, False), (300, False), (3000, True)])
def test_over_field_counts_static_and_narrower_variables_once_whatever_the_units(tmp_path, budget, store):
    """Sparse windows (2 x 2 every 4) leave cells no sample holds: the field holds them. A zonal mean (no lon) and
    a static field (no time) lie whole in several units: the first ones count them, a static field once per split.
    The same steps in a Zarr store (chunks of 4 steps, units of whole chunks) give the same."""
    from planning.config import BuildConfig
    from planning.plan import make_plan
    from planning.specs import field_spec
    from transforms.field import field_summary

    rng = np.random.default_rng(5)
    days = pd.date_range("2001-01-01", periods=9, freq="D")
    t = rng.normal(size=(9, LEVELS, 6, 8)) * 3 + 250
    data = xr.Dataset(
        {
            "t": (("time", "level", "lat", "lon"), t),
            "zm": (("time", "level", "lat"), t.mean(axis=3)),
            "orog": (("lat", "lon"), rng.normal(size=(6, 8)) * 100),
        },
        coords={"time": days, "level": [850, 500, 250], "lat": np.arange(6.0), "lon": np.arange(8.0)},
    )
    data.isel(time=slice(0, 4)).to_netcdf(tmp_path / "a.nc")
    data.isel(time=slice(4, None)).drop_vars("orog").to_netcdf(tmp_path / "b.nc")
    if store:
        data = data.drop_vars("orog")
        data.chunk({"time": 4}).to_zarr(tmp_path / "in.zarr", consolidated=True)
    config = BuildConfig.model_validate(
        {
            "input": {"paths": [str(tmp_path / "in.zarr")] if store else str(tmp_path / "*.nc")},
            "variables": ["t", "zm"] if store else ["t", "zm", "orog"],
            "sample": {"window": {"lat": {"size": 2, "stride": 4}, "lon": {"size": 2, "stride": 4}}, "keep": ["level"]},
            "splits": {"train": {"time": [None, "2001-01-05"]}, "test": {"time": ["2001-01-07", None]}},  # (06: none)
            "stats": {"per": ["level"], "over": "field"},
            "output": {"path": str(tmp_path / "out")},
        }
    )
    plan = make_plan(config, unit_budget_bytes=budget)
    assert len(plan.field.units) > (9 if budget < 1000 else 1 if store else 0)
    if budget < 1000:
        assert max(unit.ranges[2][0] for unit in plan.field.units) > 0
    summaries = field_summary(field_spec(plan))
    for split, steps in (("train", slice(None, "2001-01-05")), ("test", slice("2001-01-07", None))):
        chosen = data.sel(time=steps)
        got = summaries[split].moments
        _same(got["t"], _plain(chosen["t"].values.astype(np.float32).astype(np.float64), per_axis=1))
        _same(got["zm"], _plain(chosen["zm"].values.astype(np.float32).astype(np.float64), per_axis=1))
        if not store:
            _same(got["orog"], _plain(data["orog"].values.astype(np.float32).astype(np.float64)))


def test_over_field_splits_members_along_new_dim(tmp_path):
    """Splits along input.new_dim: each split's members, every step of each."""
    from planning.config import BuildConfig
    from planning.plan import make_plan
    from planning.specs import field_spec
    from transforms.field import field_summary

    rng = np.random.default_rng(3)
    days = pd.date_range("2001-01-01", periods=5, freq="D")
    members = {}
    for member in (1, 2, 3):
        members[member] = (rng.normal(size=(5, 4, 6)) * member).astype(np.float32)
        xr.Dataset(
            {"t": (("time", "lat", "lon"), members[member])},
            coords={"time": days, "lat": np.arange(4.0), "lon": np.arange(6.0)},
        ).to_netcdf(tmp_path / f"run_m{member}.nc")
    config = BuildConfig.model_validate(
        {
            "input": {"paths": str(tmp_path / "run_m*.nc"), "new_dim": {"name": "member", "from": "_m(\\d)\\."}},
            "sample": {"window": {"lat": 2, "lon": 3}},
            "splits": {"train": {"member": [1, 2]}, "test": {"member": [3, 3]}},
            "stats": {"over": "field"},
            "output": {"path": str(tmp_path / "out")},
        }
    )
    for budget in (64e6, 400):
        summaries = field_summary(field_spec(make_plan(config, unit_budget_bytes=budget)))
        for split, chosen in (("train", (1, 2)), ("test", (3,))):
            values = np.concatenate([members[m].astype(np.float64).ravel() for m in chosen])
            _same(summaries[split].moments["t"], _plain(values))


@pytest.mark.parametrize("over", ["samples", "field"])
def test_overlapping_windows_of_a_real_file_weigh_cells_by_window_unless_over_the_field(sample_file, tmp_path, over):
    """uvt.nc's U at 300 hPa in 16 x 16 windows every 8 cells: over the samples, a cell counts once per window
    holding it (the mean 13.56 m/s, against the field's 12.44); over the field, once."""
    config = {
        "input": {"paths": str(sample_file("uvt.nc"))},
        "variables": ["U"],
        "sample": {"window": {"lat": {"size": 16, "stride": 8}, "lon": {"size": 16, "stride": 8}}, "keep": ["lev"]},
        "stats": {"per": ["lev"], "over": over},
        "output": {"path": str(tmp_path / "out")},
    }
    stats = json.loads((build_quietly(config, tmp_path) / "stats.json").read_text())
    with xr.open_dataset(sample_file("uvt.nc")) as ds:
        levels = ds["lev"].values.tolist()
        field = ds["U"].isel(time=0).values.astype(np.float64)  # (lev, lat, lon)
    if over == "field":
        cells = field.reshape(len(levels), -1)
    else:
        windows = [field[:, y : y + 16, x : x + 16] for y in range(0, 64 - 15, 8) for x in range(0, 128 - 15, 8)]
        cells = np.concatenate([w.reshape(len(levels), -1) for w in windows], axis=1)
    got = stats["variables"]["U"]
    assert stats["over"] == over and got["count"] == [cells.shape[1]] * len(levels)
    np.testing.assert_allclose(got["mean"], cells.mean(axis=1), rtol=1e-9, atol=0)
    np.testing.assert_allclose(got["variance"], cells.var(axis=1), rtol=1e-9, atol=0)
