"""A small store laid out as ARCO-ERA5 (one step per chunk, whole globe and all levels in each chunk, many
variables), and the same data as time-split NetCDF files: the Zarr tests' inputs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import xarray as xr

#: ARCO-ERA5's 37 pressure levels (hPa).
LEVELS = [1, 2, 3, 5, 7, 10, 20, 30, 50, 70, 100, 125, 150, 175, 200, 225, 250, 300, 350, 400, 450, 500, 550, 600,
          650, 700, 750, 775, 800, 825, 850, 875, 900, 925, 950, 975, 1000]  # fmt: skip
ON_LEVELS = ["temperature", "geopotential", "u_component_of_wind", "v_component_of_wind", "specific_humidity"]
SURFACE = ["2m_temperature", "10m_u_component_of_wind", "10m_v_component_of_wind", "mean_sea_level_pressure"]
#: Stored packed (int16, scale and offset), to hold the CF decoding of both routes to the same values.
PACKED = "total_precipitation"
STATIC = "geopotential_at_surface"


def arco_like(steps: int = 12, lat: int = 10, lon: int = 18, seed: int = 0) -> xr.Dataset:
    """ARCO-ERA5's variables and dims (time, level, latitude north to south, longitude from 0) on a coarse grid."""
    rng = np.random.default_rng(seed)
    time = pd.date_range("2020-01-01", periods=steps, freq="h").values
    coords = {
        "time": ("time", time),
        "level": ("level", np.array(LEVELS, dtype=np.int64), {"units": "millibars", "long_name": "pressure_level"}),
        "latitude": ("latitude", np.linspace(90, -90, lat, dtype=np.float32), {"units": "degrees_north"}),
        "longitude": (
            "longitude",
            np.linspace(0, 360, lon, endpoint=False, dtype=np.float32),
            {"units": "degrees_east"},
        ),
    }
    data = {}
    for name in ON_LEVELS:
        values = rng.standard_normal((steps, len(LEVELS), lat, lon), dtype=np.float32)
        data[name] = (("time", "level", "latitude", "longitude"), values, {"long_name": name})
    for name in SURFACE:
        data[name] = (("time", "latitude", "longitude"), rng.standard_normal((steps, lat, lon), dtype=np.float32))
    rain = np.abs(rng.standard_normal((steps, lat, lon))) * 1e-3
    rain[0, 0, :3] = np.nan  # masked in the files: _FillValue
    data[PACKED] = (("time", "latitude", "longitude"), rain, {"units": "m"})
    data[STATIC] = (("latitude", "longitude"), rng.standard_normal((lat, lon), dtype=np.float32) * 1e3)
    return xr.Dataset(data, coords, attrs={"title": "ARCO-ERA5-like test store"})


def _encoding(ds: xr.Dataset) -> dict:
    return {
        "time": {"units": "hours since 1900-01-01", "dtype": "int64"},
        PACKED: {"dtype": "int16", "scale_factor": 1e-6, "add_offset": 0.03, "_FillValue": -32767},
    }


def write_store(ds: xr.Dataset, path: Path, zarr_format: int = 3, consolidated: bool = True) -> Path:
    """The dataset as ARCO-ERA5 stores it: one time step per chunk, each chunk the whole globe and every level."""
    encoding = _encoding(ds)
    for name, var in ds.data_vars.items():
        chunks = tuple(1 if d == "time" else n for d, n in zip(var.dims, var.shape))
        encoding.setdefault(name, {})["chunks"] = chunks
    ds.to_zarr(path, mode="w", encoding=encoding, zarr_format=zarr_format, consolidated=consolidated)
    return path


def write_netcdf(ds: xr.Dataset, directory: Path, steps_per_file: int = 4) -> list[Path]:
    """The same data as time-split NetCDF-4 files, the static field in the first (as one archive would hold it)."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for start in range(0, ds.sizes["time"], steps_per_file):
        part = ds.isel(time=slice(start, start + steps_per_file)).drop_vars(STATIC)
        path = directory / f"era5_{start:04d}.nc"
        part.to_netcdf(path, encoding=_encoding(ds))
        paths.append(path)
    static = directory / "static.nc"
    ds[[STATIC]].to_netcdf(static)
    return [*paths, static]


def set_codecs(store: Path, name: str, codecs: list) -> None:
    """A v3 store's variable given other codecs, in its own metadata and in the consolidated copy."""
    metadata = store / name / "zarr.json"
    metadata.write_text(json.dumps(json.loads(metadata.read_text()) | {"codecs": codecs}))
    root = json.loads((store / "zarr.json").read_text())
    root["consolidated_metadata"]["metadata"][name]["codecs"] = codecs
    (store / "zarr.json").write_text(json.dumps(root))
