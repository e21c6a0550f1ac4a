"""A run imports only what its inputs, outputs and runner need: a local NetCDF build loads no Zarr, Dask or plots."""

from __future__ import annotations

import json
import subprocess
import sys

import yaml

from conftest import REPO

#: What a local build of NetCDF files into a local output has no use for.
NOT_NEEDED = ("zarr", "numcodecs", "dask", "distributed", "gcsfs", "matplotlib", "scipy")

_BUILD_AND_LIST = """
import json, sys
from pipelines.build import main
code = main(["--config", sys.argv[1], "--quiet"])
print(json.dumps({"code": code, "modules": sorted(m for m in sys.modules if "." not in m)}))
"""


def _loaded_by_build(config: dict, tmp_path) -> set[str]:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    run = subprocess.run(
        [sys.executable, "-c", _BUILD_AND_LIST, str(path)], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-2000:]
    result = json.loads(run.stdout.splitlines()[-1])
    assert result["code"] == 0, run.stdout
    return set(result["modules"])


def _config(small_archive, tmp_path) -> dict:
    return {
        "input": {"paths": [str(small_archive / "*.nc")], "concat_dim": "time"},
        "variables": ["t"],
        "sample": {"window": {"lat": 9, "lon": 9}, "keep": ["level"]},
        "output": {"path": str(tmp_path / "out"), "num_shards": 2},
    }


def test_a_local_netcdf_build_imports_no_zarr_dask_gcsfs_or_matplotlib(small_archive, tmp_path):
    loaded = _loaded_by_build(_config(small_archive, tmp_path), tmp_path)
    assert {"apache_beam", "xarray", "netCDF4"} <= loaded  # the build did run, with what it needs
    assert sorted(loaded & set(NOT_NEEDED)) == []
    assert (tmp_path / "out" / "schema.json").exists()


_DASK_STILL_SEEN = """
import sys
import numpy as np
import xarray as xr
from transforms.compat import patches, xarray_dask
assert patches.put_in(xarray_dask.DEFER_DASK)
assert patches.put_in(xarray_dask.DEFER_DASK)  # idempotent
decoded = xr.decode_cf(xr.Dataset({"time": ("time", np.arange(3), {"units": "days since 2000-01-01"})}))
assert str(decoded.time.values[2])[:10] == "2000-01-03", decoded.time.values
assert "dask" not in sys.modules, "numpy data imported dask"
import dask.array as da
lazy = xr.Variable(("x",), da.arange(6, chunks=3))
assert lazy.chunks == ((3, 3),), "a dask array is no longer seen as one"
from xarray.namedarray import utils
assert utils.is_dask_collection(lazy.data) and lazy.sum().values.item() == 15
"""


def test_deferring_dask_still_sees_dask_arrays_once_dask_is_imported():
    run = subprocess.run([sys.executable, "-c", _DASK_STILL_SEEN], cwd=REPO, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-2000:]
