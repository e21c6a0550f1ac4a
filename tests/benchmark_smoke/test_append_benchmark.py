"""The append benchmark runs end to end on tiny files (``--quick``): its checks hold, its JSON is readable.

No timing or ratio is asserted: the machines that run the tests are shared and noisy.
"""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import REPO


def test_quick_append_benchmark_checks_the_union_and_writes_json(tmp_path):
    result_file = tmp_path / "append.json"
    command = [sys.executable, "-m", "benchmarks.append", "--quick", "--files", "6", "--added", "2", "--repeat", "1"]
    command += ["--workdir", str(tmp_path), "--json", str(result_file)]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "target <= 2x" in done.stdout and "target <= 1.05x" in done.stdout
    result = json.loads(result_file.read_text())
    assert result["union_equals_rebuild_samples"] and result["union_equals_rebuild_stats"]
    assert result["old_shards_unchanged"] and result["nothing_said"]
    assert 0 < result["new_shard_bytes"] < result["append_written_bytes"] < result["rebuild_written_bytes"]
