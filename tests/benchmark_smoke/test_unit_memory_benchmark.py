"""The unit-memory benchmark (``benchmarks.unit_memory``) prints every row: one unit's memory, reads on gs://."""

from __future__ import annotations

from helpers import run_benchmark

ROWS = [
    "peak RSS of the process, one planned unit",
    "peak RSS, one whole step as one unit (before)",
    "NetCDF-4, contiguous",
    "NetCDF-4, chunked + zlib",
    "classic (CDF-2, records)",
]


def test_quick_unit_memory_benchmark_prints_every_row(tmp_path):
    printed = run_benchmark("benchmarks.unit_memory", "--quick", "--workdir", str(tmp_path))
    for row in ROWS:
        assert row in printed, f"no row {row!r} in:\n{printed}"
