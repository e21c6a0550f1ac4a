"""The metadata benchmark (``benchmarks.metadata_size``): schema.json's size does not grow with the shards."""

from __future__ import annotations

import json

from helpers import run_benchmark


def test_quick_metadata_benchmark_measures_a_schema_json_of_constant_size(tmp_path):
    result_file = tmp_path / "r.json"
    printed = run_benchmark("benchmarks.metadata_size", "--quick", "--result", str(result_file))
    rows = json.loads(result_file.read_text())["rows"]
    assert [row["shards"] for row in rows] == [4, 5_000]
    few, many = rows
    assert many["schema_bytes"] - few["schema_bytes"] < 256 and many["listed_schema_bytes"] > 100 * many["schema_bytes"]
    assert many["sidecar_bytes_per_shard"] <= 24 and all(row["open_seconds"] > 0 for row in rows)
    assert "open time at" in printed and "shards.npz" in printed
