"""Non-dim coordinates (config ``coords``): a curvilinear ocean grid's 2-D lat/lon, a coordinate along time, scalars.

Every record's coordinate patches are compared with the xarray slice its index/* features
name; scalar coordinates with what schema.json and inspect report.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import xarray as xr

from pipelines.inspect import summary
from planning.config import parse_config
from planning.plan import make_plan
from planning.run.names import work_dir
from planning.write_strategy import WriteStrategy, choose_write_strategy
from schemas import load_schema

from helpers import (
    assert_matches_source,
    build_quietly,
    expected_feature,
    load_virtual_dataset,
    parse_with_generated_parser,
    read_all_records,
    refused,
)

NY, NX, STEPS, FILES = 12, 10, 4, 3


def curvilinear_grid() -> tuple[np.ndarray, np.ndarray]:
    """A skewed, curved grid like an ocean model's: neither lat nor lon is constant along y or x."""
    j, i = np.meshgrid(np.arange(NY), np.arange(NX), indexing="ij")
    lat = -30 + 4.0 * j + 0.37 * i + 0.01 * i * j
    lon = (250 + 3.5 * i - 0.6 * j + 0.02 * j * j) % 360
    return lat, lon


def write_ocean(directory: Path, file_format: str = "NETCDF4", grid_file: bool = False) -> Path:
    """FILES files of STEPS daily steps of ``tos(time, y, x)`` on a curvilinear grid (y and x have no coordinate).

    Coordinates: 2-D ``lat``/``lon`` (in a separate grid file, as plain variables, with ``grid_file``),
    ``step(time)``, the scalar ``depth``, and ``lat_u(y, xu)`` of a staggered grid (with ``uo``).
    """
    directory.mkdir(parents=True, exist_ok=True)
    lat, lon = curvilinear_grid()
    lat_attrs = {"units": "degrees_north", "standard_name": "latitude"}
    lon_attrs = {"units": "degrees_east", "standard_name": "longitude"}
    grid = {"lat": (("y", "x"), lat, lat_attrs), "lon": (("y", "x"), lon, lon_attrs)}
    rng = np.random.default_rng(3)
    times = pd.date_range("2000-01-01", periods=FILES * STEPS, freq="D")
    for f in range(FILES):
        tos = rng.normal(15, 5, (STEPS, NY, NX)).astype("float32")
        tos[:, :2, :3] = np.nan  # land
        coords = {
            "time": times[f * STEPS : (f + 1) * STEPS],
            "step": ("time", np.arange(f * STEPS, (f + 1) * STEPS, dtype="int32"), {"long_name": "model step"}),
            "depth": ((), 0.5, {"units": "m", "long_name": "depth of the surface layer"}),
            "lat_u": (("y", "xu"), lat[:, :-1] + 0.2, lat_attrs),
            **({} if grid_file else grid),
        }
        data = {
            "tos": (("time", "y", "x"), tos, {"units": "degC", "long_name": "sea surface temperature"}),
            "uo": (("time", "y", "xu"), rng.normal(0, 1, (STEPS, NY, NX - 1)).astype("float32")),
        }
        xr.Dataset(data, coords).to_netcdf(directory / f"tos_{f}.nc", format=file_format)
    if grid_file:
        xr.Dataset(grid).to_netcdf(directory / "grid.nc", format=file_format)
    return directory


@pytest.fixture(scope="module")
def ocean(tmp_path_factory):
    made: dict[str, Path] = {}

    def get(file_format: str = "NETCDF4", grid_file: bool = False) -> Path:
        key = f"{file_format}-{grid_file}"
        if key not in made:
            made[key] = write_ocean(tmp_path_factory.mktemp(key), file_format, grid_file)
        return made[key]

    return get


def strategy(config: dict) -> WriteStrategy:
    plan = make_plan(parse_config(config))
    return choose_write_strategy(plan, work_dir(plan.output, plan.run_id)).strategy


def window_of(record: dict, schema, dim: str):
    """What the sample takes along ``dim`` from its index/<dim>, as schema.json describes the axis."""
    axis = next(a for a in schema.sample["axes"] if a["dim"] == dim)
    if axis["role"] == "keep":
        return slice(None)
    start = int(record[f"index/{dim}"])
    if axis["role"] == "window":
        return slice(start, start + axis["size"])
    return [start + offset for offset in axis["offsets"]]


def check_coordinates(output: Path, source: xr.Dataset, names: list[str]) -> dict[str, np.ndarray]:
    """Every record's coord/<name> equals the xarray slice of that coordinate its index/* features name."""
    schema = load_schema(str(output))
    records = read_all_records(output, schema)
    count = len(records["tos"])
    assert count == schema.num_examples() > 0
    for i in range(count):
        record = {name: values[i] for name, values in records.items()}
        for name in names:
            feature = schema.feature(f"coord/{name}")
            coordinate = source[name]
            want = coordinate.isel({d: window_of(record, schema, d) for d in coordinate.dims})
            np.testing.assert_array_equal(record[feature.name], want.values.astype(feature.dtype), err_msg=name)
        np.testing.assert_array_equal(record["tos"], expected_feature(source, schema, "tos", record))
    return records


def windows_config(paths, output: Path) -> dict:
    """2-D lat/lon cut with windows over y and x, step(time) in pairs of steps, the scalar depth."""
    return {
        "input": {"paths": paths},
        "variables": ["tos"],
        "coords": ["lat", "lon", "step", "depth"],
        "sample": {"window": {"y": {"size": 4, "stride": 3}, "x": 5}, "offsets": {"time": [0, 1]}},
        "output": {"path": str(output)},
    }


@pytest.fixture(scope="module")
def built_from_files(ocean, tmp_path_factory):
    """windows_config built from the files of each format (shared: the store is compared with it)."""
    made: dict[str, Path] = {}

    def get(file_format: str) -> Path:
        if file_format not in made:
            root = tmp_path_factory.mktemp(f"windows-{file_format}")
            config = windows_config(str(ocean(file_format) / "tos_*.nc"), root / "out")
            # int64 coord/step: records' sizes depend on the data
            assert strategy(config) is WriteStrategy.BUCKET_FILES
            made[file_format] = build_quietly(config, root)
        return made[file_format]

    return get


@pytest.mark.parametrize("file_format", ["NETCDF4", "NETCDF3_64BIT"])
def test_coordinates_are_cut_with_the_samples_window(ocean, built_from_files, file_format):
    """2-D lat/lon cut with windows over y and x; step(time) with pairs across files; the scalar depth."""
    directory = ocean(file_format)
    output = built_from_files(file_format)
    source = load_virtual_dataset(sorted(directory.glob("tos_*.nc")), "time")
    records = check_coordinates(output, source, ["lat", "lon", "step", "depth"])
    # Every pair of steps is there, those joining two files too (index 3: steps 3 and 4).
    assert sorted(set(records["index/time"].tolist())) == list(range(FILES * STEPS - 1))
    np.testing.assert_array_equal(records["coord/step"], records["index/time"][:, None] + [0, 1])
    assert np.isnan(records["tos"]).any()  # land: NaN in the data, never in the coordinates
    assert not np.isnan(records["coord/lat"]).any()

    schema = load_schema(str(output))
    lat = schema.feature("coord/lat")
    assert (lat.role, lat.dtype, lat.shape, lat.dims) == ("aux_coord", "float32", (4, 5), ("y", "x"))
    assert lat.source["static"] and lat.source["attrs"]["units"] == "degrees_north"
    step = schema.feature("coord/step")
    assert (step.dtype, step.shape, step.dims, "static" in step.source) == ("int64", (2,), ("time",), False)
    assert schema.feature("coord/depth").shape == ()
    assert list(schema.scalar_coords) == [
        {
            "name": "depth",
            "value": 0.5,
            "dtype": "float64",
            "attrs": {"units": "m", "long_name": "depth of the surface layer"},
        }
    ]
    stats = (output / "stats.json").read_text()
    assert "coord/lat" not in stats and '"tos"' in stats  # coordinates are not data: no statistics
    assert_matches_source(output, 100)  # 2-D lat/lon, a coordinate along time, a scalar one


@pytest.mark.filterwarnings("ignore:Consolidated metadata:UserWarning")
def test_a_store_gives_the_coordinates_its_netcdf_copy_gives(ocean, built_from_files, tmp_path, capsys):
    """The same files as one Zarr store (lat/lon/step/depth its non-dim coordinates): the same shards."""
    source = load_virtual_dataset(sorted(ocean().glob("tos_*.nc")), "time")
    assert source["lat"].dims == ("y", "x") and "lat" not in source.data_vars
    source.to_zarr(tmp_path / "ocean.zarr", mode="w")
    output = build_quietly(windows_config(str(tmp_path / "ocean.zarr"), tmp_path / "out"), tmp_path)
    reference = built_from_files("NETCDF4")
    shards = {p.name: p.read_bytes() for p in output.glob("*.tfrecord*")}
    assert shards and shards == {p.name: p.read_bytes() for p in reference.glob("*.tfrecord*")}
    assert load_schema(str(output)).scalar_coords == load_schema(str(reference)).scalar_coords
    # A coordinate's chunk missing: named on the worker, even where data chunks may read as fill values.
    (tmp_path / "ocean.zarr" / "lat" / "c" / "0" / "0").unlink()
    config = windows_config(str(tmp_path / "ocean.zarr"), tmp_path / "holed")
    config["input"]["missing_chunks"] = "fill"
    line = refused(config, tmp_path, capsys)
    assert "ocean.zarr: coordinate 'lat' (coords:): chunk 'lat/c/0/0' is missing" in line, line


def test_parser_inspect_and_selection(ocean, tmp_path):
    """A kept x, a time selection, float coordinates only (written in place): parser.py and inspect know them."""
    directory = ocean()
    config = {
        "input": {"paths": str(directory / "tos_*.nc")},
        "coords": ["lat", "lon"],
        "select": {"time": {"min": "2000-01-03", "max": "2000-01-10"}},
        "sample": {"window": {"y": 3}, "keep": ["x"]},
        "output": {"path": str(tmp_path / "out")},
    }
    assert strategy(config) is WriteStrategy.IN_PLACE
    output = build_quietly(config, tmp_path)
    source = load_virtual_dataset(sorted(directory.glob("tos_*.nc")), "time")
    schema = load_schema(str(output))
    selected = source.isel(time=slice(*schema.sample["selection"]["time"]["source_index_runs"][0]))
    records = check_coordinates(output, selected, ["lat", "lon"])
    assert records["coord/lat"].shape[1:] == (3, NX)

    parsed = parse_with_generated_parser(output)
    np.testing.assert_array_equal(parsed["coord/lon"], records["coord/lon"])

    text = summary(str(output))
    assert "coord/lat" in text and "coordinate lat at the sample's points" in text
    assert "depth = 0.5 m (depth of the surface layer)" in text
    assert_matches_source(output, 100)


def test_coordinates_from_a_grid_file(ocean, tmp_path):
    """lat/lon as plain variables of a grid file without time (a model's mesh file): read from it."""
    directory = ocean(grid_file=True)
    config = {
        "input": {"paths": [str(directory / "tos_*.nc"), str(directory / "grid.nc")]},
        "variables": ["tos"],
        "coords": ["lat", "lon"],
        "sample": {"window": {"y": 6, "x": 5}},
        "nan_policy": "drop",
        "output": {"path": str(tmp_path / "out")},
    }
    output = build_quietly(config, tmp_path)
    source = load_virtual_dataset(sorted(directory.glob("tos_*.nc")), "time")
    source = source.assign_coords(xr.open_dataset(directory / "grid.nc").load())
    check_coordinates(output, source, ["lat", "lon"])
    schema = load_schema(str(output))
    assert schema.sources["static"][0]["path"].endswith("grid.nc")
    # 2 x 2 patches at each of 12 steps; the patch with land is dropped, its coordinates with it.
    assert schema.num_examples() == 12 * 3
    assert_matches_source(output)


@pytest.mark.parametrize(
    "change, message",
    [
        (
            {"coords": ["latitude"]},
            "coords: 'latitude' is not a coordinate of {path} (its coordinates besides the dims': "
            "step, depth, lat_u, lat, lon); fix the name",
        ),
        ({"coords": ["lat_u"]}, "coords: 'lat_u' is on (y, xu) but samples are cut over (time, y, x): 'xu' is"),
        ({"variables": ["tos", "lat"]}, "variables: 'lat' is a coordinate of the input, not a data variable; list it"),
        ({"coords": ["time"]}, "coords: 'time' is the coordinate of dim 'time', which records already carry"),
        ({"coords": ["lat", "lat"]}, "coords: a coordinate is listed twice"),
        ({"variables": ["tos", "uo"], "coords": ["uo"]}, "coords: 'uo' is also a selected variable"),
    ],
)
def test_bad_coords_fail_in_one_line(ocean, tmp_path, capsys, change, message):
    directory = ocean()
    config = {
        "input": {"paths": str(directory / "tos_*.nc")},
        "variables": ["tos"],
        "sample": {"window": {"y": 4, "x": 5}},
        "output": {"path": str(tmp_path / "out")},
        **change,
    }
    line = refused(config, tmp_path, capsys)
    assert message.format(path=directory / "tos_0.nc") in line, line
