"""The many-files benchmark (``benchmarks.scale``) runs every part end to end on its tiniest archives."""

from __future__ import annotations

import json

from helpers import run_benchmark

ROWS = [
    "== many small files vs one file QUICK",
    "build: 4 NetCDF-4 files / same data in 1 file",
    "build, rerun: 4 NetCDF-4 files / same data in 1 file",
    "planning (make_plan): 4 NetCDF-4 files / same data in 1 file",
    "planning a rerun (probe cache): 4 NetCDF-4 files / same data in 1 file",
    "_plan_units 4 / 2 files",
    "make_plan after the inventory, 4 / 2 files",
    "planning 4 NetCDF-4 files: gs:// / local",
    "per file on gs:// (ms) / locally",
    "KiB the driver received per file / file size",
    "Zarr all levels, 2 steps of 37 x 40 x 72: MB fetched / MB of chunks needed",
    "Zarr 3 levels, 2 steps of 37 x 40 x 72: peak RSS (GB)",
    "planning 4 netCDF-3 (CDF-2) files: gs:// / local",
    "4 NetCDF-4 files: shards byte-identical to the one file's",
    "launcher peak RSS planning 4 NetCDF-4 files on gs:// (MiB)",
    "KiB per file between 2 and 4 files",
]


def test_quick_many_files_benchmark_prints_every_row(tmp_path):
    """Every part, the netCDF-3 archive planned on gs:// and locally (its local builds run the NetCDF-4 rows' code)."""
    result_file = tmp_path / "scale.json"
    arguments = ["--quick", "--classic", "0", "--workdir", str(tmp_path), "--json", str(result_file)]
    arguments += ["--parts", "local", "units", "remote", "zarr"]  # graph and dask: test_scale_graph_dask_benchmark
    printed = run_benchmark("benchmarks.scale", *arguments)
    for row in ROWS:
        assert row in printed, f"no row {row!r} in:\n{printed}"
    results = json.loads(result_file.read_text())
    assert results["failed"] == []
    assert {t["status"] for t in results["targets"]} <= {"PASS", "FAIL"} and len(results["targets"]) == 9
    assert [row["fetched_per_stored"] for row in results["zarr"].values()] == [1.0, 1.0]  # each chunk read once
    many = results["local"]["nc4-4"]["many"]
    assert many["plan"]["files"] == 4 and many["replan"]["cached_probes"] == 4
    assert list(results["local"]) == ["nc4-4"]  # --classic 0: no local netCDF-3 builds
    for fmt in ("nc4", "nc3"):
        remote = results["remote"][fmt]
        assert remote["files"] == 4 and remote["local"]["files"] == 4  # the classic files planned locally too
        assert remote["socket_bytes"] > 0 and remote["size_mismatches"] == 0
    assert all(row["max_rss"] > 0 for row in results["remote_memory"].values())
