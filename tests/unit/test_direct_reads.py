"""Reads by offset: recorded only for plainly stored variables, equal to HDF5's reads, used where planned."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest
import xarray as xr

from planning.config import parse_config
from planning.inputs.local_probe import probe_local
from planning.plan import make_plan
from planning.reads import slabs
from planning.reads.direct_reads import read_direct
from planning.reads.slabs import read_selected
from planning.reads.source_index import SourceIndex


def _write(path, start: int) -> None:
    rng = np.random.default_rng(start)
    values = rng.normal(280, 5, (3, 4, 6)).astype("f4")
    values[0, 0, 0] = np.nan  # a NaN fill value does not change what decoding gives
    data = {name: (("time", "lat", "lon"), values + i) for i, name in enumerate(["plain", "chunked", "packed"])}
    times = pd.date_range("2000-01-01", periods=3, freq="D") + pd.Timedelta(days=start)
    ds = xr.Dataset(data, coords={"time": times, "lat": np.arange(4.0), "lon": np.arange(6.0)})
    encoding = {
        "chunked": {"zlib": True, "chunksizes": (1, 4, 6)},
        "packed": {"dtype": "int16", "scale_factor": 0.01, "add_offset": 280.0, "_FillValue": -32768},
    }
    ds.to_netcdf(path, encoding=encoding)


@pytest.fixture
def archive(tmp_path):
    for i in range(3):
        _write(tmp_path / f"part{i}.nc", 3 * i)
    return tmp_path


def test_the_probe_records_plainly_stored_variables_only(archive):
    path = str(archive / "part0.nc")
    layouts = probe_local(path, 0, "time").layouts
    assert set(layouts) == {"plain"}  # not the compressed or the packed one
    offset, shape, dtype, _ = layouts["plain"]
    assert (shape, dtype) == ([3, 4, 6], "<f4")
    with open(path, "rb") as stream:
        stream.seek(offset)
        stored = np.frombuffer(stream.read(3 * 4 * 6 * 4), "<f4").reshape(3, 4, 6)
    with xr.open_dataset(path) as ds:
        np.testing.assert_array_equal(stored, ds["plain"].values)
    assert probe_local(path, 0, "time", wanted=frozenset({"chunked"})).layouts == {}


def _plan(archive, output, window: int = 4):
    config = {
        "input": {"paths": str(archive / "*.nc")},
        "variables": ["plain", "chunked", "packed"],
        "sample": {"window": {"lat": window, "lon": 6}},
        "output": {"path": str(output)},
    }
    return make_plan(parse_config(config))


def _read_all(plan, sources: SourceIndex) -> dict[str, np.ndarray]:
    out: dict[str, list] = {}
    for unit in plan.units:
        values = read_selected(sources, "time", plan.variables, plan.grid.source_box(unit), plan.selection).values
        for name, array in values.items():
            out.setdefault(name, []).append(array)
    return {name: np.concatenate(parts) for name, parts in out.items()}


def test_reads_by_offset_equal_hdf5_reads_and_skip_hdf5(archive, tmp_path, monkeypatch):
    plan = _plan(archive, tmp_path / "out")
    direct = plan.sources.direct
    assert direct.names == ("plain", "chunked", "packed")
    assert (direct.offsets[:, 0] >= 0).all() and (direct.offsets[:, 1:] < 0).all()
    through_hdf5 = _read_all(plan, dataclasses.replace(plan.sources, direct=None))
    again = SourceIndex.from_bytes(plan.sources.to_bytes())  # as workers load it
    assert (again.direct.offsets == direct.offsets).all() and again.direct.shapes == direct.shapes
    by_offset = _read_all(plan, again)
    for name, values in through_hdf5.items():
        assert by_offset[name].dtype == values.dtype
        np.testing.assert_array_equal(by_offset[name], values)
    by_offset["plain"][0, 0, 0] = 0.0  # writable, as nan_policy: fill needs

    # With only the plain variable, no file is opened through HDF5 at all.
    def no_hdf5(*args, **kwargs):
        raise AssertionError("read through HDF5")

    monkeypatch.setattr(slabs, "_read_file", no_hdf5)
    box = plan.grid.source_box(plan.units[0])
    read = read_selected(again, "time", plan.variables[:1], box, plan.selection).values["plain"]
    np.testing.assert_array_equal(read, through_hdf5["plain"][: box["time"][1]])


def test_a_box_that_takes_under_three_quarters_of_the_other_dims_goes_through_hdf5(archive, tmp_path):
    plan = _plan(archive, tmp_path / "out", window=2)
    source = plan.sources[0]
    assert read_direct(source, plan.variables[:1], {"time": (0, 3), "lat": (0, 2), "lon": (0, 6)}, "time") is None
    assert read_direct(source, plan.variables[:1], {"time": (0, 3), "lat": (1, 4), "lon": (0, 5)}, "time") is None
    assert read_direct(source, plan.variables[:1], {"time": (0, 3), "lat": (0, 5), "lon": (0, 6)}, "time") is None
    whole = read_direct(source, plan.variables[:1], {"time": (1, 3), "lat": (0, 4), "lon": (0, 6)}, "time")
    with xr.open_dataset(source.path) as ds:
        np.testing.assert_array_equal(whole["plain"], ds["plain"].values[1:3])


def test_a_box_leaving_a_margin_of_the_other_dims_is_read_by_offset(archive, tmp_path, monkeypatch):
    """9x9 patches of a 64x128 grid leave its last row and columns: whole rows are read, the box taken from them."""
    plan = _plan(archive, tmp_path / "out", window=2)
    source = plan.sources[0]
    box = {"time": (1, 3), "lat": (1, 4), "lon": (0, 6)}  # three quarters of each row
    margin = read_direct(source, plan.variables[:1], box, "time")["plain"]
    with xr.open_dataset(source.path) as ds:
        np.testing.assert_array_equal(margin, ds["plain"].values[1:3, 1:4])
    margin[0, 0, 0] = 0.0  # writable, as nan_policy: fill needs

    def no_hdf5(*args, **kwargs):
        raise AssertionError("read through HDF5")

    monkeypatch.setattr(slabs, "_read_file", no_hdf5)
    read = read_selected(plan.sources, "time", plan.variables[:1], box, plan.selection).values["plain"]
    with xr.open_dataset(source.path) as ds:
        np.testing.assert_array_equal(read, ds["plain"].values[1:3, 1:4])
