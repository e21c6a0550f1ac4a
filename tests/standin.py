"""A generated stand-in for ERA-Interim's `eraint_uvz.nc`, which has no licence and is not committed.

Same layout and quirks as the real file (xarray's tutorial dataset "eraint_uvz"):
- NETCDF3 64-bit offset format;
- dims `month` (1, 7), `level` (200, 500, 850 hPa, int32), `latitude` (90 to -90, float32, 241
  by default: odd, so 9x9 windows leave an edge), `longitude` (-180 to 180 - step, float32);
- `z`, `u`, `v` packed as int16 with a float64 `scale_factor` (negative, as in the real file)
  and `add_offset`, so they decode to float64; their `_FillValue` is a float64 NaN, which is
  not valid for int16 data (xarray drops it with a SerializationWarning), and the coordinates
  carry a NaN `_FillValue` too;
- the real file's variable attributes (units, long_name, standard_name,
  number_of_significant_digits).
The values are smooth, plausible fields plus noise (geopotential falling poleward, westerly
jets, waves), deterministic for a given seed. It is not real data and says so in `Info`.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np

LEVELS = np.array([200, 500, 850], dtype="i4")
MONTHS = np.array([1, 7], dtype="i4")
PACKED_MAX = 32766  # the real file's packed values span -32766..32766

VARIABLES = {
    "z": {
        "number_of_significant_digits": np.int32(5),
        "units": "m**2 s**-2",
        "long_name": "Geopotential",
        "standard_name": "geopotential",
    },
    "u": {
        "number_of_significant_digits": np.int32(2),
        "units": "m s**-1",
        "long_name": "U component of wind",
        "standard_name": "eastward_wind",
    },
    "v": {
        "number_of_significant_digits": np.int32(2),
        "units": "m s**-1",
        "long_name": "V component of wind",
        "standard_name": "northward_wind",
    },
}


def eraint_fields(latitude: np.ndarray, longitude: np.ndarray, seed: int = 0) -> dict[str, np.ndarray]:
    """Plausible z, u, v as float64 arrays (month, level, latitude, longitude)."""
    rng = np.random.default_rng(seed)
    lat = np.deg2rad(latitude.astype("f8"))[None, None, :, None]
    lon = np.deg2rad(longitude.astype("f8"))[None, None, None, :]
    summer_north = np.array([-1.0, 1.0])[:, None, None, None]  # January, July
    level = np.arange(len(LEVELS), dtype="f8")[None, :, None, None]  # 0: 200 hPa ... 2: 850 hPa
    shape = (len(MONTHS), len(LEVELS), len(latitude), len(longitude))

    # Geopotential: high aloft, falling toward the winter pole; planetary waves in mid-latitudes.
    base = np.array([115_000.0, 55_000.0, 14_000.0])[None, :, None, None]
    drop = np.array([11_000.0, 6_000.0, 1_500.0])[None, :, None, None]
    winter = 1.0 - 0.3 * np.sin(lat) * summer_north
    waves = np.cos(lat) ** 2 * np.sin(2 * lat) ** 2 * (np.cos(3 * lon + level) + 0.5 * np.sin(5 * lon - level))
    z = base - drop * np.sin(lat) ** 2 * winter + 1_200.0 * waves

    # Zonal wind: westerly jets near 40 degrees, strongest aloft and in the winter hemisphere.
    jet = np.array([40.0, 22.0, 8.0])[None, :, None, None]
    degrees = np.rad2deg(lat)
    u = sum(
        jet * (1.0 - 0.35 * hemisphere * summer_north) * np.exp(-(((degrees - hemisphere * 40.0) / 14.0) ** 2))
        for hemisphere in (1.0, -1.0)
    )
    u = u - 6.0 * np.exp(-((degrees / 12.0) ** 2)) + 4.0 * np.cos(lat) * np.sin(4 * lon + level)

    # Meridional wind: waves, weak on average.
    v = (4.0 - level) * np.cos(lat) * np.sin(2 * lat) * (np.sin(3 * lon + level) + 0.6 * np.cos(7 * lon))

    noise = {"z": 150.0, "u": 1.5, "v": 1.0}
    fields = {"z": z, "u": u, "v": v}
    return {name: np.broadcast_to(fields[name], shape) + noise[name] * rng.standard_normal(shape) for name in VARIABLES}


def pack_int16(values: np.ndarray) -> tuple[np.ndarray, np.float64, np.float64]:
    """int16 codes, scale_factor, add_offset; decoded = codes * scale_factor + add_offset."""
    low, high = float(values.min()), float(values.max())
    add_offset = np.float64((high + low) / 2)
    scale_factor = np.float64(-(high - low) / (2 * PACKED_MAX))  # negative, as in the real file
    codes = np.round((values - add_offset) / scale_factor)
    return np.clip(codes, -PACKED_MAX, PACKED_MAX).astype("i2"), scale_factor, add_offset


def write_eraint_standin(path: Path, *, latitudes: int = 241, longitudes: int = 480, seed: int = 0) -> Path:
    """Write the stand-in to `path` (with scipy: netCDF-C refuses a NaN _FillValue on int16)."""
    from scipy.io import netcdf_file

    latitude = np.linspace(90.0, -90.0, latitudes).astype("f4")
    longitude = (-180.0 + 360.0 / longitudes * np.arange(longitudes)).astype("f4")
    fields = eraint_fields(latitude, longitude, seed)
    # scipy casts each _FillValue to its variable's dtype to pad the data: NaN -> int16 warns.
    with warnings.catch_warnings(), np.errstate(invalid="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        with netcdf_file(path, "w", version=2) as nc:  # version 2: NETCDF3 64-bit offset
            nc.Conventions = "CF-1.0"
            nc.Info = "Synthetic stand-in for ERA-Interim monthly means (eraint_uvz.nc), generated for tests"
            for name, size in [("longitude", longitudes), ("latitude", latitudes), ("level", 3), ("month", 2)]:
                nc.createDimension(name, size)
            for name, values, units in [
                ("longitude", longitude, "degrees_east"),
                ("latitude", latitude, "degrees_north"),
            ]:
                var = nc.createVariable(name, "f4", (name,))
                var[:] = values
                var._FillValue = np.float64(np.nan)
                var.units = units
                var.long_name = name
            level = nc.createVariable("level", "i4", ("level",))
            level[:] = LEVELS
            level.units = "millibars"
            level.long_name = "pressure_level"
            for name, attrs in VARIABLES.items():
                codes, scale_factor, add_offset = pack_int16(fields[name])
                var = nc.createVariable(name, "i2", ("month", "level", "latitude", "longitude"))
                var[:] = codes
                var.number_of_significant_digits = attrs["number_of_significant_digits"]
                var.units = attrs["units"]
                var.scale_factor = scale_factor
                var.long_name = attrs["long_name"]
                var.add_offset = add_offset
                var._FillValue = np.float64(np.nan)
                var.standard_name = attrs["standard_name"]
            month = nc.createVariable("month", "i4", ("month",))
            month[:] = MONTHS
    return path
