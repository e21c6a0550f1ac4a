"""Stored values decoded by xarray's own CF rules (fills, scale, offset, _Unsigned, times), as on opening a file."""

from __future__ import annotations

import warnings

import numpy as np
import xarray as xr

from planning.formats.sources import NETCDF_LOCK


def decoded(name: str, dims, raw: np.ndarray, attrs: dict, decode_times: bool = True) -> xr.Variable:
    """A variable's stored values and attributes decoded as xarray decodes them when it opens a file (loaded)."""
    # Under the lock every warnings filter of ours is set under: filters are process-wide, and
    # another thread leaving its catch_warnings would restore them mid-decode.
    with NETCDF_LOCK, warnings.catch_warnings():
        # As on opening: a NaN _FillValue on integer data is dropped, with a warning nobody can act on.
        warnings.simplefilter("ignore", xr.SerializationWarning)
        variable = xr.Variable(dims, raw, dict(attrs))
        # Loaded here: xarray decodes lazily, and would warn outside these filters.
        return xr.conventions.decode_cf_variable(name, variable, decode_times=decode_times).load()


def unchanged_by_decoding(dtype: np.dtype, attrs: dict) -> bool:
    """No decoding attributes, or float values whose only fill values are NaN (which equal no value)."""
    if not attrs:
        return True
    if dtype.kind != "f" or attrs.keys() - {"_FillValue", "missing_value"}:
        return False
    return all(bool(np.isnan(value).all()) for value in attrs.values())


def decode_values(name: str, dims: tuple[str, ...], raw: np.ndarray, attrs: dict) -> np.ndarray:
    """A data variable's decoded values (times are not decoded: workers read data, not coordinates)."""
    if unchanged_by_decoding(raw.dtype, attrs):
        return raw  # building the xarray variable would be most of a small read
    return np.asarray(decoded(name, dims, raw, attrs, decode_times=False).values)
