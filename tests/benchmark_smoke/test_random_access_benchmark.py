"""The random-access benchmark (``benchmarks.random_access``) reads the same records from our shards as ArrayRecord."""

from __future__ import annotations

import json

from helpers import run_benchmark


def test_quick_random_access_benchmark_reads_the_same_records_as_array_record(tmp_path):
    result_file = tmp_path / "r.json"
    printed = run_benchmark("benchmarks.random_access", "--quick", "--result", str(result_file), "--build-cost")
    document = json.loads(result_file.read_text())
    cost = document["build_cost"]
    assert cost["ratio"] >= 1 and cost["ab_ratio"] > 0 and all(run["index"] > 0 for run in cost["inside"])
    assert "with the index:" in printed and "from the time inside the index" in printed
    results = document["reads"]  # it checked both hold the same records first
    assert [r["name"] for r in results] == ["patches 44 KB", "points 0.5 KB"]
    for row in results:
        assert len(row["per_second"]) == 7 and all(rate > 0 for rate in row["per_second"].values())
        assert f"{row['name']}: single reads" in printed
