"""End to end: model calendars (noleap, 360_day, ...) in splits, records, inspect and plots; time decoding control."""

from __future__ import annotations

import datetime
from pathlib import Path

import cftime
import numpy as np
import pytest
import xarray as xr
import yaml

from pipelines.build import main
from pipelines.inspect import main as inspect_main
from pipelines.plot_data import describe_sample
from schemas import load_schema

from helpers import assert_matches_source, expected_feature, read_all_records, split_along_time

TREFHT = "TREFHT.B06.57.atm.1890-1999ANN.nc"
EPOCH = "seconds since 1970-01-01"
CFTIME = xr.coders.CFDatetimeCoder(use_cftime=True)
#: 4 samples a time step: enough to check every record against its slice
SAMPLE = {"window": {"lat": 32, "lon": 64}}


def build(config: dict, tmp_path: Path) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    assert main(["--config", str(path), "--quiet"]) == 0
    return Path(config["output"]["path"])


def assert_fails(config: dict, tmp_path: Path, capsys, *expected: str) -> str:
    """The build is refused with exit 2 in one line holding every fragment, and writes no schema.json."""
    path = tmp_path / "refused.yaml"
    path.write_text(yaml.safe_dump(config))
    status = main(["--config", str(path), "--quiet"])
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert status == 2 and len(lines) == 1 and lines[0].startswith("error: "), lines
    for fragment in expected:
        assert fragment in lines[0], lines[0]
    assert not (Path(config["output"]["path"]) / "schema.json").exists()
    return lines[0]


def open_archive(paths, decode_times=CFTIME) -> xr.Dataset:
    """The files joined along time, times as cftime dates in the files' own calendar (the reference)."""
    datasets = []
    for path in paths:
        with xr.open_dataset(path, decode_times=decode_times) as ds:
            datasets.append(ds.load())
    return xr.concat(datasets, dim="time")


def check_split(output: Path, source: xr.Dataset, split: str, expected_steps: list[int], calendar: str) -> dict:
    """Every record of a split equals its slice of the source; it holds exactly the expected time steps."""
    schema = load_schema(str(output))
    records = read_all_records(output, schema, split)
    assert sorted(set(records["index/time"].tolist())) == expected_steps
    assert len(records["index/time"]) == 4 * len(expected_steps)
    times = source["time"].values
    for i in range(len(records["index/time"])):
        record = {name: values[i] for name, values in records.items()}
        np.testing.assert_array_equal(record["TREFHT"], expected_feature(source, schema, "TREFHT", record))
        # coord/time: seconds since 1970 counted in the file's own calendar
        assert cftime.num2date(int(record["coord/time"]), EPOCH, calendar) == times[int(record["index/time"])]
    return records


@pytest.fixture(scope="module")
def noleap(sample_file, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("noleap")
    paths = split_along_time(sample_file(TREFHT), tmp, 4, calendar="noleap")
    return tmp, paths, open_archive(paths)


def test_noleap_dates_split_at_year_month_and_minute_precision(noleap):
    tmp, paths, source = noleap
    splits = {
        "train": ["1890", "1949"],
        "valid": ["1950-08", "1969-07"],
        "test": ["1970-07-16T22:01", "1999-12-31T23:59"],
    }
    config = {
        "input": {"paths": paths},
        "variables": ["TREFHT"],
        "sample": SAMPLE,
        "splits": {name: {"time": bounds} for name, bounds in splits.items()},
        "output": {"path": str(tmp / "out")},
    }
    output = build(config, tmp)
    # The bounds as cftime dates, written out by hand: [start, end) at each bound's precision.
    date = cftime.DatetimeNoLeap
    expected = {
        "train": (date(1890, 1, 1), date(1950, 1, 1)),
        "valid": (date(1950, 8, 1), date(1969, 8, 1)),
        "test": (date(1970, 7, 16, 22, 1), date(2000, 1, 1)),
    }
    times = source["time"].values
    assert times[0].calendar == "noleap"
    for split, (start, end) in expected.items():
        steps = [i for i, t in enumerate(times) if start <= t < end]
        assert steps, split
        check_split(output, source, split, steps, "noleap")
    schema = load_schema(str(output))
    assert schema.sample["calendar"] == "noleap" and schema.feature("coord/time").source["calendar"] == "noleap"
    assert schema.sample["splits"]["valid"]["first"] == "1951-07-16T22:00:00"  # 1950's step is in July
    assert schema.counts["samples_outside_splits"] == 4 * 2  # 1950 and 1970 fall between the splits
    assert_matches_source(output, 100)  # noleap times, as seconds of their own calendar


def test_a_date_the_calendar_has_not_is_refused(noleap, capsys):
    tmp, paths, _ = noleap
    config = {
        "input": {"paths": paths},
        "sample": SAMPLE,
        "splits": {"train": {"time": ["1890", "1900-02-29"]}},
        "output": {"path": str(tmp / "refused")},
    }
    line = assert_fails(config, tmp, capsys, "splits.train.time: cannot read [1890, 1900-02-29] as time values")
    assert "calendar noleap" in line


@pytest.fixture(scope="module")
def day360(sample_file, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("day360")
    paths = split_along_time(sample_file(TREFHT), tmp, 3, formats=("NETCDF4", "NETCDF3_64BIT"), calendar="360_day")
    config = {
        "input": {"paths": str(tmp / "*.nc")},
        "sample": SAMPLE,
        # 1950-02-30 is a day of the 360_day calendar only
        "splits": {"train": {"time": [None, "1950-02-30"]}, "test": {"time": ["1950-03", None]}},
        "output": {"path": str(tmp / "out"), "num_shards": 2},
    }
    return build(config, tmp), open_archive(paths)


def test_360_day_records_and_coords(day360):
    output, source = day360
    times = source["time"].values
    assert times[0].calendar == "360_day"
    date = cftime.Datetime360Day
    check_split(output, source, "train", [i for i, t in enumerate(times) if t < date(1950, 3, 1)], "360_day")
    check_split(output, source, "test", [i for i, t in enumerate(times) if t >= date(1950, 3, 1)], "360_day")


def test_inspect_summary_shows_360_day_dates(day360, capsys):
    output, source = day360
    assert inspect_main([str(output)]) == 0
    summary = capsys.readouterr().out
    schema = load_schema(str(output))
    first, last = schema.sample["splits"]["test"]["index_range"]
    times = source["time"].values
    expected = f"split test: {times[first].isoformat()} to {times[last - 1].isoformat()} (360_day calendar)"
    assert expected in summary
    assert "time values the sample covers (360_day calendar)" in summary


def test_plot_titles_give_the_360_day_date(day360, tmp_path, capsys):
    output, source = day360
    schema = load_schema(str(output))
    records = read_all_records(output, schema, "train")
    times = source["time"].values
    for i in range(0, len(records["index/time"]), 7):
        record = {name: values[i] for name, values in records.items()}
        when = times[int(record["index/time"])].strftime("%Y-%m-%d %H:%M")
        assert describe_sample(schema, record).startswith(f"{when} (360_day calendar) · lat "), when
    png = tmp_path / "page.png"
    assert inspect_main([str(output), "--plot", str(png), "--map"]) == 0
    assert png.read_bytes().startswith(b"\x89PNG")


def test_a_time_series_axis_is_labelled_in_the_files_calendar():
    """A line plot's date ticks: matplotlib's date axis knows the Gregorian calendar only."""
    from matplotlib.figure import Figure

    from pipelines.plots import draw_line
    from schemas.schema import Feature, Schema

    dates = [cftime.Datetime360Day(2000, 2, day) for day in (27, 28, 29, 30)] + [cftime.Datetime360Day(2000, 3, 1)]
    seconds = np.asarray(cftime.date2num(dates, EPOCH, "360_day"), dtype=np.int64)
    time = {"dim": "time", "units": "seconds since 1970-01-01T00:00:00Z", "calendar": "360_day"}
    variable = Feature("x", "float32", (5,), ("time",), "variable", {"attrs": {"units": "K"}})
    schema = Schema(features=(variable, Feature("coord/time", "int64", (5,), ("time",), "coord", time)))
    ax = Figure().subplots()
    draw_line(ax, schema, variable, {"x": np.arange(5.0), "coord/time": seconds})
    ax.figure.canvas.draw()
    labels = [t.get_text() for t in ax.get_xticklabels() if seconds[0] <= t.get_position()[0] <= seconds[-1]]
    assert labels
    assert set(labels) <= {"2000-02-27", "2000-02-28", "2000-02-29", "2000-02-30", "2000-03-01"}, labels
    assert ax.get_xlabel() == "time (360_day calendar)"


def test_an_image_along_time_has_date_ticks_in_the_files_calendar():
    """A (time, lon) sample drawn as an image: its time axis in dates, not in seconds since 1970."""
    from matplotlib.figure import Figure

    from pipelines.plots import draw_image
    from schemas.schema import Feature, Schema

    dates = [cftime.DatetimeNoLeap(1999, 12, 30) + datetime.timedelta(days=d) for d in range(6)]
    seconds = np.asarray(cftime.date2num(dates, EPOCH, "noleap"), dtype=np.int64)
    time = {"dim": "time", "units": "seconds since 1970-01-01T00:00:00Z", "calendar": "noleap"}
    variable = Feature("x", "float32", (6, 4), ("time", "lon"), "variable", {"attrs": {"units": "K"}})
    lon = Feature("coord/lon", "float32", (4,), ("lon",), "coord", {"dim": "lon", "units": "degrees_east"})
    features = (variable, Feature("coord/time", "int64", (6,), ("time",), "coord", time), lon)
    sample = {"x": np.arange(24.0).reshape(6, 4), "coord/time": seconds, "coord/lon": np.arange(4.0) * 90}
    figure = Figure()
    ax = figure.subplots()
    draw_image(ax, figure, Schema(features=features), variable, sample)
    figure.canvas.draw()
    labels = [t.get_text() for t in ax.get_yticklabels() if seconds[0] <= t.get_position()[1] <= seconds[-1]]
    assert labels and set(labels) <= {f"{d.year:04d}-{d.month:02d}-{d.day:02d}" for d in dates}, labels
    assert ax.get_ylabel() == "time (noleap calendar)" and ax.get_xlabel() == "lon (°E)"


def test_files_in_two_calendars_are_refused(sample_file, tmp_path, capsys):
    halves = []
    for index, calendar in enumerate(("noleap", "standard")):
        (tmp_path / calendar).mkdir()
        halves.append(split_along_time(sample_file(TREFHT), tmp_path / calendar, 2, calendar=calendar)[index])
    config = {"input": {"paths": halves}, "sample": SAMPLE, "output": {"path": str(tmp_path / "out")}}
    expected = f"input: {halves[0]} uses calendar 'noleap' but {halves[1]} uses 'standard'; "
    assert_fails(config, tmp_path, capsys, expected, "convert the files to one calendar", "input.calendar")


def write_months(directory: Path) -> list[str]:
    """Two files like NCEP's monthly hgt.nc: time in 'months since 1800-1-1', which only 360_day decodes."""
    rng = np.random.default_rng(0)
    paths = []
    for i in range(2):
        months = np.arange(12.0) + 1200 + 12 * i
        time = xr.Variable("time", months, {"units": "months since 1800-1-1", "long_name": "Time"})
        hgt = (("time", "lat", "lon"), rng.normal(5500, 100, (12, 6, 8)).astype("f4"), {"units": "m"})
        data = xr.Dataset({"hgt": hgt}, {"time": time, "lat": np.linspace(-50, 50, 6), "lon": np.arange(8) * 45.0})
        paths.append(str(directory / f"hgt.{1900 + i}.nc"))
        data.to_netcdf(paths[-1])
    return paths


def test_months_since_is_refused_naming_the_key_and_builds_undecoded(tmp_path, capsys):
    paths = write_months(tmp_path)
    config = {
        "input": {"paths": str(tmp_path / "hgt.*.nc")},
        "sample": {"window": {"lat": 3, "lon": 4}},
        "splits": {"train": {"time": ["1900", "1900-12"]}},
        "output": {"path": str(tmp_path / "out")},
    }
    assert_fails(
        config,
        tmp_path,
        capsys,
        f"{paths[0]}: time units 'months since 1800-1-1' of 'time' cannot be decoded as dates",
        "set input.decode_times: false (splits then take numbers)",
    )
    config["input"]["decode_times"] = False
    assert_fails(config, tmp_path, capsys, "splits.train.time", "numbers in 'months since 1800-1-1'", "give numbers")
    config["splits"] = {"train": {"time": [1200, 1217]}, "test": {"time": [1218, 1223]}}
    output = build(config, tmp_path)
    source = open_archive(paths, decode_times=False)
    schema = load_schema(str(output))
    assert schema.feature("coord/time").source == {"dim": "time", "units": "months since 1800-1-1"}
    assert "calendar" not in schema.sample
    for split, steps in (("train", range(0, 18)), ("test", range(18, 24))):
        records = read_all_records(output, schema, split)
        assert sorted(set(records["index/time"].tolist())) == list(steps)
        for i in range(len(records["index/time"])):
            record = {name: values[i] for name, values in records.items()}
            np.testing.assert_array_equal(record["hgt"], expected_feature(source, schema, "hgt", record))
            assert record["coord/time"] == source["time"].values[int(record["index/time"])]
    assert_matches_source(output)  # times kept as the numbers stored


def test_an_unknown_calendar_is_refused_naming_the_key_and_builds_with_input_calendar(sample_file, tmp_path, capsys):
    paths = split_along_time(sample_file(TREFHT), tmp_path, 2, calendar="365_days")
    config = {
        "input": {"paths": paths},
        "sample": SAMPLE,
        "splits": {"train": {"time": ["1890", "1949"]}},
        "output": {"path": str(tmp_path / "out")},
    }
    assert_fails(
        config, tmp_path, capsys, f"{paths[0]}: 'time' has an unknown calendar '365_days'", "set input.calendar"
    )
    config["input"]["calendar"] = "noleap"
    output = build(config, tmp_path)
    # The reference: the same files with the calendar they meant
    fixed = []
    for path in paths:
        with xr.open_dataset(path, decode_times=False) as ds:
            ds = ds.load()
        ds["time"].attrs["calendar"] = "noleap"
        fixed.append(xr.decode_cf(ds, decode_times=CFTIME))
    source = xr.concat(fixed, dim="time")
    times = source["time"].values
    steps = [i for i, t in enumerate(times) if t < cftime.DatetimeNoLeap(1950, 1, 1)]
    check_split(output, source, "train", steps, "noleap")
    assert_matches_source(output, 100)  # input.calendar in place of the files' unknown one


@pytest.mark.parametrize("case", ["unknown calendar", "months since"])
@pytest.mark.filterwarnings("ignore:Consolidated metadata:UserWarning")
def test_a_zarr_store_decodes_times_as_files_do(case, sample_file, tmp_path, capsys):
    """input.calendar and input.decode_times apply to a store: refused alike, then the files' shards."""
    if case == "unknown calendar":
        paths = split_along_time(sample_file(TREFHT), tmp_path, 2, calendar="365_days")
        fix, refusal = {"calendar": "noleap"}, "set input.calendar"
        sample, splits = SAMPLE, {"train": {"time": ["1890", "1949"]}, "test": {"time": ["1950", None]}}
    else:
        paths = write_months(tmp_path)
        fix, refusal = {"decode_times": False}, "set input.decode_times: false"
        sample, splits = {"window": {"lat": 3, "lon": 4}}, {"train": {"time": [1200, 1217]}}
    store = tmp_path / "times.zarr"
    open_archive(paths, decode_times=False).to_zarr(store, consolidated=False)  # units and calendar as stored
    config = {"input": {"paths": [str(store)]}, "sample": sample, "splits": splits}
    config["output"] = {"path": str(tmp_path / "from_store")}
    assert_fails(config, tmp_path, capsys, str(store), refusal)
    config["input"].update(fix)
    from_store = build(config, tmp_path)
    config["input"]["paths"], config["output"]["path"] = paths, str(tmp_path / "from_files")
    from_files = build(config, tmp_path)
    shards = {p.name: p.read_bytes() for p in sorted(from_store.glob("*.tfrecord"))}
    assert shards and shards == {p.name: p.read_bytes() for p in sorted(from_files.glob("*.tfrecord"))}
    assert load_schema(str(from_store)).sample["splits"] == load_schema(str(from_files)).sample["splits"]
