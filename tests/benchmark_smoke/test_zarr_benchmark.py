"""The Zarr-against-NetCDF benchmark (``benchmarks.zarr_vs_netcdf``) builds the same shards from both."""

from __future__ import annotations

from helpers import run_benchmark


def test_quick_zarr_comparison_builds_identical_shards(tmp_path):
    printed = run_benchmark("benchmarks.zarr_vs_netcdf", "--quick", "--workdir", str(tmp_path))
    for row in ("NetCDF files", "Zarr store", "Zarr / NetCDF", "shards byte-identical: True"):
        assert row in printed, printed
