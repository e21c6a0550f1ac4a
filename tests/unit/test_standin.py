"""The ERA-Interim stand-in has the real file's layout and quirks, and is the same on every run."""

from __future__ import annotations

import warnings

import netCDF4
import numpy as np
import pytest
import xarray as xr

from pipelines.demo import write_eraint_standin

from conftest import real_eraint


def _layout(path) -> dict:
    """Format, dims, and per variable: dtype, dims and attribute names with their types."""
    with netCDF4.Dataset(path) as nc:
        return {
            "format": nc.file_format,
            "dims": {name: len(dim) for name, dim in nc.dimensions.items()},
            "global": sorted(nc.ncattrs()),
            "variables": {
                name: (
                    var.dtype.str,
                    var.dimensions,
                    {a: np.asarray(var.getncattr(a)).dtype.kind for a in var.ncattrs()},
                )
                for name, var in nc.variables.items()
            },
        }


@pytest.fixture(scope="module")
def standin(tmp_path_factory):
    return write_eraint_standin(tmp_path_factory.mktemp("standin") / "eraint_uvz.nc")


def test_the_standin_has_the_quirks_the_tests_rely_on(standin):
    layout = _layout(standin)
    assert layout["format"] == "NETCDF3_64BIT_OFFSET"
    assert layout["dims"] == {"longitude": 480, "latitude": 241, "level": 3, "month": 2}
    for name in ("z", "u", "v"):
        dtype, dims, attrs = layout["variables"][name]
        assert (dtype, dims) == ("<i2", ("month", "level", "latitude", "longitude"))
        assert attrs["scale_factor"] == attrs["add_offset"] == attrs["_FillValue"] == "f"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ds = xr.open_dataset(standin)
    # The NaN _FillValue on int16 data is not valid: xarray drops it, as it does for the real file.
    assert sum(issubclass(w.category, xr.SerializationWarning) for w in caught) == 3
    with ds:
        assert ds["level"].values.tolist() == [200, 500, 850] and ds["month"].values.tolist() == [1, 7]
        assert ds["latitude"].values[[0, -1]].tolist() == [90.0, -90.0] and ds.sizes["latitude"] % 9
        for name in ("z", "u", "v"):
            assert ds[name].dtype == np.float64 and ds[name].encoding["dtype"] == np.int16
            assert ds[name].encoding["scale_factor"] < 0  # as in the real file
            assert np.isfinite(ds[name].values).all() and ds[name].attrs["units"]
        assert 10_000 < float(ds["z"].min()) < float(ds["z"].max()) < 130_000  # m**2 s**-2
        assert float(ds["u"].max()) > 30 and float(ds["u"].min()) < 0  # jets and easterlies, m s**-1


def test_the_standin_is_deterministic(standin, tmp_path):
    assert write_eraint_standin(tmp_path / "again.nc").read_bytes() == standin.read_bytes()
    assert write_eraint_standin(tmp_path / "seed1.nc", seed=1).read_bytes() != standin.read_bytes()


def test_the_standin_matches_the_real_file_layout(standin):
    real = real_eraint()
    if real is None:
        pytest.skip("the real eraint_uvz.nc is not in ../shared/data (or $XTF_SHARED_DATA) to compare with")
    assert _layout(standin) == _layout(real)
