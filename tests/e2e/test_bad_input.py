"""Bad input fails early and clearly: one line naming the file, variable or key and the fix, no schema.json."""

from __future__ import annotations

import os
import re
import shutil
import threading
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import xarray as xr
import yaml

from pipelines import graph
from pipelines.build import main
from schemas import load_schema, load_stats


def make_file(
    path: Path, start: str, steps: int, freq: str = "6h", lat=None, variables=("t", "q"), dtype="f4", **extra
):
    """A small (time, lat, lon) file with realistic names."""
    time = pd.date_range(start, periods=steps, freq=freq)
    lat = np.linspace(-30, 30, 12) if lat is None else lat
    lon = np.linspace(0, 90, 10)
    rng = np.random.default_rng(abs(hash((str(path), start))) % 2**32)
    shape = (steps, len(lat), len(lon))
    data = {v: (("time", "lat", "lon"), (250 + rng.normal(size=shape)).astype(dtype)) for v in variables}
    data.update(extra)
    xr.Dataset(data, coords={"time": time, "lat": lat, "lon": lon}).to_netcdf(path)
    return path


@pytest.fixture
def archive(tmp_path) -> Path:
    directory = tmp_path / "in"
    directory.mkdir()
    make_file(directory / "a.nc", "2020-01-01T00", 4)
    make_file(directory / "b.nc", "2020-01-02T00", 4)
    return directory


def config_for(inputs, output, **sample) -> dict:
    return {
        "input": {"paths": [str(p) for p in inputs]},
        "sample": sample or {"window": {"lat": 4, "lon": 5}},
        "output": {"path": str(output)},
    }


PROGRESS_LOG = re.compile(r"^cut \d+/\d+ units · ")


def run(config: dict, tmp_path: Path, capsys, *flags: str) -> tuple[int, str]:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    status = main(["--config", str(path), *flags])
    err = capsys.readouterr().err
    return status, err


def assert_fails(config, tmp_path, capsys, *expected: str, flags=()):
    status, err = run(config, tmp_path, capsys, *flags)
    # A slow run (a loaded machine) logs progress every 15 s off a terminal: those lines are not the error.
    lines = [line for line in err.splitlines() if line.strip() and not PROGRESS_LOG.match(line)]
    assert status == 2, err
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err
    for fragment in expected:
        assert fragment in lines[0], lines[0]
    output = Path(config["output"]["path"])
    assert not (output / "schema.json").exists()
    if output.is_dir():  # a failed run removes what it wrote; it keeps the inputs' probes and its manifest
        assert {p.name for p in output.rglob("*")} <= {"_inventory.json", "_manifest.json"}, list(output.rglob("*"))
    return lines[0]


def test_a_pattern_that_matches_nothing(tmp_path, capsys):
    assert_fails(config_for([tmp_path / "nope" / "*.nc"], tmp_path / "o"), tmp_path, capsys, "matches no file", "nope")


def test_a_path_that_does_not_exist(tmp_path, capsys):
    assert_fails(
        config_for([tmp_path / "missing.nc"], tmp_path / "o"), tmp_path, capsys, "missing.nc", "matches no file"
    )


def test_an_output_path_that_is_a_file(archive, tmp_path, capsys):
    (tmp_path / "o").write_text("x")
    assert_fails(config_for([archive / "*.nc"], tmp_path / "o"), tmp_path, capsys, "is an existing file")
    # ... or lies under one (NotADirectoryError from the folder's creation, before)
    inside = tmp_path / "o" / "new" / "out"
    line = assert_fails(config_for([archive / "*.nc"], inside), tmp_path, capsys, f"{tmp_path / 'o'} is a file")
    assert "not a folder" in line and (tmp_path / "o").read_text() == "x"


def test_an_output_name_that_is_not_utf8_is_one_line(archive, tmp_path, capsys):
    """The bytes of $'out\\xff' arrive as a surrogate in Python's str (was: UnicodeEncodeError)."""
    from planning.config.model import OutputConfig

    name = os.fsdecode(bytes(tmp_path) + b"/out\xff")
    line = assert_fails(config_for([archive / "*.nc"], tmp_path / "o"), tmp_path, capsys, flags=("--output", name))
    assert line.startswith(f"error: {tmp_path / 'config.yaml'}: output.path: not UTF-8 (byte 0xff at character ")
    assert "choose a name in UTF-8" in line
    assert not os.path.lexists(name)
    assert OutputConfig(path=str(tmp_path / "sortie_été")).path == str(tmp_path / "sortie_été")


def test_a_file_that_is_not_netcdf(archive, tmp_path, capsys):
    (archive / "notes.nc").write_text("not a netcdf file")
    assert_fails(config_for([archive / "*.nc"], tmp_path / "o"), tmp_path, capsys, "notes.nc", "not a NetCDF file")


def test_a_fifo_among_the_inputs_is_refused_unopened(archive, tmp_path, capsys):
    """Opening a FIFO for reading blocks until a writer comes: planning must refuse it from its stat alone."""
    fifo = archive / "pipe.nc"
    os.mkfifo(fifo)
    # A writer that meets the first reader and closes at once, so a regression fails instead of hanging the suite.
    writer = threading.Thread(target=lambda: open(fifo, "wb").close(), daemon=True)
    writer.start()
    try:
        assert_fails(config_for([archive / "*.nc"], tmp_path / "o"), tmp_path, capsys, "pipe.nc", "not a regular file")
    finally:
        os.close(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))  # lets the waiting writer go
        writer.join(5)


@pytest.mark.parametrize("name", ["uvt.nc", "nc4uvt.nc"])
def test_a_truncated_file_is_found_while_planning(tmp_path, capsys, name, sample_file):
    data = sample_file(name).read_bytes()
    (tmp_path / name).write_bytes(data[: len(data) // 2])
    config = config_for([tmp_path / name], tmp_path / "o", window={"lat": 8, "lon": 8})
    assert_fails(config, tmp_path, capsys, name)


@pytest.mark.parametrize("runner", [(), ("--direct_num_workers=1", "--direct_running_mode=multi_processing")])
def test_a_file_corrupted_inside_its_data_fails_on_the_worker(tmp_path, capsys, runner):
    ds = xr.Dataset(
        {"t": (("time", "lat", "lon"), np.random.default_rng(0).normal(size=(4, 30, 30)).astype("f4"))},
        coords={"time": pd.date_range("2020", periods=4, freq="D"), "lat": np.arange(30.0), "lon": np.arange(30.0)},
    )
    path = tmp_path / "zipped.nc"
    ds.to_netcdf(path, encoding={"t": {"zlib": True, "chunksizes": (1, 30, 30)}})
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 200] = bytes(b ^ 0xFF for b in data[middle : middle + 200])
    path.write_bytes(bytes(data))
    config = config_for([path], tmp_path / "o")
    assert_fails(config, tmp_path, capsys, "zipped.nc", "reading 't' failed", "corrupt", flags=runner)


def test_a_file_changed_after_planning_fails_on_the_worker(archive, tmp_path, capsys, monkeypatch):
    plan_then_change = graph.make_plan

    def make_plan(config, **options):
        plan = plan_then_change(config, **options)
        make_file(archive / "b.nc", "2020-01-02T00", 3)  # rewritten, shorter, mid-build
        return plan

    monkeypatch.setattr(graph, "make_plan", make_plan)
    assert_fails(config_for([archive / "*.nc"], tmp_path / "o"), tmp_path, capsys, "b.nc", "changed", "(its size")


def test_a_file_rewritten_at_the_same_size_after_planning_fails_on_the_worker(archive, tmp_path, capsys, monkeypatch):
    plan_then_change = graph.make_plan

    def make_plan(config, **options):
        plan = plan_then_change(config, **options)
        path = archive / "b.nc"
        data = bytearray(path.read_bytes())
        data[-4:] = bytes(b ^ 0xFF for b in data[-4:])  # new values, same size
        path.write_bytes(bytes(data))
        return plan

    monkeypatch.setattr(graph, "make_plan", make_plan)
    assert_fails(
        config_for([archive / "*.nc"], tmp_path / "o"),
        tmp_path,
        capsys,
        "b.nc",
        "changed since the build was planned (its modification time",
    )


def test_a_file_deleted_after_planning_fails_on_the_worker(archive, tmp_path, capsys, monkeypatch):
    plan_then_delete = graph.make_plan

    def make_plan(config, **options):
        plan = plan_then_delete(config, **options)
        (archive / "b.nc").unlink()
        return plan

    monkeypatch.setattr(graph, "make_plan", make_plan)
    assert_fails(config_for([archive / "*.nc"], tmp_path / "o"), tmp_path, capsys, "b.nc", "file not found")


def test_a_variable_missing_from_one_file(archive, tmp_path, capsys):
    make_file(archive / "c.nc", "2020-01-03T00", 4, variables=("t",))
    assert_fails(config_for([archive / "*.nc"], tmp_path / "o"), tmp_path, capsys, "c.nc", "'q' is missing")


def test_a_variable_whose_dtype_differs_between_files(archive, tmp_path, capsys):
    make_file(archive / "c.nc", "2020-01-03T00", 4, dtype="f8")
    assert_fails(
        config_for([archive / "*.nc"], tmp_path / "o"), tmp_path, capsys, "c.nc", "float64", "all files must agree"
    )


def _with_units(path: Path, units: dict[str, str], **to_netcdf) -> None:
    """Rewrite a file with these units on its variables (a file of another producer)."""
    with xr.open_dataset(path) as ds:
        ds = ds.load()
    for name, value in units.items():
        ds[name].attrs["units"] = value
    path.unlink()
    ds.to_netcdf(path, **to_netcdf)


@pytest.mark.parametrize("kind", ["NETCDF4", "NETCDF3_64BIT"])
def test_a_variable_whose_units_differ_between_files_is_refused_at_planning(archive, tmp_path, capsys, kind):
    """Reported: a file with t in degC among files in K joined without a word (schema.json said K)."""
    for name in ("a.nc", "b.nc"):
        _with_units(archive / name, {"t": "K", "q": "kg kg-1"}, format=kind)
    make_file(archive / "c.nc", "2020-01-03T00", 4)
    _with_units(archive / "c.nc", {"t": "degC", "q": "kg kg-1"}, format=kind)
    line = assert_fails(config_for([archive / "*.nc"], tmp_path / "o"), tmp_path, capsys, "c.nc")
    assert "variable 't' has units 'degC' but 'K' in" in line and "a.nc" in line, line
    # A file without units among files with: what its values mean is not known either.
    (archive / "c.nc").unlink()
    make_file(archive / "c.nc", "2020-01-03T00", 4)
    _with_units(archive / "c.nc", {"q": "kg kg-1"}, format=kind)
    line = assert_fails(config_for([archive / "*.nc"], tmp_path / "o"), tmp_path, capsys, "c.nc")
    assert "variable 't' has units none but 'K' in" in line, line


def test_files_packed_with_their_own_scale_factor_join(archive, tmp_path, capsys):
    """ERA5 as the CDS ships it: each file packs its values with its own scale_factor and add_offset, which
    decoding applies; only what the values mean (their units) must agree."""
    make_file(archive / "c.nc", "2020-01-03T00", 4)
    for number, name in enumerate(("a.nc", "b.nc", "c.nc")):
        encoding = {"t": {"dtype": "int16", "scale_factor": 0.001 * (number + 1), "add_offset": 250.0 + number}}
        _with_units(archive / name, {"t": "K"}, encoding=encoding)
    status, err = run(config_for([archive / "*.nc"], tmp_path / "o"), tmp_path, capsys, "--quiet")
    assert status == 0, err
    assert load_schema(str(tmp_path / "o")).num_records() > 0


def test_a_non_numeric_variable(archive, tmp_path, capsys):
    make_file(archive / "a.nc", "2020-01-01T00", 4, label=(("time",), np.array(["x"] * 4, dtype=object)))
    config = config_for([archive / "a.nc"], tmp_path / "o", window={"time": 2})
    config["variables"] = ["label"]
    assert_fails(config, tmp_path, capsys, "variables: 'label'", "remove it")


def test_files_whose_grids_disagree(archive, tmp_path, capsys):
    make_file(archive / "c.nc", "2020-01-03T00", 4, lat=np.linspace(-31, 31, 12))
    assert_fails(
        config_for([archive / "*.nc"], tmp_path / "o"),
        tmp_path,
        capsys,
        "c.nc: 'lat' differs from",
        "a.nc by up to 1 (at index 0: -31.0 vs -30.0)",
        "input.coord_tolerance (now float32: ",
    )
    make_file(archive / "c.nc", "2020-01-03T00", 4, lat=np.linspace(-30, 30, 13))
    assert_fails(config_for([archive / "*.nc"], tmp_path / "o"), tmp_path, capsys, "c.nc", "dim 'lat' has size 13")


def test_files_that_overlap_in_time(archive, tmp_path, capsys):
    make_file(archive / "c.nc", "2020-01-01T18", 4)  # repeats a.nc's last step
    assert_fails(config_for([archive / "*.nc"], tmp_path / "o"), tmp_path, capsys, "c.nc", "overlaps", "a.nc")


def test_a_gap_inside_a_pair_is_an_error_or_skipped(archive, tmp_path, capsys):
    make_file(archive / "d.nc", "2020-01-04T00", 4)  # no 2020-01-03: a day is missing
    pairs = config_for([archive / "*.nc"], tmp_path / "o", window={"lat": 4, "lon": 5}, offsets={"time": [0, 1]})
    assert_fails(pairs, tmp_path, capsys, "between", "b.nc", "d.nc", "input.gaps: skip")
    # Patches at single times do not care about gaps.
    assert run(config_for([archive / "*.nc"], tmp_path / "single"), tmp_path, capsys)[0] == 0
    pairs["input"]["gaps"] = "skip"
    assert run(pairs, tmp_path, capsys)[0] == 0
    schema = load_schema(pairs["output"]["path"])
    per_time = 3 * 2  # 12 lats / 4, 10 lons / 5
    assert schema.counts["samples_dropped_at_gaps"] == per_time  # the pair (b's last step, d's first)
    assert schema.num_records() == (12 - 1 - 1) * per_time
    from helpers import read_all_records

    records = read_all_records(Path(pairs["output"]["path"]), schema)
    assert np.all(np.diff(records["coord/time"], axis=1) == 6 * 3600)  # every pair is one step apart


@pytest.mark.parametrize("start", ["2020-01-02T03", "2020-01-01T22"])  # a 9 h or a 4 h step after a.nc
def test_a_file_shifted_off_the_six_hourly_steps_is_a_gap(tmp_path, capsys, start):
    make_file(tmp_path / "a.nc", "2020-01-01T00", 4)
    make_file(tmp_path / "b.nc", start, 4)
    pairs = config_for([tmp_path / "*.nc"], tmp_path / "o", window={"lat": 4, "lon": 5}, offsets={"time": [0, 1]})
    pairs["stats"] = {"tendency": True}
    assert_fails(pairs, tmp_path, capsys, "between", "a.nc", "b.nc", "input.gaps: skip")
    pairs["input"]["gaps"] = "skip"
    assert run(pairs, tmp_path, capsys)[0] == 0
    schema = load_schema(pairs["output"]["path"])
    assert schema.counts["samples_dropped_at_gaps"] == 3 * 2  # the pair (a's last step, b's first)
    from helpers import read_all_records

    records = read_all_records(Path(pairs["output"]["path"]), schema)
    assert np.all(np.diff(records["coord/time"], axis=1) == 6 * 3600)


def test_every_sample_crossing_a_gap_leaves_nothing_to_write(tmp_path, capsys):
    make_file(tmp_path / "a.nc", "2020-01-01", 1)
    make_file(tmp_path / "b.nc", "2020-01-05", 1)
    make_file(tmp_path / "c.nc", "2020-01-05T06", 1)
    config = config_for([tmp_path / "*.nc"], tmp_path / "o", window={"time": 3})
    config["input"]["gaps"] = "skip"
    assert_fails(config, tmp_path, capsys, "every sample along time crosses a gap")


@pytest.mark.parametrize(
    ("sample", "expected"),
    [
        ({"window": {"lat": 13}}, "sample.window.lat.size: 13 is larger than dim 'lat' (12)"),
        ({"window": {"latitude": 3}}, "sample.window.latitude: no variable"),
        ({"keep": ["level"]}, "sample.keep.level: no variable"),
        ({"offsets": {"time": [0, 20]}}, "sample.offsets.time: [0, 20] spans 21 steps"),
        ({"window": {"lat": 3}, "keep": ["lat"]}, "dim 'lat' is in both sample.window and sample.keep"),
        ({"window": {"lat": {"size": 3, "strid": 1}}}, "sample.window.lat.strid: unknown key"),
    ],
)
def test_sample_config_errors(archive, tmp_path, capsys, sample, expected):
    assert_fails(config_for([archive / "*.nc"], tmp_path / "o", **sample), tmp_path, capsys, expected)


def test_a_yaml_syntax_error_names_the_line(tmp_path, capsys):
    path = tmp_path / "broken.yaml"
    path.write_text("input:\n  paths: ['a.nc'\noutput:\n  path: o\n")
    assert main(["--config", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "broken.yaml: YAML syntax error at line 3" in err


def test_float64_beyond_float32_fails_unless_allowed(tmp_path, capsys):
    values = np.ones((2, 12, 10))
    values[1, 3, 4] = 1e39
    make_file(tmp_path / "big.nc", "2020-01-01", 2, variables=(), p=(("time", "lat", "lon"), values))
    config = config_for([tmp_path / "big.nc"], tmp_path / "o")
    assert_fails(config, tmp_path, capsys, "'p'", "1 value(s) exceed float32", "allow_float32_overflow")
    config["output"]["allow_float32_overflow"] = True
    assert run(config, tmp_path, capsys)[0] == 0
    stats = load_stats(config["output"]["path"])["variables"]["p"]
    assert stats["inf_count"] == 1 and stats["max"] == 1.0


def test_uint64_beyond_int64_fails_instead_of_wrapping(tmp_path, capsys):
    """tf.Example holds int64: a uint64 of 2**63 + 5 cast as it is would be stored, and summarised, as -2**63 + 5."""
    counts = np.ones((2, 12, 10), dtype=np.uint64)
    counts[1, 3, 4] = 2**63 + 5
    make_file(tmp_path / "big.nc", "2020-01-01", 2, variables=(), n=(("time", "lat", "lon"), counts))
    config = config_for([tmp_path / "big.nc"], tmp_path / "o")
    config["variables"] = ["n"]
    assert_fails(config, tmp_path, capsys, "'n'", "1 value(s) exceed int64's range", str(2**63 + 5))
    counts[1, 3, 4] = 2**63 - 1  # the largest an int64 holds: stored as it is
    make_file(tmp_path / "big.nc", "2020-01-01", 2, variables=(), n=(("time", "lat", "lon"), counts))
    assert run(config, tmp_path, capsys)[0] == 0
    assert load_stats(config["output"]["path"])["variables"]["n"]["max"] == float(2**63 - 1)


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (("--outptu", "elsewhere"), ["'--outptu'", "did you mean --output?"]),  # Beam alone would drop it silently
        (("--direct_num_worker=2",), ["did you mean --direct_num_workers?"]),
        (("stray",), ["unknown argument 'stray'"]),
        (("--direct_num_workers=two",), ["Beam options: argument --direct_num_workers: invalid int value: 'two'"]),
        (("--runner=DataflowRuner",), ["--runner=DataflowRuner is not a runner Beam knows", "DataflowRunner"]),
        # The launcher commits the output when the job ends: a launcher that does not wait would never commit it.
        (("--no_wait_until_finish",), ["--no_wait_until_finish: the build commits its output when the job ends"]),
    ],
)
def test_a_mistyped_flag_is_refused(archive, tmp_path, capsys, flags, expected):
    assert_fails(config_for([archive / "*.nc"], tmp_path / "out"), tmp_path, capsys, *expected, flags=flags)


def test_verbose_shows_the_traceback(tmp_path, capsys):
    status, err = run(config_for([tmp_path / "nope.nc"], tmp_path / "o"), tmp_path, capsys, "--verbose")
    assert status == 2 and "Traceback" in err and err.strip().splitlines()[-1].startswith("error: ")


def test_copied_real_file_with_hostile_variable_name_builds_a_safe_parser(tmp_path, capsys, sample_file):
    hostile = 'x"); import os; os.system("touch pwned") #'
    with xr.open_dataset(sample_file("uvt.nc")) as ds:
        ds = ds[["T"]].rename({"T": hostile})
        ds[hostile].attrs["long_name"] = "'''\n\"\"\"\\"
        ds.to_netcdf(tmp_path / "hostile.nc")
    shutil.copy(tmp_path / "hostile.nc", tmp_path / "h'quote.nc")
    output = tmp_path / "out \"'quoted"
    config = config_for([tmp_path / "h'quote.nc"], output, window={"lat": 16, "lon": 16}, keep=["lev"])
    assert run(config, tmp_path, capsys)[0] == 0
    from helpers import import_generated_parser

    parser = import_generated_parser(output)
    assert hostile in parser.FEATURES and str(output) == parser.OUTPUT_URL
    batch = next(iter(parser.make_dataset(batch_size=4)))
    assert batch[hostile].shape == (4, 14, 16, 16)
    assert not list(tmp_path.rglob("pwned")) and not Path("pwned").exists()


def _plain_hdf5(path: Path) -> None:
    import h5py

    with h5py.File(path, "w") as file:
        file["temperature"] = np.zeros((4, 3, 5), "f4")
        file["time"] = np.arange(4.0)


def _grouped(path: Path) -> None:
    import netCDF4

    with netCDF4.Dataset(path, "w") as nc:
        forecast = nc.createGroup("forecast")
        forecast.createDimension("time", 3)
        forecast.createVariable("time", "f8", ("time",))[:] = [0, 1, 2]
        forecast.createVariable("t", "f4", ("time",))[:] = [1, 2, 3]
        nc.createGroup("analysis")


def _with_times(times: list[str]):
    def write(path: Path) -> None:
        values = np.zeros((len(times), 3), "f4")
        xr.Dataset({"v": (("time", "x"), values)}, coords={"time": pd.to_datetime(times)}).to_netcdf(path)

    return write


@pytest.mark.parametrize(
    ("write", "expected"),
    [
        (_plain_hdf5, ["a plain HDF5 file, not NetCDF", "phony_dim_0", "write it as NetCDF with named dims"]),
        (_grouped, ["its variables are in groups (/analysis, /forecast)", "xr.open_dataset(path, group=...)"]),
        (
            _with_times(["2000-01-01", "2000-01-03", "2000-01-02", "2000-01-04"]),
            ["'time' decreases at index 2 (2000-01-02T00:00:00 after 2000-01-03T00:00:00)", "ds.sortby('time')"],
        ),
        (
            _with_times(["2000-01-01", "2000-01-02", "2000-01-02", "2000-01-04"]),
            ["'time' repeats 2000-01-02T00:00:00 at index 2", "ds.drop_duplicates('time')"],
        ),
    ],
    ids=["plain-hdf5", "groups", "decreasing", "duplicate"],
)
def test_files_that_are_not_a_time_series_of_netcdf_say_why_and_the_fix(tmp_path, capsys, write, expected):
    path = tmp_path / "input.nc"
    write(path)
    assert_fails(config_for([path], tmp_path / "o"), tmp_path, capsys, "input.nc", *expected)


@pytest.mark.parametrize("calendar", ["standard", "noleap"])
def test_a_missing_time_value_names_the_file_and_the_step(tmp_path, capsys, calendar):
    """A NaN among the times of the second of three files: not "sort them" (noleap: xarray would date it 2000-01-01)."""
    units = {"units": "hours since 2000-01-01", "calendar": calendar}
    for name, hours in (("a", [0.0, 6.0]), ("b", [12.0, np.nan]), ("c", [24.0, 30.0])):
        time = xr.Variable("time", np.array(hours), units)
        xr.Dataset({"v": (("time", "x"), np.zeros((2, 3), "f4"))}, {"time": time}).to_netcdf(tmp_path / f"{name}.nc")
    config = config_for([tmp_path / "*.nc"], tmp_path / "o")
    message = assert_fails(config, tmp_path, capsys, "b.nc: 'time' has no value at index 1", "a time value is missing")
    assert "repair the file, or write it again without that step" in message and "sort" not in message


def test_a_sample_over_two_gigabytes_is_refused_at_planning(tmp_path, capsys):
    """A tf.train.Example holds at most 2 GB; such a sample (here 2.3 GB: kept 24,000 x 24,000) never reaches Beam."""
    import netCDF4

    path = tmp_path / "huge.nc"
    with netCDF4.Dataset(path, "w") as nc:  # the chunks are never written: a 10 KB file
        for dim, size in (("time", 2), ("y", 24_000), ("x", 24_000)):
            nc.createDimension(dim, size)
        time = nc.createVariable("time", "f8", ("time",))
        time.units = "days since 2000-01-01"
        time[:] = [0, 1]
        nc.createVariable("v", "f4", ("time", "y", "x"), chunksizes=(1, 1000, 1000), zlib=True)
    config = {"input": {"paths": str(path)}, "sample": {"keep": ["y", "x"]}, "output": {"path": str(tmp_path / "o")}}
    assert_fails(config, tmp_path, capsys, "a sample's record may take 2,304 MB", "cut smaller samples")


def test_a_build_after_a_failed_one_in_the_same_process_writes(archive, tmp_path, monkeypatch):
    """A failed build refuses its stray threads' writes; the next build in the process (a notebook) still writes."""
    from planning.config import parse_config

    plan_then_change = graph.make_plan

    def make_plan(config, **options):
        plan = plan_then_change(config, **options)
        make_file(archive / "b.nc", "2020-01-02T00", 3)  # rewritten mid-build: this build fails on a worker
        return plan

    monkeypatch.setattr(graph, "make_plan", make_plan)
    with pytest.raises(Exception, match="changed since the build was planned"):
        graph.run_build(parse_config(config_for([archive / "*.nc"], tmp_path / "failed")), [])
    monkeypatch.setattr(graph, "make_plan", plan_then_change)
    plan, schema = graph.run_build(parse_config(config_for([archive / "*.nc"], tmp_path / "next")), [])
    assert schema is not None and schema.num_examples() == plan.num_samples > 0


def test_long_attributes_are_kept_in_part_saying_their_length(tmp_path, capsys):
    """Three variables with a 20 MB history made schema.json and parser.py 63 MB each (1.1 GB to import)."""
    history = "".join(f"{i}: ncks -A step {i}\n" for i in range(40_000))  # ~800 kB
    path = make_file(tmp_path / "a.nc", "2020-01-01T00", 4)
    with xr.open_dataset(path) as opened:
        ds = opened.load()
    for name in ("t", "q"):
        ds[name].attrs.update(history=history, flag_values=np.arange(5000, dtype="i4"), units="K")
    ds.to_netcdf(tmp_path / "long.nc")
    output = tmp_path / "o"
    status, err = run(config_for([tmp_path / "long.nc"], output), tmp_path, capsys)
    assert status == 0, err
    attrs = load_schema(str(output)).feature("t").source["attrs"]
    assert attrs["units"] == "K"
    assert attrs["history"] == f"{history[:4096]} [... cut: {len(history):,} characters in the file]"
    assert attrs["flag_values"].startswith("[not kept: a list of 5,000 values in the file, ")
    for name in ("schema.json", "parser.py"):
        assert (output / name).stat().st_size < 100_000, name
