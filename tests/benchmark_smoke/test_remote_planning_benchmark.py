"""The remote planning benchmark (``benchmarks.remote_planning``) plans its gs:// files with 1 core and with 2, the
2-core runs in a pool of 2 processes, and prints every row; benchmarks.run runs it only when asked."""

from __future__ import annotations

import json
import os

import pytest

from conftest import REPO
from helpers import run_benchmark

ROWS = [
    "== remote planning: 8 hourly NetCDF-4 files on gs:// (storage emulator) ==",
    "as twins, remote probes parse every file",
    "1 core(s)",
    "2 core(s)",
    "1 core / 2 cores:",
    "target remote planning of 8 gs:// files, 1 core / 2 cores:",
    "target launcher RSS growth planning 8 gs:// files, 2 cores:",
]


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="compares planning with 1 core and with 2")
def test_quick_remote_planning_benchmark_plans_with_1_core_and_a_pool_of_2(tmp_path):
    result_file = tmp_path / "remote.json"
    printed = run_benchmark(
        "benchmarks.remote_planning", "--quick", "--repeat", "2", "--workdir", str(tmp_path), "--json", str(result_file)
    )
    for row in ROWS:
        assert row in printed, f"no row {row!r} in:\n{printed}"
    results = json.loads(result_file.read_text())
    assert results["failed"] == [] and results["files"] == 8
    for cores, runs in results["runs"].items():
        assert len(runs) == 2  # alternating: 1 then 2, then 2 then 1
        assert all(r["ok"] and r["probed"] == 8 and r["processes"] == int(cores) for r in runs)
    assert all(r["pool_max_rss"] > 0 for r in results["runs"]["2"])  # the pool's processes ran
    assert all(r["pool_max_rss"] == 0 for r in results["runs"]["1"])  # none started with 1 core
    assert results["ratio"] > 0 and len(results["round_ratios"]) == 2
    assert 0 <= results["twin_share_local"] <= 1


def test_run_includes_the_remote_planning_benchmark_only_when_asked(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO))  # benchmarks/ is not an installed package
    from benchmarks import run

    assert "remote-planning" in run.COMPETITORS and "remote-planning" not in run.DEFAULT_COMPETITORS
