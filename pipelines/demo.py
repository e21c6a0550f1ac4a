"""Demo data: a synthetic ERA5-like archive (time-split NetCDF files, 5 variables on levels,
invariants) with the demo config, and a stand-in for ERA-Interim's ``eraint_uvz.nc``.

The fields are smooth, with realistic magnitudes and units (temperature in K, wind in m/s,
specific humidity in kg/kg, geopotential in m**2 s**-2), so statistics, pictures and
normalisation look like they would on real reanalysis data. The benchmark uses the same
generator at larger sizes; the docs' walkthrough and the tests use the stand-in where the
real file is not at hand (``python -m pipelines.demo --eraint-standin data/eraint_uvz.nc``).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
import os
import sys
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import xarray as xr

from schemas.errors import UserError

DEMO_DATA_DIR = "demo/era5"
DEMO_OUTPUT = "demo/patches"

#: The built-in demo's config; configs/demo.yaml holds the same (a test keeps them equal).
DEMO_CONFIG = {
    "input": {"paths": f"{DEMO_DATA_DIR}/*.nc", "concat_dim": "time"},
    "variables": ["t", "u", "v", "q", "z"],
    "sample": {"window": {"lat": {"size": 9, "stride": 9}, "lon": {"size": 9, "stride": 9}}, "keep": ["level"]},
    "shuffle": {"seed": 0},
    "output": {"path": DEMO_OUTPUT, "num_shards": 4},
}

_ATTRS = {
    "t": {"units": "K", "long_name": "Temperature", "standard_name": "air_temperature"},
    "u": {"units": "m s**-1", "long_name": "U component of wind", "standard_name": "eastward_wind"},
    "v": {"units": "m s**-1", "long_name": "V component of wind", "standard_name": "northward_wind"},
    "q": {"units": "kg kg**-1", "long_name": "Specific humidity", "standard_name": "specific_humidity"},
    "z": {"units": "m**2 s**-2", "long_name": "Geopotential", "standard_name": "geopotential"},
}


@dataclasses.dataclass(frozen=True)
class ArchiveShape:
    """Size of a synthetic archive: files x steps per file, and the grid."""

    num_files: int = 4
    steps_per_file: int = 8
    levels: int = 7
    lat: int = 32
    lon: int = 64
    hours_per_step: int = 6

    @property
    def bytes(self) -> int:
        return 4 * len(_ATTRS) * self.num_files * self.steps_per_file * self.levels * self.lat * self.lon


def _fields(time: np.ndarray, level: np.ndarray, lat: np.ndarray, lon: np.ndarray, rng) -> dict[str, np.ndarray]:
    hours = (time - np.datetime64("2020-01-01")) / np.timedelta64(1, "h")
    tt = hours[:, None, None, None] / 24.0
    p = level[None, :, None, None] / 1000.0
    phi = np.deg2rad(lat)[None, None, :, None]
    lam = np.deg2rad(lon)[None, None, None, :]
    wave = np.sin(3 * lam - 0.2 * tt) * np.cos(phi) + 0.5 * np.sin(5 * lam + 2 * phi + 0.1 * tt)
    shape = (len(time), len(level), len(lat), len(lon))

    def noise(scale):
        return scale * rng.standard_normal(shape, dtype=np.float32)

    t = 215 + 75 * p**0.3 - 35 * np.sin(phi) ** 2 + 4 * wave + noise(0.8)
    u = 35 * np.exp(-(((np.abs(np.rad2deg(phi)) - 40) / 12) ** 2)) * (1.2 - p) + 6 * wave + noise(1.5)
    v = 8 * np.cos(2 * lam + 0.3 * tt) * np.cos(phi) * (1.1 - p) + noise(1.5)
    q = 0.018 * np.exp(-(1 - p) * 6) * np.cos(phi) ** 4 * (1 + 0.2 * wave) + np.abs(noise(2e-5))
    z = 9.80665 * 7400 * np.log(1 / p) * (1 - 0.02 * np.sin(phi) ** 2) + 400 * wave + noise(15)
    return {name: np.broadcast_to(value, shape).astype(np.float32) for name, value in zip("tuvqz", (t, u, v, q, z))}


def _write(dataset: xr.Dataset, path: Path, **options) -> Path:
    temporary = path.with_suffix(".nc.tmp")
    dataset.to_netcdf(temporary, **options)
    return temporary.rename(path)


def _invariants(lat: np.ndarray, lon: np.ndarray) -> xr.Dataset:
    """Static fields without time, as ERA5 ships them apart: orography and a land-sea mask."""
    phi, lam = np.deg2rad(lat)[:, None], np.deg2rad(lon)[None, :]
    continents = np.sin(2 * lam) * np.cos(phi) + 0.4 * np.cos(3 * phi) * np.sin(lam + 1)
    lsm = (continents > 0.2).astype(np.float32)
    orography = (lsm * 2500 * (continents - 0.2).clip(0, 1) ** 1.5).astype(np.float32)
    return xr.Dataset(
        {
            "orography": (("lat", "lon"), orography, {"units": "m", "long_name": "Surface height"}),
            "lsm": (("lat", "lon"), lsm, {"units": "1", "long_name": "Land-sea mask"}),
        },
        coords={
            "lat": ("lat", lat, {"units": "degrees_north", "long_name": "latitude"}),
            "lon": ("lon", lon, {"units": "degrees_east", "long_name": "longitude"}),
        },
    )


def write_archive(
    directory: str | os.PathLike, shape: ArchiveShape = ArchiveShape(), seed: int = 0, invariants: bool = False
) -> list[Path]:
    """Write the archive as ``era5_<first time>.nc`` files (and ``invariants.nc``); returns their paths."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    level = np.array(sorted(np.linspace(1000, 50, shape.levels).round().astype(int), reverse=True), dtype=np.int32)
    lat = np.linspace(90, -90, shape.lat, dtype=np.float32)  # north to south, as ERA5 stores it
    lon = np.linspace(0, 360, shape.lon, endpoint=False, dtype=np.float32)
    paths = []
    step = pd.Timedelta(hours=shape.hours_per_step)
    for start, name in zip(_file_starts(shape), archive_names(shape)):
        time = pd.date_range(start, periods=shape.steps_per_file, freq=step).values
        fields = _fields(time, level.astype(np.float64), lat.astype(np.float64), lon.astype(np.float64), rng)
        dataset = xr.Dataset(
            {name: (("time", "level", "lat", "lon"), values, _ATTRS[name]) for name, values in fields.items()},
            coords={
                "time": ("time", time, {"long_name": "time"}),
                "level": ("level", level, {"units": "hPa", "long_name": "pressure level"}),
                "lat": ("lat", lat, {"units": "degrees_north", "long_name": "latitude"}),
                "lon": ("lon", lon, {"units": "degrees_east", "long_name": "longitude"}),
            },
            attrs={"title": "synthetic ERA5-like reanalysis (xarray-tfrecords demo)", "Conventions": "CF-1.8"},
        )
        encoding = {"time": {"units": "hours since 1900-01-01", "dtype": "int32", "calendar": "gregorian"}}
        paths.append(_write(dataset, directory / name, encoding=encoding))
    if invariants:
        paths.append(_write(_invariants(lat, lon), directory / "invariants.nc"))
    return paths


def _file_starts(shape: ArchiveShape) -> list[pd.Timestamp]:
    """Each file's first time step."""
    step = pd.Timedelta(hours=shape.hours_per_step)
    return [pd.Timestamp("2020-01-01") + index * shape.steps_per_file * step for index in range(shape.num_files)]


def archive_names(shape: ArchiveShape = ArchiveShape(), invariants: bool = False) -> list[str]:
    """The names ``write_archive`` gives the archive's files."""
    names = [f"era5_{start:%Y%m%dT%H}.nc" for start in _file_starts(shape)]
    return names + (["invariants.nc"] if invariants else [])


def ensure_demo_data(directory: str = DEMO_DATA_DIR) -> list[Path]:
    """The demo archive (with its invariants file), written on first use.

    A folder that holds NetCDF files the demo does not write is refused, not emptied: they are someone's data.
    """
    names = archive_names(invariants=True)
    existing = {path.name for path in Path(directory).glob("*.nc")}
    if existing == set(names):
        return [Path(directory) / name for name in sorted(names)]
    foreign = sorted(existing - set(names))
    if foreign:
        more = f" and {len(foreign) - 1} more" if len(foreign) > 1 else ""
        raise UserError(
            f"{directory}: holds {foreign[0]}{more}, which the demo did not write, where it writes its archive; "
            "move them, or run the demo from another folder"
        )
    return write_archive(directory, invariants=True)  # (its files' names: each one replaced whole)


# ERA-Interim stand-in -------------------------------------------------------------------------
#
# A generated stand-in for ERA-Interim's `eraint_uvz.nc`, which has no licence and is not committed.
#
# Same layout and quirks as the real file (xarray's tutorial dataset "eraint_uvz"):
# - NETCDF3 64-bit offset format;
# - dims `month` (1, 7), `level` (200, 500, 850 hPa, int32), `latitude` (90 to -90, float32, 241
#   by default: odd, so 9x9 windows leave an edge), `longitude` (-180 to 180 - step, float32);
# - `z`, `u`, `v` packed as int16 with a float64 `scale_factor` (negative, as in the real file)
#   and `add_offset`, so they decode to float64; their `_FillValue` is a float64 NaN, which is
#   not valid for int16 data (xarray drops it with a SerializationWarning), and the coordinates
#   carry a NaN `_FillValue` too;
# - the real file's variable attributes (units, long_name, standard_name,
#   number_of_significant_digits).
# The values are smooth, plausible fields plus noise (geopotential falling poleward, westerly
# jets, waves), deterministic for a given seed. It is not real data and says so in `Info`.

ERAINT_LEVELS = np.array([200, 500, 850], dtype="i4")
ERAINT_MONTHS = np.array([1, 7], dtype="i4")
PACKED_MAX = 32766  # the real file's packed values span -32766..32766

ERAINT_VARIABLES = {
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
    level = np.arange(len(ERAINT_LEVELS), dtype="f8")[None, :, None, None]  # 0: 200 hPa ... 2: 850 hPa
    shape = (len(ERAINT_MONTHS), len(ERAINT_LEVELS), len(latitude), len(longitude))

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
    return {
        name: np.broadcast_to(fields[name], shape) + noise[name] * rng.standard_normal(shape)
        for name in ERAINT_VARIABLES
    }


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
            level[:] = ERAINT_LEVELS
            level.units = "millibars"
            level.long_name = "pressure_level"
            for name, attrs in ERAINT_VARIABLES.items():
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
            month[:] = ERAINT_MONTHS
    return path


def main(argv: list[str] | None = None) -> int:
    """``python -m pipelines.demo --eraint-standin PATH``: write the ERA-Interim stand-in the walkthrough uses.

    Args:
        argv: the command line without the program name (default: ``sys.argv[1:]``).

    Returns:
        The exit status: 0 written, 2 the path cannot be written or scipy is missing (one line).
    """
    parser = argparse.ArgumentParser(
        prog="python -m pipelines.demo",
        description=(
            "Write demo data. --eraint-standin PATH: a generated stand-in for ERA-Interim's eraint_uvz.nc "
            "(xarray's tutorial file: same layout, packing and quirks, synthetic values), for the docs' "
            "walkthrough offline."
        ),
    )
    parser.add_argument(
        "--eraint-standin", metavar="PATH", required=True, help="where to write it, e.g. data/eraint_uvz.nc"
    )
    args = parser.parse_args(argv)
    path = Path(args.eraint_standin)
    temporary = path.with_name(path.name + ".tmp")
    if importlib.util.find_spec("scipy") is None:
        print(
            "error: --eraint-standin writes with scipy, which is not installed here: pip install scipy", file=sys.stderr
        )
        return 2
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_eraint_standin(temporary).replace(path)
    except OSError as error:
        print(f"error: {path}: cannot write it ({error.strerror or error}); choose a writable path", file=sys.stderr)
        return 2
    finally:
        with contextlib.suppress(OSError):  # there only after a failed write: nothing half-written stays
            temporary.unlink()
    print(f"Wrote {path}: a synthetic stand-in for ERA-Interim's eraint_uvz.nc (same layout; not real data).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
