"""Non-dim coordinates as planning sees them: the same from a classic header as through xarray; scalars' values."""

from __future__ import annotations

import json
import os

import cftime
import numpy as np
import pytest
import xarray as xr

from planning.formats.remote_files import RemoteFile
from planning.inputs.coords import json_scalar
from planning.inputs.metadata import inspect_classic, inspect_file


@pytest.fixture
def classic_file(tmp_path):
    """A classic file with a 2-D coordinate and scalar coordinates of every kind a schema shows."""
    j, i = np.meshgrid(np.arange(3), np.arange(4), indexing="ij")
    ds = xr.Dataset(
        {"tos": (("time", "y", "x"), np.zeros((2, 3, 4), "float32"))},
        coords={
            "time": [0.0, 1.0],
            "lat": (("y", "x"), 10.0 * j + i, {"units": "degrees_north"}),
            "depth": ((), 0.5, {"units": "m"}),
            "member": ((), np.int32(3)),
            "missing": ((), np.nan),
            "reftime": ((), np.datetime64("2000-01-01T06:00:00", "ns")),
        },
    )
    path = tmp_path / "classic.nc"
    ds.to_netcdf(path, format="NETCDF3_64BIT")
    return str(path)


def test_a_classic_header_gives_the_coordinates_xarray_gives(classic_file):
    remote = RemoteFile(classic_file)
    from_header = inspect_classic(classic_file, os.path.getsize(classic_file), remote.classic_header(), remote.fetch)
    through_xarray = inspect_file(classic_file)
    assert from_header.coordinates == through_xarray.coordinates
    assert sorted(through_xarray.coordinates) == ["depth", "lat", "member", "missing", "reftime"]
    assert through_xarray.coordinates["lat"].dims == ("y", "x")
    assert list(through_xarray.variables) == ["tos"]
    expected = {"depth": 0.5, "member": 3, "missing": "nan", "reftime": "2000-01-01T06:00:00"}
    assert from_header.scalar_values == through_xarray.scalar_values == expected
    json.dumps(expected, allow_nan=False)  # schema.json is strict JSON


def test_scalar_values_as_schema_json_holds_them():
    assert json_scalar(np.array(cftime.Datetime360Day(2000, 2, 30))) == "2000-02-30T00:00:00"
    assert json_scalar(np.array(b"ocean")) == "ocean"
    assert json_scalar(np.array("ocean")) == "ocean"
    assert json_scalar(np.array(np.inf, "float32")) == "inf"
    assert json_scalar(np.array(True)) is True
    assert json_scalar(np.float32(2.5)) == 2.5
