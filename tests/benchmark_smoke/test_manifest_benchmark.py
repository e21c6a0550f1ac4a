"""The manifest benchmark runs end to end on small sizes (``--quick``): its checks hold, its JSON is readable.

No timing or ratio is asserted: the machines that run the tests are shared and noisy.
"""

from __future__ import annotations

import json

from helpers import run_benchmark


def test_quick_manifest_benchmark_compares_formats_clears_outputs_and_reaches_submission(tmp_path):
    result_file = tmp_path / "manifest.json"
    printed = run_benchmark("benchmarks.manifest", "--quick", "--workdir", str(tmp_path), "--json", str(result_file))
    assert "format 1 (every name) vs format 2 (rules)" in printed and "launcher up to submission" in printed
    result = json.loads(result_file.read_text())
    for row in result["formats"]:  # the rules answer owns() as the list of every name did
        assert row["same_answers"] and row["new_bytes"] < 1_000
    assert result["formats"][-1]["old_bytes"] > 100 * result["formats"][-1]["new_bytes"]
    assert [row["new_cleared"] for row in result["overwrite"]] == [True, True]
    assert result["overwrite"][1]["new_requests"] > 0  # (counted by the emulator)
    (launched,) = result["launcher"]
    assert launched["shards"] > 0 and 0 < launched["manifest_bytes"] < 2_000 and launched["submitted_rss"] > 0
