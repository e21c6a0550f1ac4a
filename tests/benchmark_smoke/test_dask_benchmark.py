"""The Dask benchmark (``benchmarks.dask_vs_local``) builds the same shards on a Dask cluster as locally."""

from __future__ import annotations

import json

from helpers import run_benchmark


def test_quick_dask_comparison_builds_identical_shards(tmp_path):
    result_file = tmp_path / "dask.json"
    arguments = ["--quick", "--rounds", "1", "--workers", "1", "--workdir", str(tmp_path), "--json", str(result_file)]
    run_benchmark("benchmarks.dask_vs_local", *arguments)
    results = json.loads(result_file.read_text())
    assert results["identical_shards"] is True and results["samples"] > 0 and results["workers"] == 1
    assert len(results["walls"]["local"]) == len(results["walls"]["dask"]) == 1
    assert results["dask_tasks"][0] > 0
