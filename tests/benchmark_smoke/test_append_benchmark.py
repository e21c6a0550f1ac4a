"""The append benchmark runs end to end on tiny files (``--quick``): its checks hold, its JSON is readable.

No timing or ratio is asserted: the machines that run the tests are shared and noisy.
"""

from __future__ import annotations

import json

from helpers import run_benchmark


def test_quick_append_benchmark_checks_the_union_and_writes_json(tmp_path):
    result_file = tmp_path / "append.json"
    arguments = ["--quick", "--files", "6", "--added", "2", "--repeat", "1"]
    printed = run_benchmark("benchmarks.append", *arguments, "--workdir", str(tmp_path), "--json", str(result_file))
    assert "target <= 2x" in printed and "target <= 1.05x" in printed
    result = json.loads(result_file.read_text())
    assert result["union_equals_rebuild_samples"] and result["union_equals_rebuild_stats"]
    assert result["old_shards_unchanged"] and result["nothing_said"]
    assert 0 < result["new_shard_bytes"] < result["append_written_bytes"] < result["rebuild_written_bytes"]
