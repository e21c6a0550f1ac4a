"""The reassembly benchmark (``benchmarks.reassemble``) puts records back on the grid and prints its ratios."""

from __future__ import annotations

import json

from helpers import run_benchmark


def test_quick_reassembly_benchmark_prints_its_ratios(tmp_path):
    result_file = tmp_path / "reassemble.json"
    arguments = ["--quick", "--workdir", str(tmp_path), "--json", str(result_file)]
    printed = run_benchmark("benchmarks.reassemble", *arguments)
    assert "reassembly (records -> Zarr) against the build" in printed, printed
    (row,) = json.loads(result_file.read_text())
    assert row["build_s"] > 0 and row["reassemble_s"] > 0 and row["chunk_mb"] > 0 and row["peak_rss_mb"] > 0
    assert (tmp_path / "out" / "quick-patches-4f-reassembled.zarr" / ".zgroup").exists()
