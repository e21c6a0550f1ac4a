"""Planning over many gs:// files with 1 core and with 2 (``python -m benchmarks.remote_planning``).

An hourly reanalysis as planning meets it: N files of one hourly step each (the demo's ERA5-like
variables on 2 levels x 18 x 18, ~28 KB a file, written by the netCDF library), put on the storage
emulator. Each timed run is ``make_plan`` in a fresh interpreter (``run_measured``: the wall and
the peak RSS of its process tree) whose CPU affinity allows it 1 core or 2: with 2, planning probes
the files in a pool of 2 processes (planning.inputs.probe_pool); with 1, in the launcher. The
emulator, which stands for a remote service, is pinned to the same cores as each run (its CPU
seconds are reported): left free, it would run on the core a 1-core run leaves idle. Runs
alternate (1, 2, then 2, 1, ...); the medians give the ratio. Also: the launcher's own peak RSS
growth while it plans, per file (what planning holds of each file, the pool's bytes aside), and
what share of the files a local copy would probe as twins (planning.inputs.twin_probe; remote
probes parse every file, which is what the pool spreads over the cores).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.measure import run_measured
from benchmarks.tables import table
from benchmarks.targets import MAX_REMOTE_PLAN_KIB_PER_FILE, MIN_REMOTE_PLAN_PARALLEL, Target

REPO = Path(__file__).resolve().parents[1]
FILES = 2_100
#: --quick: a smoke test (not a measurement), with the pool made to start on so few files.
QUICK_FILES = 8
CORES = (1, 2)
BUCKET = "xtf-remote-planning"
_MARKER = "archive.json"
KIB = 1024


def ensure_archive(workdir: Path, files: int) -> list[Path]:
    """N hourly files (one step each) under ``workdir/data``, generated unless an identical set is cached there."""
    from pipelines.demo import ArchiveShape, write_archive

    shape = ArchiveShape(num_files=files, steps_per_file=1, levels=2, lat=18, lon=18, hours_per_step=1)
    directory = workdir / "data" / f"remote-planning-{files}f"
    wanted = {"shape": {k: getattr(shape, k) for k in shape.__dataclass_fields__}, "seed": 0}
    marker = directory / _MARKER
    if not (marker.exists() and json.loads(marker.read_text()) == wanted):
        print(f"[remote-planning] generating {files:,} hourly NetCDF-4 files ...", flush=True)
        shutil.rmtree(directory, ignore_errors=True)
        write_archive(directory, shape)
        marker.write_text(json.dumps(wanted))  # last: an interrupted generation is redone, never reused
    return sorted(directory.glob("*.nc"))


def twin_share(paths: list[Path]) -> float:
    """The share of these files a local probe takes as twins of one probed through HDF5."""
    from planning.inputs.local_probe import _probe_serially
    from planning.inputs.twin_probe import Twins

    twins = Twins()
    _probe_serially("time", None, [(str(p), p.stat().st_size) for p in paths], twins)
    return twins.matched / len(paths)


def first_cores(cores: int) -> list[int]:
    """The CPUs a run allowed ``cores`` cores is pinned to, and the storage emulator with it."""
    return sorted(os.sched_getaffinity(0))[:cores]


def plan_child(config_path: str, cores: int, result_path: str, quick: bool) -> None:
    """``make_plan`` in this fresh process, allowed ``cores`` cores; its figures written as JSON."""
    os.sched_setaffinity(0, first_cores(cores))  # first: the pool's processes inherit it
    import planning.plan as plan_module
    from planning.config import load_config
    from planning.inputs import probe
    from transforms.compat.patches import put_in
    from transforms.compat.xarray_dask import DEFER_DASK

    put_in(DEFER_DASK)  # as a build does before it plans (its other patches are Beam's)
    if quick:  # a handful of files: the pool all the same, as many files would have it
        probe.POOL_MIN_FILES, probe.FILES_PER_TASK = 2, 2
    config = load_config(config_path)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * KIB
    started = time.perf_counter()
    plan = plan_module.make_plan(config)
    seconds = time.perf_counter() - started
    result = {
        "plan_seconds": seconds,
        "files": len(plan.sources),
        "probed": sum(probe is not None for _, probe in plan.probes),
        "processes": probe.pool_processes(),
        "rss_before": before,
        # this process's peak (Linux: KiB) and its pool processes' largest
        "max_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * KIB,
        "pool_max_rss": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * KIB,
    }
    Path(result_path).write_text(json.dumps(result))


def _plan(workdir: Path, config: Path, cores: int, quick: bool, timeout: float) -> dict:
    result = workdir / "results" / f"remote-planning-{cores}.json"
    result.unlink(missing_ok=True)
    command = [sys.executable, "-m", "benchmarks.remote_planning", "--child-plan", str(config), str(cores)]
    command += [str(result)] + (["--quick"] if quick else [])
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    measured = run_measured(command, str(REPO), env, timeout)
    if not measured.ok or not result.exists():
        print(measured.output_tail, file=sys.stderr)
        return {"ok": False, "error": measured.output_tail[-2000:]}
    row = json.loads(result.read_text())
    growth = max(0, row["max_rss"] - row["rss_before"])
    return {"ok": True, "tree_peak_rss": measured.peak_rss_bytes, "kib_per_file": growth / KIB / row["files"], **row}


def run(workdir: Path, quick: bool = False, rounds: int = 3, timeout: float = 3600, files: int | None = None) -> dict:
    """Plan N gs:// files ``rounds`` times with each core count, alternating: the results as JSON."""
    import fsspec
    import psutil

    from benchmarks.scale import write_config
    from benchmarks.unit_memory import storage_emulator

    workdir = Path(workdir).resolve()
    (workdir / "results").mkdir(parents=True, exist_ok=True)
    files = files or (QUICK_FILES if quick else FILES)
    paths = ensure_archive(workdir, files)
    results: dict = {
        "files": files,
        "file_bytes": sum(p.stat().st_size for p in paths) / files,
        "quick": quick,
        "cores_allowed": len(os.sched_getaffinity(0)),
        "load_at_start": os.getloadavg()[0],
        "twin_share_local": twin_share(paths),
        "runs": {str(c): [] for c in CORES},
        "failed": [],
    }
    if results["cores_allowed"] < max(CORES):
        results["failed"].append(f"remote planning: needs {max(CORES)} cores, this process may use 1")
        return results
    with storage_emulator(BUCKET) as emulator:
        gcs = fsspec.filesystem("gs", skip_instance_cache=True)
        folder = f"{BUCKET}/hourly-{files}"
        print(f"[remote-planning] uploading {files:,} files to the storage emulator ...", flush=True)
        gcs.put([str(p) for p in paths], [f"{folder}/{p.name}" for p in paths])
        config = write_config(workdir, f"remote-planning-{files}", f"gs://{folder}/*.nc", "unused")
        for round_number in range(max(1, rounds)):
            for cores in CORES if round_number % 2 == 0 else CORES[::-1]:
                # The emulator stands for a storage service, which takes none of the launcher's CPU: left free, it
                # would have the core a 1-core run leaves idle to itself and share the cores of a 2-core run.
                # Pinned to the run's cores, it takes its share of either alike.
                os.sched_setaffinity(emulator.pid, first_cores(cores))
                emulator_cpu = sum(psutil.Process(emulator.pid).cpu_times()[:2])
                row = _plan(workdir, config, cores, quick, timeout)
                row["emulator_cpu"] = sum(psutil.Process(emulator.pid).cpu_times()[:2]) - emulator_cpu
                results["runs"][str(cores)].append(row)
                if not row["ok"]:
                    results["failed"].append(f"remote planning with {cores} core(s)")
                    return results
                print(f"[remote-planning] {cores} core(s): {row['plan_seconds']:.1f} s", flush=True)
        gcs.rm(folder, recursive=True)
    _summarise(results)
    return results


def _summarise(results: dict) -> None:
    walls = {cores: [r["plan_seconds"] for r in runs] for cores, runs in results["runs"].items()}
    results["median"] = {cores: statistics.median(values) for cores, values in walls.items()}
    results["ratio"] = results["median"]["1"] / results["median"]["2"]
    results["round_ratios"] = [one / two for one, two in zip(walls["1"], walls["2"])]
    for cores, runs in results["runs"].items():
        if any(r["probed"] != results["files"] or r["processes"] != int(cores) for r in runs):
            results["failed"].append(f"remote planning with {cores} core(s): not every file probed, or other cores")


def targets(results: dict) -> list[Target]:
    """The parallel speed-up and the launcher's growth per file (at the 2-core runs' largest)."""
    if "ratio" not in results:
        return []
    kib = max(r["kib_per_file"] for r in results["runs"]["2"])
    files = f"{results['files']:,} gs:// files"
    return [
        Target(f"remote planning of {files}, 1 core / 2 cores", results["ratio"], MIN_REMOTE_PLAN_PARALLEL, False),
        Target(f"launcher RSS growth planning {files}, 2 cores", kib, MAX_REMOTE_PLAN_KIB_PER_FILE, True, "KiB/file"),
    ]


def render(results: dict, *, for_docs: bool = False) -> str:
    """The section as printed (``for_docs``: without the run's load)."""
    lines = [f"== remote planning: {results['files']:,} hourly NetCDF-4 files on gs:// (storage emulator) =="]
    if not for_docs:
        lines.append(f"load at start {results['load_at_start']:.1f}, cores allowed {results['cores_allowed']}")
    lines.append(
        f"{results['file_bytes'] / 1e3:.0f} KB a file; a local copy would probe {results['twin_share_local']:.0%} of "
        "them as twins, remote probes parse every file"
    )
    if "ratio" in results:
        rows = []
        for cores, runs in results["runs"].items():
            walls = " ".join(f"{r['plan_seconds']:.1f}" for r in runs)
            rows.append(
                [
                    f"{cores} core(s)",
                    f"{results['median'][cores]:.2f}",
                    f"{1e3 * results['median'][cores] / results['files']:.2f}",
                    walls,
                    f"{max(r['kib_per_file'] for r in runs):.2f}",
                    f"{max(r['pool_max_rss'] for r in runs) / 1e6:.0f}" if cores != "1" else "-",
                    f"{statistics.median(r.get('emulator_cpu', 0.0) for r in runs):.1f}",
                ]
            )
        headers = (
            "planning", "median s", "ms/file", "runs s", "launcher KiB/file", "pool process MB", "emulator CPU-s"
        )  # fmt: skip
        lines.append(table(headers, rows))
        ratios = ", ".join(f"{r:.2f}" for r in results["round_ratios"])
        lines.append(f"1 core / 2 cores: {results['ratio']:.2f}x (medians); by round: {ratios}")
    for target in targets(results):
        lines.append(f"target {target.name}: {target.value:.2f} (limit {target.limit:g}) {target.status}")
    if results["failed"]:
        lines.append("FAILED: " + ", ".join(results["failed"]))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.remote_planning", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few files: a smoke test, not a measurement")
    parser.add_argument("--files", type=int, help=f"files to plan (default {FILES:,})")
    parser.add_argument("--repeat", type=int, default=3, help="runs with each core count, alternating (default 3)")
    parser.add_argument("--workdir", default=str(Path(tempfile.gettempdir()) / "xtf-bench"), help="data and results")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds a planning run may take")
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--child-plan", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child_plan:
        config, cores, result = args.child_plan
        plan_child(config, int(cores), result, args.quick)
        return 0
    results = run(Path(args.workdir), args.quick, args.repeat, args.timeout, args.files)
    results["targets"] = [t.to_json() for t in targets(results)]
    print(render(results))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 1 if results["failed"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
