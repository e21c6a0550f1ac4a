"""Selecting levels, a region (across the longitude seam too) or a time range; files joined within a tolerance.

Every record is compared with the same slice taken by xarray's ``.sel`` on its coordinate
values, and with the slice its index/* features name on the selected grid.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import xarray as xr

from pipelines.demo import ArchiveShape, write_archive
from planning.config import parse_config
from planning.plan import make_plan
from planning.reads import slabs
from schemas import load_schema

from helpers import (
    assert_matches_source,
    build_quietly,
    expected_feature,
    load_virtual_dataset,
    read_all_records,
    refused,
)


def selected_source(source: xr.Dataset, schema) -> xr.Dataset:
    """The source with schema.json's recorded selection applied: what index/* counts on."""
    taken = {
        dim: np.concatenate([np.arange(a, b) for a, b in entry["source_index_runs"]])
        for dim, entry in schema.sample.get("selection", {}).items()
    }
    return source.isel(taken)


def check_records(output: Path, source: xr.Dataset) -> dict[str, np.ndarray]:
    """Each record equals the ``.sel`` of its coordinates, and the slice of the selected grid its indices name."""
    schema = load_schema(str(output))
    records = read_all_records(output, schema)
    on_grid = selected_source(source, schema)
    kept = {dim: values for dim, values in schema.coords.items()}
    for i in range(len(records[schema.features[0].name])):
        record = {name: values[i] for name, values in records.items()}
        at = {}
        for feature in schema.features:
            if feature.role == "coord":
                dim = feature.source["dim"]
                value = record[feature.name]
                at[dim] = value.astype("datetime64[s]") if source[dim].dtype.kind == "M" else value
        at.update({dim: values for dim, values in kept.items()})
        for feature in schema.variable_features:
            variable = source[feature.name]
            want = variable.sel({d: v for d, v in at.items() if d in variable.dims}).transpose(*feature.dims)
            np.testing.assert_array_equal(record[feature.name], want.values.astype(feature.dtype))
            np.testing.assert_array_equal(record[feature.name], expected_feature(on_grid, schema, feature.name, record))
    return records


@pytest.fixture(scope="module")
def era5(tmp_path_factory) -> Path:
    """A synthetic ERA5-like archive (lat 90 to -90, lon 0 to 345 every 15) with an invariants file."""
    directory = tmp_path_factory.mktemp("era5")
    write_archive(directory, ArchiveShape(num_files=3, steps_per_file=3, levels=4, lat=20, lon=24), invariants=True)
    return directory


def era5_config(era5: Path, output: Path, select: dict, **sample) -> dict:
    return {
        "input": {"paths": [str(era5 / "*.nc")]},
        "variables": ["t", "u", "orography"],
        "select": select,
        "sample": sample or {"window": {"lat": 3, "lon": {"size": 3, "stride": 1}}, "keep": ["level"]},
        "output": {"path": str(output), "num_shards": 2},
    }


def test_levels_and_a_box_across_the_seam_with_a_static_field(era5, tmp_path):
    source = load_virtual_dataset(sorted(era5.glob("era5_*.nc")), "time")
    source = xr.merge([source, xr.open_dataset(era5 / "invariants.nc").load()])
    levels = source["level"].values[[0, 2, 3]].tolist()
    select = {"level": levels, "lat": {"min": -50, "max": 50}, "lon": {"min": 300, "max": 60}}
    output = build_quietly(era5_config(era5, tmp_path / "o", select), tmp_path)
    schema = load_schema(str(output))
    records = check_records(output, source)
    # Independently of the code under test: which latitudes and longitudes the box holds.
    lats = int(((source["lat"] >= -50) & (source["lat"] <= 50)).sum())
    lons = int(((source["lon"] >= 300) | (source["lon"] <= 60)).sum())
    assert (lats, lons) == (10, 9)
    assert len(records["t"]) == source.sizes["time"] * (lats // 3) * (lons - 2)  # lat windows do not overlap
    assert schema.coords["level"] == levels and records["t"].shape[1] == 3
    # Windows run on across the seam: 345 is followed by 0.
    steps = np.diff(records["coord/lon"].astype(np.float64), axis=1) % 360
    assert np.all(steps == 15) and ((records["coord/lon"][:, 0] == 330) & (records["coord/lon"][:, 2] == 0)).any()
    assert schema.sample["selection"]["lon"]["source_index_runs"] == [[20, 24], [0, 5]]
    assert_matches_source(output)


def test_nothing_outside_the_selection_is_read(era5, tmp_path, monkeypatch):
    select = {"level": [1000, 50], "lat": {"min": -50, "max": 50}, "lon": {"min": 300, "max": 60}}
    config = parse_config(era5_config(era5, tmp_path / "o", select))
    plan = make_plan(config, unit_budget_bytes=2e4)
    assert len(plan.units) > 3
    with xr.open_dataset(sorted(era5.glob("era5_*.nc"))[0]) as ds:
        inside = {
            "level": set(np.flatnonzero(np.isin(ds["level"], [1000, 50]))),
            "lat": set(np.flatnonzero((ds["lat"] >= -50) & (ds["lat"] <= 50))),
            "lon": set(np.flatnonzero((ds["lon"] >= 300) | (ds["lon"] <= 60))),
        }
    boxes = []
    original = slabs.read_slabs

    def spy(files, concat_dim, variables, box):
        boxes.append({d: box[d] for v in variables for d in v.dims})
        return original(files, concat_dim, variables, box)

    monkeypatch.setattr(slabs, "read_slabs", spy)
    for unit in plan.units:
        box = plan.grid.source_box(unit)
        read = slabs.read_selected(plan.sources, "time", plan.variables, box, plan.selection)
        assert read.values["t"].shape == tuple(box[d][1] - box[d][0] for d in ("time", "level", "lat", "lon"))
    assert boxes
    for box in boxes:
        for dim, indices in inside.items():
            if dim in box:
                assert set(range(*box[dim])) <= indices, (dim, box[dim])


def test_a_seam_crossing_range_on_era_interim(sample_file, tmp_path):
    """ERA-Interim: longitudes -180 to 179.25, latitudes 90 to -90 (decreasing), packed int16."""
    path = sample_file("eraint_uvz.nc")
    config = {
        "input": {"paths": str(path), "concat_dim": "month"},
        "select": {"longitude": {"min": 170, "max": -170}, "latitude": {"min": 30, "max": 60}, "level": [850, 200]},
        "sample": {"window": {"latitude": 4, "longitude": {"size": 6, "stride": 2}}, "keep": ["level"]},
        "output": {"path": str(tmp_path / "o")},
    }
    output = build_quietly(config, tmp_path)
    records = check_records(output, load_virtual_dataset([path], "month"))
    longitudes = records["coord/longitude"].astype(np.float64)
    assert np.all(np.diff(longitudes, axis=1) % 360 == 0.75)
    assert ((longitudes.max(axis=1) > 0) & (longitudes.min(axis=1) < 0)).any()  # a window across the seam
    assert records["coord/latitude"].max() <= 60 and records["coord/latitude"].min() >= 30
    assert load_schema(str(output)).coords["level"] == [200, 850]  # the files' order
    assert_matches_source(output, 100)  # packed int16, decreasing latitudes, -180 to 180


def test_a_time_range_reads_only_its_files_and_negative_bounds_mean_the_same(sample_file, tmp_path):
    """CESM (0 to 357 longitudes, latitudes increasing) split into four files; 1920-1949 lies in two."""
    from helpers import split_along_time

    trefht = sample_file("TREFHT.B06.57.atm.1890-1999ANN.nc")
    parts = tmp_path / "parts"
    parts.mkdir()
    paths = split_along_time(trefht, parts, 4)

    def config(lon: dict, output: str) -> dict:
        return {
            "input": {"paths": str(parts / "*.nc")},
            "select": {"time": {"min": 1920, "max": "1949"}, "lon": lon, "lat": {"min": -40}},
            "sample": {"window": {"lat": 8, "lon": {"size": 3, "stride": 3}}},
            "output": {"path": str(tmp_path / output), "num_shards": 2},
        }

    output = build_quietly(config({"min": 350, "max": 10}, "east"), tmp_path, "a.yaml")
    negative = build_quietly(config({"min": -10, "max": 10}, "negative"), tmp_path, "b.yaml")
    source = load_virtual_dataset([trefht], "time")
    records = check_records(output, source)
    years = source["time"].dt.year
    steps = int(((years >= 1920) & (years <= 1949)).sum())
    lats, lons = int((source["lat"] >= -40).sum()), int(((source["lon"] >= 350) | (source["lon"] <= 10)).sum())
    assert len(records["TREFHT"]) == steps * (lats // 8) * (lons // 3) > 0
    touched = []
    for part in paths:
        with xr.open_dataset(part) as ds:
            if ((ds["time"].dt.year >= 1920) & (ds["time"].dt.year <= 1949)).any():
                touched.append(part)
    assert load_schema(str(output)).sources["files"] == len(touched) == 2
    # -10 is 350: the same selection, so the same records.
    again = read_all_records(negative, load_schema(str(negative)))
    assert set(again) == set(records)
    for name, values in records.items():
        np.testing.assert_array_equal(again[name], values)
    assert_matches_source(output, 100)  # a time range of the four files, across the seam


def test_offsets_are_steps_from_the_samples_index(sample_file, tmp_path, capsys):
    trefht = sample_file("TREFHT.B06.57.atm.1890-1999ANN.nc")
    config = {
        "input": {"paths": str(trefht)},
        "select": {"time": {"max": "1899"}, "lat": {"min": 80}, "lon": {"max": 10}},
        "sample": {"offsets": {"time": [-1, 0]}},
        "output": {"path": str(tmp_path / "o")},
    }
    output = build_quietly(config, tmp_path)
    source = load_virtual_dataset([trefht], "time")
    records = check_records(output, source)
    # index/time names the step at offset 0; the pair is that step and the one before.
    on_grid = selected_source(source, load_schema(str(output)))
    first = on_grid["time"].values[records["index/time"]].astype("datetime64[s]").astype(np.int64)
    np.testing.assert_array_equal(records["coord/time"][:, 1], first)
    assert sorted(set(records["index/time"].tolist())) == list(range(1, 10))
    config["sample"]["offsets"] = {"lev": [14, 16]}
    config["output"]["path"] = str(tmp_path / "levels")
    message = refused(config, tmp_path, capsys)
    assert "sample.offsets: lev: offsets [14, 16] do not include 0" in message and "select: {lev: [values]}" in message


@pytest.mark.parametrize(
    ("select", "expected"),
    [
        ({"level": [1000, 925]}, "select.level: 925 is not a level value of the input; the nearest are"),
        ({"lat": {"min": 91, "max": 95}}, "select.lat: {min: 91, max: 95} holds no lat value of the input"),
        ({"lat": {"min": 50, "max": -50}}, "select.lat: min 50 is above max -50"),
        ({"time": {"min": "2030"}}, "select.time: {min: 2030} holds no time value of the input"),
        ({"time": ["2020-01-01T07"]}, "select.time: '2020-01-01T07' matches no time step"),
        ({"height": [1]}, "select.height: no selected variable has a dim 'height'"),
        ({"lat": {"min": 0, "max": 10}}, "sample.window.lat.size: 3 is larger than dim 'lat' (1, as selected)"),
    ],
)
def test_a_bad_selection_is_one_line(era5, tmp_path, capsys, select, expected):
    message = refused(era5_config(era5, tmp_path / "o", select), tmp_path, capsys)
    assert expected in message, message


def cesm_like(path: Path, start: str, lev: np.ndarray) -> Path:
    """A small CESM-like file: T on hybrid levels (float64 hPa)."""
    time = np.array([np.datetime64(start) + np.timedelta64(i, "D") for i in range(3)])
    rng = np.random.default_rng(len(str(path)))
    data = rng.normal(250, 10, (3, len(lev), 4, 5)).astype("f4")
    coords = {"time": time, "lev": ("lev", lev, {"units": "hPa"}), "lat": np.arange(4.0), "lon": np.arange(5.0)}
    xr.Dataset({"T": (("time", "lev", "lat", "lon"), data)}, coords=coords).to_netcdf(path)
    return path


LEV = np.array([3.64346569404006, 7.59481964632869, 14.3566322512925, 992.55615234375, 24.6122023836127])


def test_files_join_when_their_grids_agree_within_the_tolerance(tmp_path, capsys):
    inputs = tmp_path / "in"
    inputs.mkdir()
    cesm_like(inputs / "a.nc", "2000-01-01", LEV)
    # As a file that stored lev as float32 has it, one level computed a float32 step (6.1e-05 hPa) away.
    rounded = LEV.astype(np.float32)
    rounded[3] = np.nextafter(rounded[3], np.float32(np.inf))
    cesm_like(inputs / "b.nc", "2000-01-04", rounded.astype(np.float64))
    config = {
        "input": {"paths": str(inputs / "*.nc")},
        "sample": {"window": {"lat": 2, "lon": 5}, "keep": ["lev"]},
        "output": {"path": str(tmp_path / "o")},
    }
    output = build_quietly(config, tmp_path)
    assert load_schema(str(output)).coords["lev"] == LEV.tolist()  # the first file's values
    # Both files' values, each file's on its own lev (joined by position, as the build did).
    source = xr.concat([xr.open_dataset(p).load() for p in sorted(inputs.glob("*.nc"))], "time", join="override")
    records = read_all_records(output, load_schema(str(output)))
    assert len(records["T"]) == 6 * 2
    for i in range(len(records["T"])):
        when = records["coord/time"][i].astype("datetime64[s]")
        np.testing.assert_array_equal(records["T"][i], source["T"].sel(time=when, lat=records["coord/lat"][i]).values)
    assert_matches_source(output)  # the kept lev: the first file's, as the records carry it
    # Exact: the float32 rounding is refused, with the numbers and the key to change.
    config["input"]["coord_tolerance"] = 0
    config["output"]["path"] = str(tmp_path / "exact")
    message = refused(config, tmp_path, capsys)
    assert f"b.nc: 'lev' differs from {inputs / 'a.nc'} by up to 6.1e-05 (at index 3: 992.5562" in message
    assert "input.coord_tolerance (now 0): raise it or regrid" in message
    # A real difference is refused by default, and joins within a tolerance large enough.
    moved = LEV.copy()
    moved[1] += 0.01
    cesm_like(inputs / "b.nc", "2000-01-04", moved)
    del config["input"]["coord_tolerance"]
    message = refused(config, tmp_path, capsys)
    assert message.startswith(f"error: {inputs / 'b.nc'}: ")
    assert "'lev' differs from" in message and "by up to 0.01 (at index 1: " in message
    assert "within input.coord_tolerance (now float32: 1.2e-07 times the value, 9.1e-07 there)" in message
    config["input"]["coord_tolerance"] = 0.02
    config["output"]["path"] = str(tmp_path / "tolerant")
    assert load_schema(str(build_quietly(config, tmp_path))).coords["lev"] == LEV.tolist()
