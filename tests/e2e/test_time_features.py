"""sample.time_features: year and day progress of every step, per longitude, in any calendar.

Expected values are computed here from the times xarray decodes (cftime dates for the real CCSM
file's noleap calendar, numpy datetimes for the demo archive's standard one), independently of
planning.positions (helpers.expected_progress: GraphCast's formula in the Gregorian calendars, the
day of year over the year's own days elsewhere), and compared with what TensorFlow's parser reads back.
"""

from __future__ import annotations

from pathlib import Path

import cftime
import numpy as np
import pandas as pd
import pytest
import xarray as xr

from schemas import load_schema

from helpers import (
    assert_matches_source,
    build_quietly,
    expected_progress,
    parse_with_generated_parser,
    read_all_records,
    refused,
)

TREFHT = "TREFHT.B06.57.atm.1890-1999ANN.nc"


def _seconds(times: np.ndarray) -> np.ndarray:
    """Seconds since 1970-01-01 in the times' own calendar."""
    if times.dtype.kind == "M":
        return (times - np.datetime64("1970-01-01")) / np.timedelta64(1, "s")
    return np.asarray(cftime.date2num(list(times), "seconds since 1970-01-01", calendar=times[0].calendar))


def _expected(dates: np.ndarray, lon: np.ndarray | None) -> dict[str, np.ndarray]:
    year, day = expected_progress(dates)
    if lon is not None:
        day = np.mod(np.reshape(day, (*np.shape(day), *([1] * np.ndim(lon)))) + np.asarray(lon) / 360.0, 1.0)
    out = {}
    for name, progress in (("year_progress", year), ("day_progress", day)):
        out[f"time_features/{name}_sin"] = np.sin(2 * np.pi * progress)
        out[f"time_features/{name}_cos"] = np.cos(2 * np.pi * progress)
    return out


def _check(records: dict, times: np.ndarray, lon_of) -> None:
    count = len(records["index/time"])
    assert count > 0
    for i in range(count):
        record = {name: values[i] for name, values in records.items()}
        steps = times[np.atleast_1d(record["index/time"]) + np.arange(np.size(record["coord/time"]))]
        expected = _expected(steps.reshape(np.shape(record["coord/time"])), lon_of(record))
        assert any(name in records for name in expected)
        for name, values in ((n, v) for n, v in expected.items() if n in records):
            np.testing.assert_allclose(record[name], values, atol=1e-6, err_msg=name)


def test_noleap_windows_of_steps_and_longitudes(sample_file, tmp_path):
    path = sample_file(TREFHT)  # CCSM counts in noleap but states no calendar: input.calendar says it
    config = {
        "input": {"paths": str(path), "calendar": "noleap"},
        "sample": {"window": {"time": 2, "lat": 32, "lon": 32}, "time_features": ["year_progress", "day_progress"]},
        "output": {"path": str(tmp_path / "out")},
    }
    output = build_quietly(config, tmp_path)
    schema = load_schema(str(output))
    assert schema.feature("time_features/day_progress_sin").dims == ("time", "lon")
    assert schema.feature("time_features/year_progress_cos").shape == (2,)
    with xr.open_dataset(path, decode_times=False) as ds:
        ds["time"].attrs["calendar"] = "noleap"
        times, lon = xr.decode_cf(ds)["time"].values, ds["lon"].values
    assert times[0].calendar == "noleap"
    records = parse_with_generated_parser(output)  # TensorFlow's own parser
    _check(records, times, lambda record: lon[record["index/lon"] + np.arange(32)])
    assert_matches_source(output, 100)  # input.calendar too


def test_standard_calendar_offsets_with_longitudes_kept_across_the_seam(tmp_path):
    from pipelines.demo import ArchiveShape, write_archive

    write_archive(tmp_path / "era5", ArchiveShape(num_files=2, steps_per_file=6, levels=2, lat=8, lon=16))
    config = {
        "input": {"paths": str(tmp_path / "era5" / "*.nc")},
        "variables": ["t"],
        "select": {"lon": {"min": 200, "max": 90}},
        "sample": {
            "offsets": {"time": [-1, 0]},
            "keep": ["lon", "level"],
            "window": {"lat": 4},
            "time_features": ["day_progress", "year_progress"],
        },
        "output": {"path": str(tmp_path / "out")},
    }
    output = build_quietly(config, tmp_path)
    with xr.open_mfdataset(str(tmp_path / "era5" / "*.nc")) as ds:
        times, lon = ds["time"].values, ds["lon"].values
    assert times.dtype.kind == "M" and len(np.unique(np.mod(_seconds(times), 86400))) == 4  # 6-hourly: 4 hours
    selected = np.concatenate([lon[lon >= 200], lon[lon <= 90]])
    records = read_all_records(output, load_schema(str(output)))
    assert records["time_features/day_progress_sin"].shape[1:] == (2, len(selected))
    records["index/time"] = records["index/time"] - 1  # offsets [-1, 0]: the index names the second step
    _check(records, times, lambda record: selected)
    assert_matches_source(output)


def test_iterated_steps_and_longitudes_one_per_sample(sample_file, tmp_path):
    path = sample_file(TREFHT)
    config = {
        "input": {"paths": str(path)},
        "sample": {"window": {"lat": 64}, "time_features": ["day_progress"]},  # lon iterated: one per sample
        "output": {"path": str(tmp_path / "out")},
    }
    output = build_quietly(config, tmp_path)
    schema = load_schema(str(output))
    assert [f.name for f in schema.features if f.role == "time_feature"] == [
        "time_features/day_progress_sin",
        "time_features/day_progress_cos",
    ]
    assert schema.feature("time_features/day_progress_sin").shape == ()
    assert schema.feature("time_features/day_progress_sin").source["longitude"] == "lon"
    with xr.open_dataset(path) as ds:
        times, lon = ds["time"].values, ds["lon"].values
    records = read_all_records(output, schema)
    assert len(np.unique(records["time_features/day_progress_sin"][records["index/time"] == 0])) > 100  # not UTC
    _check({k: v[::97] for k, v in records.items()}, times, lambda record: lon[record["index/lon"]])


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"input": {"decode_times": False}}, "sample.time_features: 'time' does not hold decoded times"),
        ({"sample": {"keep": ["time"], "time_features": ["year_progress"]}}, "the samples keep 'time' whole"),
        ({"sample": {"time_features": ["hour_progress"]}}, "sample.time_features"),
        ({"sample": {"time_features": ["day_progress", "day_progress"]}}, "lists a feature twice"),
        ({"sample": {"time_features": ["cos_zenith"]}}, "cos_zenith is per cell, so the sample must hold a range"),
    ],
)
def test_time_features_refused_where_they_mean_nothing(sample_file, tmp_path, capsys, change, expected):
    config = {
        "input": {"paths": str(sample_file(TREFHT)), **change.get("input", {})},
        "sample": {"window": {"lat": 64}, "time_features": ["year_progress"], **change.get("sample", {})},
        "output": {"path": str(tmp_path / "out")},
    }
    assert expected in refused(config, tmp_path, capsys)


def _spencer_cos_zenith(dates: np.ndarray, lat: np.ndarray, lon: np.ndarray) -> np.ndarray:
    """cos of the solar zenith angle (steps, lat, lon), float64: NOAA's declination and equation of time (Spencer's
    series) at the year-progress angle, written here as sums of harmonics."""
    year, day = expected_progress(dates)
    day_angle = 2 * np.pi * year[:, None, None]
    n = np.arange(4)
    cos_terms = np.cos(n[:, None, None, None] * day_angle)
    sin_terms = np.sin(n[:, None, None, None] * day_angle)
    declination = np.tensordot([0.006918, -0.399912, -0.006758, -0.002697], cos_terms, 1) + np.tensordot(
        [0.0, 0.070257, 0.000907, 0.00148], sin_terms, 1
    )
    eot = 229.18 * (0.000075 + 0.001868 * cos_terms[1] - 0.032077 * sin_terms[1])
    eot = eot + 229.18 * (-0.014615 * cos_terms[2] - 0.040849 * sin_terms[2])  # minutes
    true_solar_minutes = day[:, None, None] * 1440 + 4 * lon[None, None, :] + eot
    hour_angle = np.radians(true_solar_minutes / 4 - 180)
    phi = np.radians(lat)[None, :, None]
    return np.sin(phi) * np.sin(declination) + np.cos(phi) * np.cos(declination) * np.cos(hour_angle)


def _noaa_cos_zenith(times: np.ndarray, lat: np.ndarray, lon: np.ndarray) -> np.ndarray:
    """The same from NOAA's day-of-year form (fractional year from January 1st): a physical check, not the formula."""
    stamps = pd.DatetimeIndex(times)
    hours = stamps.hour + stamps.minute / 60
    gamma = (2 * np.pi / 365 * (stamps.dayofyear - 1 + (hours - 12) / 24)).values[:, None, None]
    declination = (
        0.006918
        - 0.399912 * np.cos(gamma)
        + 0.070257 * np.sin(gamma)
        - 0.006758 * np.cos(2 * gamma)
        + 0.000907 * np.sin(2 * gamma)
        - 0.002697 * np.cos(3 * gamma)
        + 0.00148 * np.sin(3 * gamma)
    )
    eot = 229.18 * (
        0.000075 + 0.001868 * np.cos(gamma) - 0.032077 * np.sin(gamma) - 0.014615 * np.cos(2 * gamma)
    ) - 229.18 * 0.040849 * np.sin(2 * gamma)
    minutes = (hours.values * 60)[:, None, None] + eot + 4 * lon[None, None, :]
    phi = np.radians(lat)[None, :, None]
    return np.sin(phi) * np.sin(declination) + np.cos(phi) * np.cos(declination) * np.cos(np.radians(minutes / 4 - 180))


def test_cos_zenith_per_cell_and_step(tmp_path):
    from pipelines.demo import ArchiveShape, write_archive

    write_archive(tmp_path / "era5", ArchiveShape(num_files=2, steps_per_file=6, levels=2, lat=8, lon=16))
    config = {
        "input": {"paths": str(tmp_path / "era5" / "*.nc")},
        "variables": ["t"],
        "sample": {
            "offsets": {"time": [0, 1]},
            "window": {"lat": 4, "lon": 8},
            "keep": ["level"],
            "time_features": ["cos_zenith"],
        },
        "output": {"path": str(tmp_path / "out")},
    }
    output = build_quietly(config, tmp_path)
    schema = load_schema(str(output))
    assert schema.feature("time_features/cos_zenith").dims == ("time", "lat", "lon")
    assert schema.feature("time_features/cos_zenith").shape == (2, 4, 8)
    with xr.open_mfdataset(str(tmp_path / "era5" / "*.nc")) as ds:
        times, lat, lon = ds["time"].values, ds["lat"].values.astype(np.float64), ds["lon"].values.astype(np.float64)
    records = parse_with_generated_parser(output)  # TensorFlow's own parser
    values = records["time_features/cos_zenith"]
    assert values.dtype == np.float32 and (values < 0).any() and (values > 0.5).any()  # night and day
    for i in range(0, len(values), 5):
        t, y, x = (int(records[f"index/{d}"][i]) for d in ("time", "lat", "lon"))
        steps, cells_lat, cells_lon = times[t : t + 2], lat[y : y + 4], lon[x : x + 8]
        want = _spencer_cos_zenith(steps, cells_lat, cells_lon)
        np.testing.assert_allclose(values[i], want, atol=1e-6)
        np.testing.assert_allclose(values[i], _noaa_cos_zenith(steps, cells_lat, cells_lon), atol=0.01)
    assert_matches_source(output, 100)


#: Every calendar CF lists; the dates exist in each (no 29 February, no 31st) and lie far from 1970 on both sides,
#: where a year of the wrong length drifts by weeks. Before 1582 the standard calendar is cftime's, mixed.
CF_CALENDARS = ["standard", "gregorian", "proleptic_gregorian", "noleap", "365_day", "all_leap", "366_day"]
CF_CALENDARS += ["360_day", "julian"]
DATES = [(1500, 6, 1, 0), (1850, 2, 28, 18), (1850, 12, 16, 6), (1891, 12, 16, 6), (1969, 12, 30, 12)]
DATES += [(1970, 1, 1, 6), (1990, 7, 1, 12), (2000, 2, 28, 18), (2000, 12, 30, 21), (2100, 3, 1, 0)]
DATES += [(2100, 12, 30, 18), (2101, 1, 1, 0), (2300, 9, 30, 3)]
#: 16 December at 06:00 as a fraction of the year: 11 months of 30 days before it, or 334 days of noleap's months.
DECEMBER_16 = {"360_day": (330 + 15.25) / 360, "noleap": (334 + 15.25) / 365}


@pytest.fixture(scope="module", params=CF_CALENDARS)
def calendar_file(request, tmp_path_factory):
    """A small file whose times count in ``calendar``, from dates given in it."""
    calendar = request.param
    tmp = tmp_path_factory.mktemp(calendar)
    dates = [cftime.datetime(*d, calendar=calendar) for d in DATES]
    hours = cftime.date2num(dates, "hours since 1500-01-01", calendar=calendar)
    lat, lon = np.array([-60.0, 10.0, 70.0]), np.array([0.0, 95.0, 200.0, 330.0])
    data = np.random.default_rng(0).normal(size=(len(DATES), len(lat), len(lon))).astype(np.float32)
    ds = xr.Dataset(
        {"t": (("time", "lat", "lon"), data)},
        coords={
            "time": ("time", hours, {"units": "hours since 1500-01-01", "calendar": calendar}),
            "lat": ("lat", lat, {"units": "degrees_north"}),
            "lon": ("lon", lon, {"units": "degrees_east"}),
        },
    )
    path = tmp / f"{calendar}.nc"
    ds.to_netcdf(path)
    return calendar, path, tmp


def test_every_cf_calendar_against_cftime(calendar_file):
    calendar, path, tmp = calendar_file
    config = {
        "input": {"paths": str(path)},
        "sample": {"keep": ["lat", "lon"], "time_features": ["year_progress", "day_progress", "cos_zenith"]},
        "output": {"path": str(tmp / "out")},
    }
    output = build_quietly(config, tmp)
    assert_matches_source(output, 100)  # the build's values, recomputed from plain xarray, in every calendar
    schema = load_schema(str(output))
    source = schema.feature("time_features/year_progress_sin").source
    gregorian = calendar in ("standard", "gregorian", "proleptic_gregorian")
    assert source["calendar"] and ("365.24219" in source["formula"]) == gregorian, source
    with xr.open_dataset(path, decode_times=xr.coders.CFDatetimeCoder(use_cftime=True)) as ds:
        times, lat, lon = ds["time"].values, ds["lat"].values, ds["lon"].values
    assert [(d.year, d.month, d.day, d.hour) for d in times] == DATES
    records = parse_with_generated_parser(output)  # TensorFlow's own parser
    assert sorted(records["index/time"].tolist()) == list(range(len(DATES)))
    for i in range(len(DATES)):
        record = {name: values[i] for name, values in records.items()}
        step = times[int(record["index/time"])]
        for name, values in _expected(np.asarray([step]), lon).items():
            np.testing.assert_allclose(record[name], values[0], atol=1e-6, err_msg=f"{name} at {step}")
        want = _spencer_cos_zenith(np.asarray([step]), lat, lon)[0]
        np.testing.assert_allclose(record["time_features/cos_zenith"], want, atol=1e-6, err_msg=str(step))
    if calendar in DECEMBER_16:  # the finding: 0.23, 0.07, 0.92, ... year after year in 360_day; one place now
        order = np.argsort(records["index/time"])
        sin, cos = (records[f"time_features/year_progress_{f}"][order] for f in ("sin", "cos"))
        progress = np.mod(np.arctan2(sin, cos) / (2 * np.pi), 1.0)[[2, 3]]  # 1850-12-16 and 1891-12-16, 06:00
        np.testing.assert_allclose(progress, DECEMBER_16[calendar], atol=1e-6)


def _write_grid(path: Path, lon: dict | None, steps: int = 5) -> Path:
    """``t(time, y, x)`` at 5-hourly steps (every hour of the day a different one), with the given longitude."""
    ny, nx = 4, 5
    coords = {"time": pd.date_range("2001-03-01T01:00", periods=steps, freq="5h")}
    if lon is not None:
        coords.update(lon)
    data = np.random.default_rng(1).normal(size=(steps, ny, nx)).astype(np.float32)
    ds = xr.Dataset({"t": (("time", "y", "x"), data)}, coords)
    if path.suffix == ".zarr":
        ds.to_zarr(path, zarr_format=2, consolidated=True)
    else:
        ds.to_netcdf(path)
    return path


def _curved_lon() -> np.ndarray:
    """A curvilinear grid's longitudes (an ORCA-like fold): they vary along both y and x, across the seam."""
    j, i = np.meshgrid(np.arange(4), np.arange(5), indexing="ij")
    return (340 + 9.5 * i - 3.0 * j + 0.7 * i * j) % 360


@pytest.mark.parametrize(
    ("sample", "cell_dims", "name"),
    [
        ({"window": {"y": 3, "x": 2}}, ("y", "x"), "orca.nc"),
        ({"window": {"x": 4}}, ("x",), "orca.nc"),  # with y iterated: per x
        ({"window": {"y": 3, "x": 2}}, ("y", "x"), "orca.zarr"),  # a store's coordinate, read through zarr
        ({"window": {"y": 3, "x": 2}}, ("y", "x"), "grid.nc"),  # a plain variable of a grid file, under coords:
    ],
)
def test_day_progress_per_cell_of_a_curvilinear_grid(tmp_path, sample, cell_dims, name):
    lon = _curved_lon()
    attrs = {"units": "degrees_east", "standard_name": "longitude"}
    longitude = {"nav_lon": (("y", "x"), lon, attrs)}
    path = _write_grid(tmp_path / name.replace("grid", "data"), None if name == "grid.nc" else longitude)
    config = {
        "input": {"paths": str(path)},
        "sample": {**sample, "time_features": ["day_progress"]},
        "output": {"path": str(tmp_path / "out")},
    }
    if name == "grid.nc":  # NEMO's mesh file: nav_lon a variable there, not a coordinate
        xr.Dataset(longitude).to_netcdf(tmp_path / name)
        config["input"]["paths"] = [str(path), str(tmp_path / name)]
        config["coords"] = ["nav_lon"]
    output = build_quietly(config, tmp_path)
    schema = load_schema(str(output))
    feature = schema.feature("time_features/day_progress_cos")
    assert feature.dims == cell_dims and feature.source["longitude"] == "nav_lon"
    times = pd.date_range("2001-03-01T01:00", periods=5, freq="5h").values  # (as written)
    records = parse_with_generated_parser(output)  # TensorFlow's own parser
    size = {d: sample["window"].get(d, 1) for d in ("y", "x")}
    for i in range(len(records["index/time"])):
        y, x = int(records["index/y"][i]), int(records["index/x"][i])
        cells = lon[y : y + size["y"], x : x + size["x"]].reshape(feature.shape)
        expected = _expected(np.asarray(times[int(records["index/time"][i])]), cells)
        for name in ("time_features/day_progress_sin", "time_features/day_progress_cos"):
            np.testing.assert_allclose(records[name][i], expected[name], atol=1e-6, err_msg=name)


def test_day_progress_at_a_station_s_scalar_longitude(tmp_path):
    path = tmp_path / "station.nc"
    times = pd.date_range("1999-12-31T18:00", periods=6, freq="7h")
    station = {"lon": ((), 116.4, {"units": "degrees_east"}), "lat": ((), 39.9, {"units": "degrees_north"})}
    xr.Dataset({"t": ("time", np.arange(6.0, dtype=np.float32))}, {"time": times, **station}).to_netcdf(path)
    config = {
        "input": {"paths": str(path)},
        "sample": {"offsets": {"time": [0, 1]}, "time_features": ["day_progress", "year_progress"]},
        "output": {"path": str(tmp_path / "out")},
    }
    output = build_quietly(config, tmp_path)
    schema = load_schema(str(output))
    assert schema.feature("time_features/day_progress_sin").shape == (2,)
    records = read_all_records(output, schema)
    _check(records, times.values, lambda record: 116.4)
    utc = np.sin(2 * np.pi * np.mod(np.asarray(times[:2].hour) / 24, 1.0))
    assert not np.allclose(records["time_features/day_progress_sin"][records["index/time"] == 0][0], utc, atol=0.1)


@pytest.mark.parametrize(
    ("lon", "expected"),
    [
        (None, "day_progress is local solar time, but the samples hold no longitude"),
        ({"lon": ((), "east", {})}, "day_progress is local solar time, but the samples hold no longitude"),
        (
            {"lon": (("y", "x"), np.where(_curved_lon() > 350, np.nan, _curved_lon()), {"units": "degrees_east"})},
            "longitude 'lon' has 4 missing value(s)",
        ),
    ],
)
def test_day_progress_without_a_longitude_is_refused_not_utc(tmp_path, capsys, lon, expected):
    path = _write_grid(tmp_path / "grid.nc", lon)
    config = {
        "input": {"paths": str(path)},
        "sample": {"window": {"y": 2, "x": 2}, "time_features": ["day_progress"]},
        "output": {"path": str(tmp_path / "out")},
    }
    assert expected in refused(config, tmp_path, capsys)
    config["sample"]["time_features"] = ["year_progress"]  # needs no longitude
    build_quietly(config, tmp_path)


def test_day_progress_at_a_selected_longitude(tmp_path):
    lon = np.array([0.0, 95.0, 200.0, 330.0])
    times = pd.date_range("2001-03-01T01:00", periods=5, freq="5h")
    data = np.random.default_rng(2).normal(size=(5, 2, 4)).astype(np.float32)
    coords = {"time": times, "lat": [10.0, 20.0], "lon": ("lon", lon, {"units": "degrees_east"})}
    xr.Dataset({"t": (("time", "lat", "lon"), data)}, coords).to_netcdf(tmp_path / "grid.nc")
    config = {
        "input": {"paths": str(tmp_path / "grid.nc")},
        "select": {"lon": [200.0]},  # one longitude: the samples hold it, not a range
        "sample": {"keep": ["lat"], "time_features": ["day_progress"]},
        "output": {"path": str(tmp_path / "out")},
    }
    output = build_quietly(config, tmp_path)
    schema = load_schema(str(output))
    assert schema.feature("time_features/day_progress_sin").shape == ()
    records = read_all_records(output, schema)
    assert len(records["index/time"]) == 5
    _check(records, times.values, lambda record: 200.0)
