"""A small NetCDF-4 file whose chunks cross the sample windows, compressed and packed (tests of chunk-once reads)."""

from __future__ import annotations

import netCDF4
import numpy as np

DIMS = ("time", "level", "y", "x")
SHAPE = (6, 5, 20, 12)
CHUNKS = (2, 5, 8, 12)  # two steps of every level; y chunks of 8 cross the windows of 5 (stride 3)
LEVELS = [0, 2, 3]  # two runs, both inside every chunk


def write_chunked(path, chunks=CHUNKS):
    """t (packed int16, zlib and shuffle) and q (float32, zlib) on (time, level, y, x), chunked ``chunks``."""
    rng = np.random.default_rng(1)
    with netCDF4.Dataset(path, "w") as nc:
        for dim, size in zip(DIMS, SHAPE):
            nc.createDimension(dim, size)
        nc.createVariable("time", "f8", ("time",))[:] = np.arange(SHAPE[0])
        nc["time"].units = "hours since 2000-01-01"
        nc.createVariable("level", "i4", ("level",))[:] = np.arange(SHAPE[1]) * 100
        packed = nc.createVariable("t", "i2", DIMS, chunksizes=chunks, zlib=True, shuffle=True)
        packed.scale_factor, packed.add_offset = 0.01, 280.0
        packed[:] = 280 + rng.normal(0, 20, SHAPE)
        nc.createVariable("q", "f4", DIMS, chunksizes=chunks, zlib=True)[:] = rng.normal(size=SHAPE)
    return path
