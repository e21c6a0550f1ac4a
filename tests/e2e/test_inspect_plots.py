"""``inspect --plot``: filled values are no data, a region across the seam and a curvilinear grid are drawn where
they lie, and a closed pipe ends the command quietly."""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import xarray as xr

from pipelines.plots import draw_page
from schemas import Reader

from helpers import build_quietly


def _quiet_page(output: Path, **options):
    """The --plot page, every warning an error (matplotlib's about cells it cannot place among them)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return draw_page(str(output), with_map=True, **options)


def _map_axes(figure):
    return figure.subfigs[-1].axes[0]


def _sst(tmp: Path, **options) -> Path:
    """SST with a block of land (NaN), filled with 0."""
    rng = np.random.default_rng(0)
    sst = rng.normal(290, 3, (3, 12, 12)).astype("f4")
    sst[:, 3:9, 2:7] = np.nan
    coords = {
        "time": pd.date_range("2000-01-01", periods=3, freq="D"),
        "lat": ("lat", np.linspace(60, 30, 12), {"units": "degrees_north"}),
        "lon": ("lon", np.linspace(0, 33, 12), {"units": "degrees_east"}),
    }
    xr.Dataset({"sst": (("time", "lat", "lon"), sst, {"units": "K"})}, coords).to_netcdf(tmp / "sst.nc")
    config = {
        "input": {"paths": str(tmp / "sst.nc")},
        "sample": {"window": {"lat": 6, "lon": 6}},
        "nan_policy": "fill",
        "fill_value": 0.0,
        "output": {"path": str(tmp / "out")},
        **options,
    }
    return build_quietly(config, tmp)


@pytest.fixture(scope="module")
def masked(tmp_path_factory) -> Path:
    """The filled points marked by mask/sst."""
    return _sst(tmp_path_factory.mktemp("masked"), nan_mask=True)


def test_filled_values_are_neither_drawn_nor_counted(masked):
    records = Reader(str(masked), "data").read_all()
    filled = records["mask/sst"] != 0
    assert filled.any() and (records["sst"][filled] == 0).all()  # the fill value, as data would be
    figure = _quiet_page(masked, samples=3)
    histogram = next(ax for ax in figure.subfigs[-2].axes if ax.get_title().startswith("sst:"))
    counted = sum(bar.get_height() for bar in histogram.containers[0])  # the bars ax.hist drew
    assert counted == (~filled).sum(), counted
    assert histogram.get_title() == f"sst: {(~filled).sum():,} values, {filled.sum():,} filled left out"
    assert histogram.get_xlim()[0] > 250  # no bar at the fill value 0
    for subfigure in figure.subfigs[:3]:  # the samples' images: filled points blank, never 0 K
        values = subfigure.axes[0].collections[0].get_array()
        assert np.ma.is_masked(values) or not filled.any()
        assert values.compressed().min() > 250


def test_filled_values_without_a_mask_are_said_to_be_among_the_values(tmp_path):
    figure = _quiet_page(_sst(tmp_path), samples=1)
    histogram = next(ax for ax in figure.subfigs[-2].axes if ax.get_title().startswith("sst:"))
    assert histogram.get_title().endswith("values (filled ones, = 0.0, among them: no mask/ feature tells them)")


@pytest.fixture(scope="module")
def archive(tmp_path_factory) -> Path:
    from pipelines.demo import ArchiveShape, write_archive

    directory = tmp_path_factory.mktemp("seam_archive")
    write_archive(directory, ArchiveShape(num_files=2, steps_per_file=3, levels=3, lat=20, lon=24), seed=1)
    return directory


@pytest.fixture(scope="module")
def across_the_seam(archive, tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("seam")
    config = {
        "input": {"paths": str(archive / "*.nc")},
        "variables": ["t"],
        "select": {"lat": {"min": -50, "max": 50}, "lon": {"min": 300, "max": 60}},
        "sample": {"window": {"lat": 3, "lon": 3}, "keep": ["level"]},
        "output": {"path": str(tmp / "out")},
    }
    return build_quietly(config, tmp)


def test_a_region_across_the_seam_is_drawn_where_it_lies_without_a_warning(across_the_seam, tmp_path):
    png = tmp_path / "seam.png"
    command = [sys.executable, "-W", "error", "-m", "pipelines.inspect", str(across_the_seam), "--plot", str(png)]
    result = subprocess.run([*command, "--map"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    figure = _quiet_page(across_the_seam, samples=3)
    background = _map_axes(figure).collections[0]
    lon = background.get_coordinates()[..., 0]
    # 300 to 60 through 0 (15-degree cells): 135 degrees of cells, run on past 360, not the 300 degrees between
    # 0 and 345 with the region's two sides at either end.
    assert np.all(np.diff(lon, axis=1) > 0) and lon.min() == pytest.approx(292.5) and lon.max() == pytest.approx(427.5)
    assert _map_axes(figure).xaxis.get_major_formatter()(375.0, 0) == "15"


def _curvilinear(directory: Path, land: bool = False) -> Path:
    """``tos(time, y, x)`` on a skewed grid whose longitudes cross 0 (2-D lat/lon coordinates); ``land``: NaN
    latitudes at some points of the first 4 x 5 patch, as some ocean models write them (then along time too, as
    a static coordinate must be finite)."""
    j, i = np.meshgrid(np.arange(8), np.arange(10), indexing="ij")
    lat = 40 + 2.0 * j + 0.3 * i
    if land:
        lat[:2, :2] = np.nan
    lon = (345 + 3.0 * i - 0.5 * j) % 360
    lat_attrs = {"units": "degrees_north", "standard_name": "latitude"}
    tos = np.random.default_rng(1).normal(15, 4, (2, 8, 10)).astype("f4")
    coords = {
        "time": pd.date_range("2000-01-01", periods=2, freq="D"),
        "lat": (("time", "y", "x") if land else ("y", "x"), np.stack([lat, lat]) if land else lat, lat_attrs),
        "lon": (("y", "x"), lon, {"units": "degrees_east", "standard_name": "longitude"}),
    }
    xr.Dataset({"tos": (("time", "y", "x"), tos, {"units": "degC"})}, coords).to_netcdf(directory / "tos.nc")
    return directory / "tos.nc"


def test_a_curvilinear_grid_is_mapped_on_the_records_own_latitudes_and_longitudes(tmp_path):
    config = {
        "input": {"paths": str(_curvilinear(tmp_path))},
        "coords": ["lat", "lon"],
        "sample": {"window": {"y": 4, "x": 5}},
        "output": {"path": str(tmp_path / "out")},
    }
    output = build_quietly(config, tmp_path)
    records = Reader(str(output), "data").read_all()
    figure = _quiet_page(output, samples=2)
    ax = _map_axes(figure)
    meshes = [c for c in ax.collections if type(c).__name__ == "QuadMesh"]
    assert len(meshes) == 4  # the 2 x 2 samples of the reference's day, each on its cells
    for mesh in meshes:
        corners = mesh.get_coordinates()
        assert corners.shape == (5, 6, 2)  # (4 + 1) x (5 + 1) corners around 4 x 5 cells
        assert np.ptp(corners[..., 0]) < 30  # cells near 0°E drawn there, not across the whole globe
    # Every sample's cells lie where its records say, within half a cell (the corners around them).
    lat = records["coord/lat"].reshape(len(records["tos"]), -1)
    centres = np.concatenate([m.get_coordinates()[..., 1].reshape(-1) for m in meshes])
    assert centres.min() < lat.min() and centres.max() > lat.max()
    assert ax.xaxis.get_major_formatter()(-5.0, 0) == "355"
    png = tmp_path / "curvilinear.png"
    command = [sys.executable, "-W", "error", "-m", "pipelines.inspect", str(output), "--plot", str(png), "--map"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and result.stderr == "", result.stderr


def test_a_closed_pipe_ends_the_summary_quietly(across_the_seam):
    """``inspect OUT | head -1``: the reader gone before the summary is written. No error line; 141, as a tool
    killed by SIGPIPE exits in a shell."""
    command = [sys.executable, "-m", "pipelines.inspect", str(across_the_seam)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    process.stdout.close()  # before it prints anything: its first write meets a closed pipe
    _, error = process.communicate(timeout=300)
    assert process.returncode == 141 and error == b"", error


def test_samples_without_finite_coordinates_are_left_off_the_map_and_counted(tmp_path):
    config = {
        "input": {"paths": str(_curvilinear(tmp_path, land=True))},
        "coords": ["lat", "lon"],
        "sample": {"window": {"y": 4, "x": 5}},
        "output": {"path": str(tmp_path / "out")},
    }
    figure = _quiet_page(build_quietly(config, tmp_path), samples=4)
    meshes = [c for c in _map_axes(figure).collections if type(c).__name__ == "QuadMesh"]
    assert len(meshes) == 3  # of the day's four patches, the one with NaN coordinates is not placed
    assert figure.subfigs[-1].get_suptitle().endswith("; 1 without finite coordinates not drawn")
