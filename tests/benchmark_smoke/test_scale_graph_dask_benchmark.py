"""The scale benchmark's job-graph and Dask rows (`benchmarks.scale --parts graph dask`) print beside their targets."""

from __future__ import annotations

import json

from helpers import run_benchmark


def test_quick_scale_benchmark_prints_the_job_graph_and_dask_rows_against_their_targets(tmp_path):
    result_file = tmp_path / "scale.json"
    arguments = ["--quick", "--parts", "graph", "dask", "--workdir", str(tmp_path), "--json", str(result_file)]
    printed = run_benchmark("benchmarks.scale", *arguments)
    results = json.loads(result_file.read_text())
    assert results["failed"] == [] and [row["ok"] for row in results["job_graph"]] == [True, True]
    small, large = results["job_graph"]
    assert small["units"] < large["units"] and small["graph_mb"] > 0 and large["peak_rss_gb"] > 0
    (dask,) = results["dask"]
    assert dask["identical_shards"] is True and dask["units"] > 1 and max(dask["dask_tasks"]) > 0
    names = {t["name"]: t for t in results["targets"]}
    units = f"{small['units']:,} units"
    for row in (
        f"job graph (MB), {units}",
        f"dry run of {large['units']:,} units: launcher peak RSS (GB)",
        f"job graph {large['units']:,} / {units}",
        f"Dask (2 workers) / local runner wall, {dask['units']:,} units (medians of 1; byte-identical)",
        f"Dask tasks a unit, {dask['units']:,} units",
    ):
        assert row in printed, f"no row {row!r} in:\n{printed}"
    assert names[f"job graph, {units}"]["value"] == small["graph_mb"] and names[f"job graph, {units}"]["limit"] == 1
    assert names[f"Dask / local runner wall, {dask['units']:,} units"]["limit"] == 1.3
    assert {t["status"] for t in results["targets"]} <= {"PASS", "FAIL"} and len(names) == 7
