"""input.preprocess functions for the tests: derived variables users ask for, and functions that break the rules."""

from __future__ import annotations

import numpy as np
import xarray as xr

NOT_A_FUNCTION = 3


# What users want: each works pointwise along the sample dims, so any slab gives the same values.


def wind_speed(ds: xr.Dataset) -> xr.Dataset:
    speed = np.sqrt(ds.u**2 + ds.v**2)
    return xr.Dataset({"wind_speed": speed.assign_attrs(units="m s-1")})


def kelvin_to_celsius(ds: xr.Dataset) -> xr.Dataset:
    return ds.assign(t=(ds.t - 273.15).assign_attrs(units="degC"))


def climatology(ds: xr.Dataset) -> xr.DataArray:
    """A fixed climatology made from the slab's coordinates: wrong coordinates give wrong values."""
    hour = ds.time.dt.hour.astype(np.float32)
    return 300 - 0.5 * np.abs(ds.lat) + 0.01 * ds.lon + 0.02 * ds.level + 0.1 * hour


def anomaly(ds: xr.Dataset) -> xr.Dataset:
    # climatology's dims come first in its result (lat, lon, level, time): the build lays outputs out as the files do
    return xr.Dataset({"t_anomaly": climatology(ds) - ds.t, "u": ds.u})


def column_total(ds: xr.Dataset) -> xr.Dataset:
    """A sum along level, which every slab holds whole when sample.keep has it."""
    return xr.Dataset({"q_column": ds.q.sum("level"), "u": ds.u})


def land_temperature(ds: xr.Dataset) -> xr.Dataset:
    """Static inputs (an invariants file without time): a mask, and a field passed through."""
    return xr.Dataset({"t_land": ds.t.where(ds.lsm > 0.5), "orography": ds.orography})


# Functions the build refuses.


def raises(ds: xr.Dataset) -> xr.Dataset:
    return ds.assign(w=ds["w"])


def returns_dataarray(ds: xr.Dataset) -> xr.DataArray:
    return ds.t


def lat_gradient(ds: xr.Dataset) -> xr.Dataset:
    return xr.Dataset({"dtdlat": ds.t.differentiate("lat")})


def minus_time_mean(ds: xr.Dataset) -> xr.Dataset:
    return xr.Dataset({"t": ds.t - ds.t.mean("time")})


def time_mean(ds: xr.Dataset) -> xr.Dataset:
    return xr.Dataset({"t": ds.t.mean("time"), "u": ds.u})


def drops_a_row(ds: xr.Dataset) -> xr.Dataset:
    return ds.isel(lat=slice(1, None))


def fails_late(ds: xr.Dataset) -> xr.Dataset:
    """Fine on the first steps (all planning runs it on), fails on a worker's later ones."""
    if (ds.time > np.datetime64("2020-01-02T12")).any():
        raise ValueError("no climatology after 2020-01-02T12")
    return ds


def exits(ds: xr.Dataset) -> xr.Dataset:
    raise SystemExit("stop here")


def exits_late(ds: xr.Dataset) -> xr.Dataset:
    """Fine on the first steps (all planning runs it on), exits on a worker's later ones."""
    import sys

    if (ds.time > np.datetime64("2020-01-02T12")).any():
        sys.exit(3)
    return ds


def running_mean(ds: xr.Dataset) -> xr.Dataset:
    """A centred 3-step running mean along time: NaN at each end of a slab, so at every unit's edge."""
    return xr.Dataset({"t": ds.t.rolling(time=3, center=True).mean()})


def trailing_mean(ds: xr.Dataset) -> xr.Dataset:
    """Running means that keep values at the slab's ends (min_periods=1): they change there instead."""
    return xr.Dataset({"t": ds.t.rolling(time=5, min_periods=1).mean()})


def masked_warm(ds: xr.Dataset) -> xr.Dataset:
    """NaN from the data, pointwise (where t is 250 K or warmer): the same positions are NaN in any slab."""
    return xr.Dataset({"t": ds.t.where(ds.t < 250), "u": ds.u})


def overflows_late(ds: xr.Dataset) -> xr.Dataset:
    """From 2020-01-03 on, t x 1e37 in float32 (beyond its largest value: inf); u masked south of 60S (NaN)."""
    late = ds.time >= np.datetime64("2020-01-03")
    scaled = xr.where(late, ds.t * np.float32(1e37), ds.t).astype("float64")
    return xr.Dataset({"t_scaled": scaled, "u": ds.u.where(ds.lat > -60)})


def closes(ds: xr.Dataset) -> xr.Dataset:
    """Raises what is no Exception but ends a generator (BaseException, as SystemExit is)."""
    raise GeneratorExit("done here")


def stamped(ds: xr.Dataset) -> xr.Dataset:
    """t with an attribute JSON cannot hold (a pandas Timestamp): schema.json could not be written at the end."""
    import pandas as pd

    out = xr.Dataset({"t": ds.t})
    out.t.attrs["created"] = pd.Timestamp("2020-01-01")
    return out


def overflows(ds: xr.Dataset) -> xr.Dataset:
    """t x 1e300 computed in float32, then cast: inf everywhere, though float64 could hold it."""
    return xr.Dataset({"t_big": (ds.t * 1e300).astype("float64"), "u": ds.u})


def slow(ds: xr.Dataset) -> xr.Dataset:
    """Every slab as it is, after a while: a job long enough to be stopped while its tasks run."""
    import time

    time.sleep(1.0)
    return ds
