"""A synthetic ERA5-like archive (time-split NetCDF files, 5 variables on levels, invariants) and the demo config.

The fields are smooth, with realistic magnitudes and units (temperature in K, wind in m/s,
specific humidity in kg/kg, geopotential in m**2 s**-2), so statistics, pictures and
normalisation look like they would on real reanalysis data. The benchmark uses the same
generator at larger sizes.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import numpy as np
import pandas as pd
import xarray as xr

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
    for index in range(shape.num_files):
        start = pd.Timestamp("2020-01-01") + index * shape.steps_per_file * step
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
        paths.append(_write(dataset, directory / f"era5_{start:%Y%m%dT%H}.nc", encoding=encoding))
    if invariants:
        paths.append(_write(_invariants(lat, lon), directory / "invariants.nc"))
    return paths


def ensure_demo_data(directory: str = DEMO_DATA_DIR) -> list[Path]:
    """The demo archive (with its invariants file), written on first use."""
    existing = sorted(Path(directory).glob("*.nc"))
    if len(existing) == ArchiveShape().num_files + 1:
        return existing
    for stale in existing:
        stale.unlink()
    return write_archive(directory, invariants=True)
