"""The merge-memory benchmark (``benchmarks.merge_memory``) measures every merge step on both runners."""

from __future__ import annotations

import json

from helpers import run_benchmark


def test_quick_merge_memory_measures_each_runners_merges(tmp_path):
    result_file = tmp_path / "merges.json"
    arguments = ["--quick", "--workers", "1", "--workdir", str(tmp_path), "--json", str(result_file)]
    printed = run_benchmark("benchmarks.merge_memory", *arguments)
    results = json.loads(result_file.read_text())
    assert results["failed"] == []
    rows = {(row["units"], row["runner"]): row for row in results["rows"]}
    assert sorted(rows) == [(8, "dask"), (8, "local"), (40, "dask"), (40, "local")]
    for (units, runner), row in rows.items():
        # Both levels of the tree measured on both runners; Dask's commit combine collects their branches.
        assert {"MergeGroup", "MergeBranch"} <= set(row["by_step"]), (units, runner, row["by_step"])
        assert row["peak"] == max(row["by_step"].values()) > 0
    assert "Collect" in rows[(40, "dask")]["by_step"]
    assert [ratio["units"] for ratio in results["ratios"]] == [8, 40]
    assert all(ratio["same_stats"] for ratio in results["ratios"])
    assert set(results["growth"]) == {"local", "dask"}
    assert "Dask / local merge peak, 40 units" in printed
    from benchmarks import run

    assert "merge-memory" in run.COMPETITORS and "merge-memory" not in run.DEFAULT_COMPETITORS
