"""sample.time_features: GraphCast's year and day progress of every step, per longitude, in any calendar.

Expected values are computed here from the times xarray decodes (cftime dates for the real CCSM
file's noleap calendar, numpy datetimes for the demo archive's standard one) with the formulas
the issue states, independently of planning.time_features, and compared with what TensorFlow's
parser reads back.
"""

from __future__ import annotations

import cftime
import numpy as np
import pandas as pd
import pytest
import xarray as xr

from schemas import load_schema

from helpers import assert_matches_source, build_quietly, parse_with_generated_parser, read_all_records, refused

TREFHT = "TREFHT.B06.57.atm.1890-1999ANN.nc"


def _seconds(times: np.ndarray) -> np.ndarray:
    """Seconds since 1970-01-01 in the times' own calendar."""
    if times.dtype.kind == "M":
        return (times - np.datetime64("1970-01-01")) / np.timedelta64(1, "s")
    return np.asarray(cftime.date2num(list(times), "seconds since 1970-01-01", calendar=times[0].calendar))


def _expected(seconds: np.ndarray, lon: np.ndarray | None) -> dict[str, np.ndarray]:
    year = np.mod(seconds / (365.24219 * 86400), 1.0)
    day = np.mod(seconds, 86400) / 86400
    if lon is not None:
        day = np.mod(day[..., None] + lon / 360.0, 1.0)
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
        seconds = _seconds(steps).reshape(np.shape(record["coord/time"]))
        expected = _expected(seconds, lon_of(record))
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


def test_iterated_steps_and_no_longitude_window(sample_file, tmp_path):
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
    with xr.open_dataset(path) as ds:
        times = ds["time"].values
    records = read_all_records(output, schema)
    _check({k: v[::97] for k, v in records.items()}, times, lambda record: None)


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


def _spencer_cos_zenith(seconds: np.ndarray, lat: np.ndarray, lon: np.ndarray) -> np.ndarray:
    """cos of the solar zenith angle (steps, lat, lon), float64: NOAA's declination and equation of time (Spencer's
    series) at the tropical-year angle, written here as sums of harmonics."""
    day_angle = 2 * np.pi * np.mod(seconds / (365.24219 * 86400), 1.0)[:, None, None]
    n = np.arange(4)
    cos_terms = np.cos(n[:, None, None, None] * day_angle)
    sin_terms = np.sin(n[:, None, None, None] * day_angle)
    declination = np.tensordot([0.006918, -0.399912, -0.006758, -0.002697], cos_terms, 1) + np.tensordot(
        [0.0, 0.070257, 0.000907, 0.00148], sin_terms, 1
    )
    eot = 229.18 * (0.000075 + 0.001868 * cos_terms[1] - 0.032077 * sin_terms[1])
    eot = eot + 229.18 * (-0.014615 * cos_terms[2] - 0.040849 * sin_terms[2])  # minutes
    true_solar_minutes = np.mod(seconds, 86400)[:, None, None] / 60 + 4 * lon[None, None, :] + eot
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
        want = _spencer_cos_zenith(_seconds(steps), cells_lat, cells_lon)
        np.testing.assert_allclose(values[i], want, atol=1e-6)
        np.testing.assert_allclose(values[i], _noaa_cos_zenith(steps, cells_lat, cells_lon), atol=0.01)
    assert_matches_source(output, 100)
