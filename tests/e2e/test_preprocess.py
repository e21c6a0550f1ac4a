"""input.preprocess: derived variables are the function of the input whatever the units; bad ones fail in one line."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import preprocess_examples as examples
import pytest
import xarray as xr
import yaml

import pipelines.graph as graph
import planning.derived as derived
from pipelines.build import main
from planning.config import parse_config
from planning.plan import make_plan
from schemas import load_schema
from schemas.errors import UserError

from helpers import assert_matches_source, expected_feature, load_virtual_dataset, read_all_records

SMALL_UNITS = 4e3  # bytes: a unit of a few samples, so a build cuts dozens of units


@pytest.fixture
def units(monkeypatch):
    """Builds plan units of at most ``SMALL_UNITS`` bytes; the list gets each build's plan."""
    plans = []

    def planning(*args, **kwargs):
        plans.append(make_plan(*args, **{**kwargs, "unit_budget_bytes": SMALL_UNITS}))
        return plans[-1]

    monkeypatch.setattr(graph, "make_plan", planning)
    return plans


def build(tmp_path: Path, config: dict, *flags: str) -> int:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return main(["--config", str(path), "--overwrite", "--quiet", *flags])


def config_for(archive: Path, output: Path, function: str, **extra) -> dict:
    config = {
        "input": {"paths": str(archive / "*.nc"), "preprocess": f"preprocess_examples:{function}"},
        "sample": {"window": {"lat": 4, "lon": 4}, "keep": ["level"]},
        "output": {"path": str(output)},
    }
    for key, value in extra.items():
        config[key] = {**config[key], **value} if isinstance(value, dict) and key in config else value
    return config


def reference(archive: Path, schema, function) -> xr.Dataset:
    """The function applied to the whole virtual dataset (after the schema's selection), by xarray."""
    source = load_virtual_dataset(sorted(archive.glob("*.nc")), "time")
    for dim, selected in schema.sample.get("selection", {}).items():
        runs = selected["source_index_runs"]
        source = source.isel({dim: np.concatenate([np.arange(a, b) for a, b in runs])})
    return function(source)


def assert_records_match(output: Path, archive: Path, function, names) -> dict[str, np.ndarray]:
    schema = load_schema(output)
    records = read_all_records(output, schema)
    expected = reference(archive, schema, function)
    count = len(records["index/time"])
    assert count == schema.sample["num_samples"] > 0
    for i in range(count):
        record = {name: values[i] for name, values in records.items()}
        for name in names:
            np.testing.assert_array_equal(record[name], expected_feature(expected, schema, name, record), name)
    assert_matches_source(output, 200)  # the function re-applied to the inputs as xarray reads them
    return records


@pytest.mark.parametrize(
    ("function", "variables"),
    [("wind_speed", None), ("kelvin_to_celsius", ["t", "u"])],
)
def test_every_record_is_the_function_of_the_input_whatever_the_unit_budget(
    small_archive, tmp_path, units, monkeypatch, function, variables
):
    config = config_for(small_archive, tmp_path / "small", function)
    if variables:
        config["variables"] = variables
    assert build(tmp_path, config) == 0
    assert len(units[-1].units) > 10
    names = variables or ["wind_speed"]
    small = assert_records_match(tmp_path / "small", small_archive, getattr(examples, function), names)
    schema = load_schema(tmp_path / "small")
    assert schema.config["input"]["preprocess"] == f"preprocess_examples:{function}"
    for name in names:
        assert schema.feature(name).source["preprocess"] == f"preprocess_examples:{function}"
        assert schema.feature(name).dims == ("level", "lat", "lon")
    if function == "kelvin_to_celsius":
        assert schema.feature("t").source["attrs"]["units"] == "degC"
        assert -100 < small["t"].min() < small["t"].max() < 60  # degrees Celsius, not kelvin
    # One unit: the same records (the shuffle depends on the samples alone).
    monkeypatch.setattr(graph, "make_plan", make_plan)
    assert build(tmp_path, {**config, "output": {"path": str(tmp_path / "large")}}) == 0
    large = read_all_records(tmp_path / "large", load_schema(tmp_path / "large"))
    assert small.keys() == large.keys()
    for name in small:
        np.testing.assert_array_equal(small[name], large[name], name)


def test_the_function_gets_the_selected_grids_coordinates_and_attrs(small_archive, tmp_path, units):
    """A climatology made from the slab's lat, lon, level and time: any coordinate off gives other values."""
    select = {"level": [50, 1000], "lat": {"min": -60, "max": 60}, "lon": {"min": 300, "max": 60}}
    config = config_for(
        small_archive,
        tmp_path / "out",
        "anomaly",
        select=select,
        sample={"window": {"lat": 4, "lon": 4}, "keep": ["level"], "offsets": {"time": [0, 1]}},
        variables=["t_anomaly", "u"],
    )
    assert build(tmp_path, config) == 0
    assert len(units[-1].units) > 10
    records = assert_records_match(tmp_path / "out", small_archive, examples.anomaly, ["t_anomaly", "u"])
    schema = load_schema(tmp_path / "out")
    assert schema.feature("t_anomaly").dims == ("time", "level", "lat", "lon")  # as the files lay t out
    assert schema.sample["selection"]["lon"]["source_index_runs"][0][0] > 0  # across the seam
    assert np.abs(records["t_anomaly"]).max() < 200  # t around 250 K minus a climatology around 280


def test_a_sum_along_a_kept_dim_is_cut_without_it(small_archive, tmp_path, units):
    config = config_for(small_archive, tmp_path / "out", "column_total", variables=["q_column", "u"])
    assert build(tmp_path, config) == 0
    assert len(units[-1].units) > 10
    schema = load_schema(tmp_path / "out")
    assert schema.feature("q_column").dims == ("lat", "lon")
    assert [a["dim"] for a in schema.sample["axes"]] == ["time", "level", "lat", "lon"]
    assert_records_match(tmp_path / "out", small_archive, examples.column_total, ["q_column", "u"])


@pytest.fixture(scope="module")
def with_invariants(tmp_path_factory) -> Path:
    """The small archive's shape with an invariants file (orography and land-sea mask on lat, lon)."""
    from pipelines.demo import ArchiveShape, write_archive

    directory = tmp_path_factory.mktemp("invariants")
    write_archive(directory, ArchiveShape(num_files=3, steps_per_file=4, levels=3, lat=20, lon=24), 2, True)
    return directory


def test_static_inputs_are_given_and_static_outputs_cut(with_invariants, tmp_path, units):
    config = config_for(
        with_invariants,
        tmp_path / "out",
        "land_temperature",
        input={"preprocess_inputs": ["t", "lsm", "orography"]},
        variables=["t_land", "orography"],
    )
    assert build(tmp_path, config) == 0
    assert len(units[-1].units) > 10
    schema = load_schema(tmp_path / "out")
    assert schema.feature("orography").dims == ("lat", "lon")
    assert schema.feature("orography").source["inputs"] == ["t", "lsm", "orography"]
    records = read_all_records(tmp_path / "out", schema)
    paths = sorted(p for p in with_invariants.glob("*.nc") if p.name != "invariants.nc")
    source = xr.merge([load_virtual_dataset(paths, "time"), xr.open_dataset(with_invariants / "invariants.nc")])
    expected = examples.land_temperature(source)
    assert 0 < np.isnan(records["t_land"]).mean() < 1  # land and sea
    for i in range(len(records["index/time"])):
        record = {name: values[i] for name, values in records.items()}
        for name in ("t_land", "orography"):
            np.testing.assert_array_equal(record[name], expected_feature(expected, schema, name, record), name)
    assert_matches_source(tmp_path / "out", 200)


def test_worker_processes_import_the_function_by_its_path(small_archive, tmp_path, monkeypatch, capsys):
    config = config_for(small_archive, tmp_path / "out", "wind_speed")
    flags = ["--direct_running_mode=multi_processing", "--direct_num_workers=1"]  # one worker process is enough
    # The test process has tests/ on sys.path (conftest); worker processes only what PYTHONPATH gives them.
    paths = [p for p in sys.path if p and Path(p).resolve() != Path(examples.__file__).parent.resolve()]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(paths))
    assert build(tmp_path, config, *flags) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("error: input.preprocess: cannot import 'preprocess_examples'"), last
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(Path(examples.__file__).parent), *paths]))
    assert build(tmp_path, config, *flags) == 0
    assert_records_match(tmp_path / "out", small_archive, examples.wind_speed, ["wind_speed"])


def fails(tmp_path: Path, capsys, config: dict) -> str:
    status = build(tmp_path, config)
    err = capsys.readouterr().err.strip()
    assert status == 2, err
    assert len(err.splitlines()) == 1, err
    assert not (Path(config["output"]["path"]) / "schema.json").exists()
    return err


@pytest.mark.parametrize(
    ("function", "extra", "expected"),
    [
        ("wind_speed", {"preprocess": "preprocess_examples.wind_speed"}, "input.preprocess: give the function as"),
        ("x", {"preprocess": "no_such_module_here:f"}, "cannot import 'no_such_module_here'"),
        ("missing", {}, "module 'preprocess_examples' has no 'missing'"),
        ("NOT_A_FUNCTION", {}, "preprocess_examples:NOT_A_FUNCTION is a int, not a function"),
        ("raises", {}, "preprocess_examples:raises raised KeyError: \"No variable named 'w'"),
        ("exits", {}, "preprocess_examples:exits raised SystemExit: stop here on a slab at the start"),
        ("returns_dataarray", {}, "returned DataArray (a DataArray: return da.to_dataset(name=...))"),
        ("lat_gradient", {}, "'dtdlat' values that depend on where a slab ends along 'lat'"),
        ("minus_time_mean", {}, "'t' values that depend on where a slab ends along 'time'"),
        ("running_mean", {}, "'t' values that depend on where a slab ends along 'time' (they changed or turned NaN"),
        ("trailing_mean", {}, "the function must be pointwise along time: no running window"),
        ("time_mean", {"variables": ["t", "u"]}, "returned 't' without the dim 'time' its inputs have"),
        ("drops_a_row", {}, "returned 't' with 15 lat where its input had 16"),
        ("wind_speed", {"preprocess_inputs": ["u", "speed"]}, "input.preprocess_inputs: 'speed' is not a data"),
        ("wind_speed", {"preprocess_inputs": ["u"]}, "raised AttributeError: 'Dataset' object has no attribute 'v'"),
        ("stamped", {}, "output 't' has attribute 'created' of type Timestamp, which schema.json cannot hold"),
        ("closes", {}, "preprocess_examples:closes raised GeneratorExit: done here on a slab at the start"),
    ],
)
def test_a_bad_function_fails_at_planning_in_one_line(small_archive, tmp_path, capsys, function, extra, expected):
    variables = extra.pop("variables", None)
    config = config_for(small_archive, tmp_path / "out", function, input=extra)
    if variables:
        config["variables"] = variables
    err = fails(tmp_path, capsys, config)
    assert expected in err
    assert "input.preprocess" in err


def test_nan_from_the_data_is_no_edge_effect(small_archive, tmp_path):
    """A mask makes NaN where the data say, at the same positions in any slab: planning accepts it."""
    config = parse_config(config_for(small_archive, tmp_path / "out", "masked_warm", variables=["t", "u"]))
    plan = make_plan(config)
    assert [o.name for o in plan.preprocess.outputs] == ["t", "u"]


def test_the_nan_and_inf_a_function_returns_are_reported(small_archive, tmp_path, capsys, units):
    config = config_for(small_archive, tmp_path / "out", "overflows_late", variables=["t_scaled", "u"])
    assert build(tmp_path, config) == 0
    out = capsys.readouterr().out
    records = read_all_records(tmp_path / "out", load_schema(tmp_path / "out"))
    t, u = records["t_scaled"], records["u"]
    plan = units[-1]
    boxes = [(unit.index, plan.positions.grid.source_box(unit)) for unit in plan.units]
    late = min(i for i, box in boxes if box["time"][1] > 8)  # step 8 is 2020-01-03
    south = min(i for i, box in boxes if box["lat"][1] > 16)  # row 16 is 61.6S
    assert f"'t_scaled' {np.isinf(t).sum():,} inf and 0 NaN of {t.size:,} values cut, first in unit {late}\n" in out
    assert f"'u' 0 inf and {np.isnan(u).sum():,} NaN of {u.size:,} values cut, first in unit {south}\n" in out
    assert "  preprocess_examples:overflows_late returned non-finite values: 't_scaled'" in out
    assert 0 < np.isinf(t).sum() < t.size and 0 < np.isnan(u).sum() < u.size


def test_a_variable_without_a_finite_value_is_refused(small_archive, tmp_path, capsys):
    err = fails(tmp_path, capsys, config_for(small_archive, tmp_path / "out", "overflows"))
    assert "error: input.preprocess: preprocess_examples:overflows returned 't_big' with no finite value in the" in err
    assert "inf, 0 NaN, from unit 0 on); fix the function" in err


def test_variables_name_the_functions_outputs(small_archive, tmp_path, capsys):
    config = config_for(small_archive, tmp_path / "out", "wind_speed", variables=["wind_speed", "t"])
    err = fails(tmp_path, capsys, config)
    assert "variables: 't' is not among what input.preprocess preprocess_examples:wind_speed returns" in err
    assert "wind_speed (time, level, lat, lon)" in err


@pytest.mark.parametrize(
    ("function", "raised"), [("fails_late", "ValueError: no climatology after"), ("exits_late", "SystemExit: 3")]
)
def test_a_function_failing_on_a_worker_fails_the_build_in_one_line(
    small_archive, tmp_path, capsys, units, monkeypatch, function, raised
):
    monkeypatch.setattr(derived, "PROBE_STEPS", 4)  # planning runs it on the first 4 steps, before it fails
    err = fails(tmp_path, capsys, config_for(small_archive, tmp_path / "out", function))
    assert f"error: input.preprocess: preprocess_examples:{function} raised {raised}" in err
    assert " on unit " in err


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ({"preprocess_inputs": ["u"]}, "input: preprocess_inputs are what input.preprocess is given"),
        ({"preprocess": "m:f", "preprocess_inputs": []}, "input.preprocess_inputs: an empty list gives"),
        ({"preprocess": "m:f", "preprocess_inputs": ["u", "u"]}, "input.preprocess_inputs: a variable is listed twice"),
        ({"preprocess": "my module:f"}, "input.preprocess: give the function as package.module:function"),
        ({"preprocess": "m:"}, "input.preprocess: give the function as package.module:function"),
    ],
)
def test_the_config_keys_are_checked(given, expected):
    with pytest.raises(UserError, match="^config: " + expected.replace(".", r"\.")):
        parse_config({"input": {"paths": "x.nc", **given}, "output": {"path": "out"}})
    assert parse_config({"input": {"paths": "x.nc", "preprocess": "pkg.mod:Cls.fn"}, "output": {"path": "out"}})
