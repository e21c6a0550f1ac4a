"""grid.npz: a curvilinear grid's 2-D coordinates beside schema.json, not in it, nor in the job graph."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import xarray as xr
import yaml

import schemas
from pipelines import graph
from planning.config import load_config
from schemas import load_schema
from schemas.errors import UserError
from schemas.grid_file import INLINE_VALUES
from schemas.verify import VerifyError, verify_output

from helpers import build_quietly

#: 72 x 72 = 5,184 values a coordinate: above INLINE_VALUES, so lat and lon go to grid.npz.
SIZE = 72


def write_curvilinear(directory: Path, size: int = SIZE, files: int = 2) -> Path:
    """``files`` files of 2 daily steps of t2m(time, y, x) on a Lambert-like grid: 2-D float64 lat, lon."""
    directory.mkdir(parents=True, exist_ok=True)
    j, i = np.meshgrid(np.arange(size), np.arange(size), indexing="ij")
    lat = 20 + 0.3 * j + 0.11 * i + 1e-4 * i * j
    lon = (250 + 0.3 * i - 0.07 * j + 2e-4 * j * j) % 360
    times = pd.date_range("2000-01-01", periods=2 * files, freq="D")
    rng = np.random.default_rng(0)
    for f in range(files):
        coords = {
            "time": times[2 * f : 2 * f + 2],
            "lat": (("y", "x"), lat, {"units": "degrees_north", "standard_name": "latitude"}),
            "lon": (("y", "x"), lon, {"units": "degrees_east", "standard_name": "longitude"}),
        }
        t2m = rng.normal(280, 5, (2, size, size)).astype("float32")
        xr.Dataset({"t2m": (("time", "y", "x"), t2m, {"units": "K"})}, coords).to_netcdf(directory / f"t_{f}.nc")
    return directory


def config(source: Path, output: Path, pattern: str = "t_*.nc") -> dict:
    return {
        "input": {"paths": str(source / pattern)},
        "variables": ["t2m"],
        "coords": ["lat", "lon"],
        "sample": {"window": {"y": 24, "x": 24}},
        "output": {"path": str(output)},
    }


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    return write_curvilinear(tmp_path_factory.mktemp("curvilinear"))


@pytest.fixture(scope="module")
def built(source, tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("built")
    return build_quietly(config(source, work / "out"), work)


def copy_of(output: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "copy"
    shutil.copytree(output, copy)
    return copy


def test_the_grid_values_leave_schema_json_for_grid_npz_exactly(built, source):
    text = (built / "schema.json").read_text()
    assert len(text) < 20_000 and (built / "parser.py").stat().st_size < 60_000  # (inline: 260 KB each)
    schema = load_schema(str(built))
    sidecar = np.load(built / "grid.npz", allow_pickle=False)
    ds = xr.open_dataset(source / "t_0.nc")
    for name in ("lat", "lon"):
        entry = schema.grid[f"coord/{name}"]
        reference = entry["values"]
        assert reference["file"] == "grid.npz" and reference["count"] == SIZE * SIZE
        assert entry["dims"] == ["y", "x"] and entry["shape"] == [SIZE, SIZE] and entry["dtype"] == "<f8"
        assert entry["attrs"] == ds[name].attrs
        values = sidecar[reference["array"]]
        assert values.dtype == np.float64
        np.testing.assert_array_equal(values.reshape(SIZE, SIZE), ds[name].values)
    assert "grid.npz" in json.loads((built / "_manifest.json").read_text())["files"]
    verify_output(str(built))


def test_reassembly_puts_the_coordinates_back_exactly(built, source, tmp_path, capsys):
    from pipelines.reassemble import main

    ds = xr.open_dataset(source / "t_0.nc")
    got = schemas.reassemble(str(built))
    to = tmp_path / "back.nc"
    assert main([str(built), "--to", str(to), "--quiet"]) == 0, capsys.readouterr().err
    written = xr.open_dataset(to).load()
    for result in (got, written):
        for name in ("lat", "lon"):
            assert result[name].dims == ("y", "x") and result[name].dtype == np.float64
            np.testing.assert_array_equal(result[name].values, ds[name].values)
            assert result[name].attrs == ds[name].attrs
        np.testing.assert_array_equal(result["t2m"].isel(time=slice(0, 2)).values, ds["t2m"].values)


def test_an_output_with_the_values_inline_still_reads(built, tmp_path):
    """The format before grid.npz: every value in schema.json (and no sidecar)."""
    old = copy_of(built, tmp_path)
    document = json.loads((old / "schema.json").read_text())
    sidecar = np.load(old / "grid.npz", allow_pickle=False)
    for entry in document["grid"].values():
        if isinstance(entry.get("values"), dict):
            entry["values"] = sidecar[entry["values"]["array"]].tolist()
    (old / "schema.json").write_text(json.dumps(document))
    (old / "grid.npz").unlink()
    want = schemas.reassemble(str(built))
    got = schemas.reassemble(str(old))
    xr.testing.assert_identical(got.drop_attrs(deep=False), want.drop_attrs(deep=False))


def test_opening_to_read_records_does_not_read_the_sidecar(built, tmp_path):
    copy = copy_of(built, tmp_path)
    (copy / "grid.npz").unlink()
    records = schemas.Reader(str(copy), "data").read_all()
    assert len(records["t2m"]) == load_schema(str(copy)).num_examples() > 0


@pytest.mark.parametrize("damage", ["flipped", "missing", "truncated"])
def test_a_damaged_or_missing_sidecar_is_one_line(built, tmp_path, damage):
    copy = copy_of(built, tmp_path)
    sidecar = copy / "grid.npz"
    data = bytearray(sidecar.read_bytes())
    if damage == "missing":
        sidecar.unlink()
    elif damage == "flipped":
        data[len(data) // 2] ^= 1  # one bit inside lat's values: still a valid .npz
        sidecar.write_bytes(bytes(data))
    else:
        sidecar.write_bytes(bytes(data[:100]))
    want = "missing, but schema.json names it" if damage == "missing" else "its sha256 differs"
    with pytest.raises(UserError) as error:
        schemas.reassemble(str(copy))
    assert str(error.value).startswith(f"{sidecar}: ") and want in str(error.value)
    assert "\n" not in str(error.value)
    with pytest.raises(VerifyError, match=want):
        verify_output(str(copy))


@pytest.mark.parametrize("name", ["../grid.npz", "/etc/grid.npz", "sub/grid.npz", ".."])
def test_a_sidecar_named_outside_the_output_is_refused_unread(built, tmp_path, name):
    copy = copy_of(built, tmp_path / "in")
    shutil.copy(copy / "grid.npz", tmp_path / "grid.npz")  # (where ../grid.npz points: whole, and never read)
    document = json.loads((copy / "schema.json").read_text())
    document["grid"]["coord/lat"]["values"]["file"] = name
    (copy / "schema.json").write_text(json.dumps(document))
    with pytest.raises(UserError, match=r"grid\['coord/lat'\]\.values\.file: .* is not the name of a file in the"):
        load_schema(str(copy))
    with pytest.raises(UserError, match="not a file of the output's folder"):
        schemas.grid.coordinate_values(document["grid"]["coord/lat"], str(copy))


def test_overwrite_without_coords_removes_the_sidecar_and_append_keeps_it(tmp_path):
    source = write_curvilinear(tmp_path / "src", files=2)
    from pipelines.build import main

    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(config(source, tmp_path / "out", "t_0.nc")))
    assert main(["--config", str(path), "--quiet"]) == 0
    digest = load_schema(str(tmp_path / "out")).grid["coord/lat"]["values"]["sha256"]
    path.write_text(yaml.safe_dump(config(source, tmp_path / "out")))  # the next file, appended
    assert main(["--config", str(path), "--quiet", "--append"]) == 0
    schema = load_schema(str(tmp_path / "out"))
    assert schema.sources["generations"] == 2 and schema.grid["coord/lat"]["values"]["sha256"] == digest
    got = schemas.reassemble(str(tmp_path / "out"))
    np.testing.assert_array_equal(got["lat"].values, xr.open_dataset(source / "t_1.nc")["lat"].values)
    assert got.sizes["time"] == 4 and not np.isnan(got["t2m"].values).any()
    plain = {**config(source, tmp_path / "out"), "coords": []}
    path.write_text(yaml.safe_dump(plain))
    assert main(["--config", str(path), "--quiet", "--overwrite"]) == 0
    assert not (tmp_path / "out" / "grid.npz").exists()


def _dry_run(source: Path, tmp_path: Path):
    tmp_path.mkdir()
    path = tmp_path / "dry.yaml"
    path.write_text(yaml.safe_dump(config(source, tmp_path / "dry")))
    return graph.run_build(load_config(str(path)), ["--dry_run=True"])[0]


def test_the_job_graph_does_not_grow_with_the_grid(source, tmp_path):
    """400 x 400: 320,000 coordinate values, which Finalize's spec carried as 6.9 MB of JSON (a 1.36 MB graph)."""
    large = write_curvilinear(tmp_path / "large", size=400, files=1)
    small = _dry_run(source, tmp_path / "s")
    big = _dry_run(large, tmp_path / "b")
    assert big.job_graph_bytes < 200_000
    assert abs(big.job_graph_bytes - small.job_graph_bytes) < 0.1 * small.job_graph_bytes


def test_split_grid_keeps_small_entries_inline_and_gives_the_same_bytes_each_time(tmp_path):
    from schemas.grid import coordinate_values, describe_coordinate
    from schemas.grid_file import split_grid
    from schemas.schema import Schema

    rng = np.random.default_rng(1)
    small = describe_coordinate(rng.normal(size=INLINE_VALUES), {})
    large = describe_coordinate(rng.normal(size=INLINE_VALUES + 1).astype("float32"), {"units": "m"})
    times = np.datetime64("2000-01-01") + np.sort(rng.choice(10**6, INLINE_VALUES + 1, replace=False)).astype(
        "timedelta64[h]"
    )
    grid = {"a": small, "b/c": large, "time": describe_coordinate(times, {})}
    split, data = split_grid(Schema(features=(), grid=grid))
    assert split.grid["a"] == small and split_grid(Schema(features=(), grid=grid))[1] == data
    assert split.grid["b/c"]["values"]["array"] == "b_c" and split.grid["time"]["seconds"]["array"] == "time.seconds"
    (tmp_path / "grid.npz").write_bytes(data)
    for name in ("b/c", "time"):
        np.testing.assert_array_equal(coordinate_values(split.grid[name], str(tmp_path)), coordinate_values(grid[name]))
    assert coordinate_values(split.grid["b/c"], str(tmp_path)).dtype == np.float32
    assert split_grid(split)[1] is None  # (references stay references)


def test_a_gs_output_commits_and_reads_its_sidecar(gcs, source, tmp_path):
    """Local files (the static coordinates are read at planning) into gs://: grid.npz written, listed, read back."""
    from conftest import BUCKET

    output = f"gs://{BUCKET}/grid_file/out"
    build_quietly(config(source, tmp_path / "unused") | {"output": {"path": output}}, tmp_path)
    assert gcs.exists(f"{output}/grid.npz") and gcs.exists(f"{output}/schema.json")
    assert "grid.npz" in json.loads(gcs.cat(f"{output}/_manifest.json"))["files"]
    written = gcs.cat(f"{output}/grid.npz")
    gcs.pipe(f"{output}/grid.npz", written[:-1])
    with pytest.raises(UserError, match=f"^{output}/grid.npz: .*its sha256 differs"):
        schemas.reassemble(output)
    gcs.pipe(f"{output}/grid.npz", written)  # (a refused read is not kept: the next one reads the file again)
    got = schemas.reassemble(output)
    np.testing.assert_array_equal(got["lon"].values, xr.open_dataset(source / "t_0.nc")["lon"].values)
