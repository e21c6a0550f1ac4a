"""NetCDF-4 files in fsspec's in-memory filesystem, probed as remote files by the probe's tests."""

from __future__ import annotations

import uuid

import fsspec
import numpy as np
import xarray as xr

from planning.formats.sources import ListedFile
from planning.inputs import probe

FILES = 24


def memory_netcdf_files(side: int = 180):
    """FILES NetCDF-4 files of side x side floats (180: ~130 KB, probes fetch ~50 KB of each) in fsspec's in-memory
    filesystem."""
    fs = fsspec.filesystem("memory")
    folder = f"/probe-{uuid.uuid4().hex}"
    files = []
    for i in range(FILES):
        values = np.random.default_rng(i).normal(size=(1, side, side)).astype("f4")
        grid = {"lat": np.arange(float(side)), "lon": np.arange(float(side))}
        ds = xr.Dataset({"t": (("time", "lat", "lon"), values)}, coords={"time": [float(i)], **grid})
        data = bytes(ds.to_netcdf(engine="h5netcdf"))
        fs.pipe(f"{folder}/{i:02d}.nc", data)
        fs.cat_file(f"{folder}/{i:02d}.nc", 0, 1)  # the store copies a file on its first read: not the probe's
        files.append(ListedFile(f"memory://{folder}/{i:02d}.nc", len(data), "v"))
    yield files
    fs.rm(folder, recursive=True)


def probe_key(found: probe.FileProbe) -> tuple:
    return found.path, found.fingerprint, found.sizes, found.concat_raw.tolist(), found.bytes_read
