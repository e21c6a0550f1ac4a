"""The side-by-side benchmark runs end to end on tiny data (``--quick``): every row printed, the JSON readable.

No timing is asserted: the machines that run the tests are shared and noisy.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import REPO

pytest.importorskip("psutil", reason="the benchmark measures memory with psutil (test extras)")
pytest.importorskip("xbatcher", reason="the benchmark's naive peer uses xbatcher (test extras)")

ROWS = [
    "floor (numpy, 1 process)",
    "I/O limit (read, write, sync)",
    "pipeline (default runner)",
    "pipeline, 2 workers",
    "naive peer (xbatcher + tf.train)",
    "pipeline start-up (default runner",
    "pipeline start-up (2 workers",
    "python -m pipelines.build --help",
    "the demo build, python -m pipelines.build (median of",
    "patches (1x)",
    "point series (32 steps of t)",
    "same, 32 per record",
    "series per record (output.examples_per_record: 32)",
    "== shard writer",
    "~0.5 KB samples, 32 per record",
    "== targets ==",
]


def test_quick_benchmark_prints_every_row_and_writes_json(tmp_path):
    result_file = tmp_path / "results.json"
    command = [
        sys.executable,
        "-m",
        "benchmarks.run",
        "--quick",
        "--workdir",
        str(tmp_path),
        "--json",
        str(result_file),
    ]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for row in ROWS:
        assert row in result.stdout, f"no row {row!r} in:\n{result.stdout}"
    results = json.loads(result_file.read_text())
    assert results["failed"] == []
    competitors = results["scales"]["1"]["competitors"]
    assert set(competitors) == {"floor", "io-limit", "pipeline", "pipeline-2w", "naive"}
    assert all(row["samples"] > 0 and row["peak_rss"] > 0 for row in competitors.values())
    # The I/O limit moved the inputs' bytes, every one; the demo build ran (its wall is a target).
    assert competitors["io-limit"]["details"]["bytes"] == results["scales"]["1"]["dataset"]["input_bytes"]
    assert results["demo"]["ok"] and len(results["demo"]["runs"]) == 1  # one with --quick
    assert "demo build wall" in {t["name"] for t in results["targets"]}
    # The floor uses the pipeline's encoder, keys and framing: its shards must equal the pipeline's.
    assert results["scales"]["1"]["identical_to_pipeline"] == {"floor": True, "pipeline-2w": True}
    assert {t["status"] for t in results["targets"]} <= {"PASS", "FAIL"}


def test_quick_dask_comparison_builds_identical_shards(tmp_path):
    result_file = tmp_path / "dask.json"
    command = [sys.executable, "-m", "benchmarks.dask_vs_local", "--quick", "--rounds", "1"]
    command += ["--workdir", str(tmp_path), "--json", str(result_file)]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    results = json.loads(result_file.read_text())
    assert results["identical_shards"] is True and results["samples"] > 0
    assert len(results["walls"]["local"]) == len(results["walls"]["dask"]) == 1


def test_quick_zarr_comparison_builds_identical_shards(tmp_path):
    command = [sys.executable, "-m", "benchmarks.zarr_vs_netcdf", "--quick", "--workdir", str(tmp_path)]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for row in ("NetCDF files", "Zarr store", "Zarr / NetCDF", "shards byte-identical: True"):
        assert row in result.stdout, result.stdout


def test_quick_random_access_benchmark_reads_the_same_records_as_array_record(tmp_path):
    command = [sys.executable, "-m", "benchmarks.random_access", "--quick", "--result", str(tmp_path / "r.json")]
    result = subprocess.run([*command, "--build-cost"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    document = json.loads((tmp_path / "r.json").read_text())
    assert document["build_cost"]["ratio"] > 0 and "with the index:" in result.stdout
    results = document["reads"]  # it checked both hold the same records first
    assert [r["name"] for r in results] == ["patches 44 KB", "points 0.5 KB"]
    for row in results:
        assert len(row["per_second"]) == 7 and all(rate > 0 for rate in row["per_second"].values())
        assert f"{row['name']}: single reads" in result.stdout


def test_quick_unit_memory_benchmark_prints_every_row(tmp_path):
    command = [sys.executable, "-m", "benchmarks.unit_memory", "--quick", "--workdir", str(tmp_path)]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for row in [
        "peak RSS of the process, one planned unit",
        "peak RSS, one whole step as one unit (before)",
        "NetCDF-4, contiguous",
        "NetCDF-4, chunked + zlib",
        "classic (CDF-2, records)",
    ]:
        assert row in result.stdout, f"no row {row!r} in:\n{result.stdout}"


SCALE_ROWS = [
    "== many small files vs one file QUICK",
    "build: 12 NetCDF-4 files / same data in 1 file",
    "build, rerun: 12 NetCDF-4 files / same data in 1 file",
    "planning (make_plan): 12 NetCDF-4 files / same data in 1 file",
    "planning a rerun (probe cache): 12 NetCDF-4 files / same data in 1 file",
    "build: 12 netCDF-3 (CDF-2) files / same data in 1 file",
    "planning a rerun (probe cache): 12 netCDF-3 (CDF-2) files / same data in 1 file",
    "_plan_units 16 / 8 files",
    "make_plan after the inventory, 16 / 8 files",
    "planning 12 NetCDF-4 files: gs:// / local",
    "per file on gs:// (ms) / locally",
    "KiB the driver received per file / file size",
    "Zarr all levels, 2 steps of 37 x 40 x 72: MB fetched / MB of chunks needed",
    "Zarr 3 levels, 2 steps of 37 x 40 x 72: peak RSS (GB)",
    "planning 12 netCDF-3 (CDF-2) files: gs:// / local",
    "12 NetCDF-4 files: shards byte-identical to the one file's",
    "launcher peak RSS planning 12 NetCDF-4 files on gs:// (MiB)",
    "KiB per file between 6 and 12 files",
]


def test_quick_many_files_benchmark_prints_every_row(tmp_path):
    result_file = tmp_path / "scale.json"
    command = [sys.executable, "-m", "benchmarks.scale", "--quick", "--workdir", str(tmp_path)]
    command += ["--json", str(result_file), "--parts", "local", "units", "remote", "zarr"]  # graph, dask: below
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for row in SCALE_ROWS:
        assert row in result.stdout, f"no row {row!r} in:\n{result.stdout}"
    results = json.loads(result_file.read_text())
    assert results["failed"] == []
    assert {t["status"] for t in results["targets"]} <= {"PASS", "FAIL"} and len(results["targets"]) == 9
    assert [row["fetched_per_stored"] for row in results["zarr"].values()] == [1.0, 1.0]  # each chunk read once
    many = results["local"]["nc4-12"]["many"]
    assert many["plan"]["files"] == 12 and many["replan"]["cached_probes"] == 12
    assert results["remote"]["nc4"]["socket_bytes"] > 0 and results["remote"]["nc4"]["size_mismatches"] == 0
    assert all(row["max_rss"] > 0 for row in results["remote_memory"].values())


def test_quick_scale_benchmark_prints_the_job_graph_and_dask_rows_against_their_targets(tmp_path):
    result_file = tmp_path / "scale.json"
    command = [sys.executable, "-m", "benchmarks.scale", "--quick", "--parts", "graph", "dask"]
    command += ["--workdir", str(tmp_path), "--json", str(result_file)]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
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
        assert row in result.stdout, f"no row {row!r} in:\n{result.stdout}"
    assert names[f"job graph, {units}"]["value"] == small["graph_mb"] and names[f"job graph, {units}"]["limit"] == 1
    assert names[f"Dask / local runner wall, {dask['units']:,} units"]["limit"] == 1.3
    assert {t["status"] for t in results["targets"]} <= {"PASS", "FAIL"} and len(names) == 7


def test_run_includes_the_many_files_benchmark_only_when_asked(tmp_path, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(REPO))  # benchmarks/ is not an installed package
    from benchmarks import run, scale

    monkeypatch.setattr(scale, "PARTS", ("units",))  # the cheapest part: two planning runs
    result_file = tmp_path / "results.json"
    assert run.main(["--only", "scale", "--quick", "--workdir", str(tmp_path), "--json", str(result_file)]) == 0
    printed = capsys.readouterr().out
    assert "_plan_units 16 / 8 files" in printed and "== targets ==" in printed
    results = json.loads(result_file.read_text())
    assert results["scales"] == {} and results["failed"] == []
    assert [t["name"] for t in results["targets"]] == ["_plan_units 16 / 8 files"]
    assert "scale" not in run.DEFAULT_COMPETITORS


def test_the_io_limit_writes_the_inputs_bytes_over_the_shards_in_turn(tmp_path):
    from benchmarks.io_limit import copy_and_sync

    inputs = []
    for i, size in enumerate((0, 5, 3 * 2**20 + 7)):
        inputs.append(tmp_path / f"in-{i}.nc")
        inputs[-1].write_bytes(bytes([i + 1]) * size)
    result = copy_and_sync(inputs, tmp_path / "out", shards=2)
    assert result["bytes"] == sum(p.stat().st_size for p in inputs)
    written = sorted((tmp_path / "out").iterdir())
    assert [p.read_bytes() for p in written] == [inputs[0].read_bytes() + inputs[2].read_bytes(), b"\2" * 5]
    assert set(result["seconds"]) == {"read", "write", "sync"}


def test_quick_reassembly_benchmark_prints_its_ratios(tmp_path):
    result_file = tmp_path / "reassemble.json"
    command = [sys.executable, "-m", "benchmarks.reassemble", "--quick", "--workdir", str(tmp_path)]
    result = subprocess.run(
        [*command, "--json", str(result_file)], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "reassembly (records -> Zarr) against the build" in result.stdout, result.stdout
    (row,) = json.loads(result_file.read_text())
    assert row["build_s"] > 0 and row["reassemble_s"] > 0 and row["chunk_mb"] > 0 and row["peak_rss_mb"] > 0
    assert (tmp_path / "out" / "quick-patches-4f-reassembled.zarr" / ".zgroup").exists()
