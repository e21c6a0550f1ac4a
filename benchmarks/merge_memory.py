"""Peak memory of a single merge, Dask against the local runner, at 200 and 20,000 units (``benchmarks.merge_memory``).

Real builds of a tiny-unit archive (a step of a small grid a unit, per-level statistics and
stats.tendency on: two sets of units merged) on the local runner and on Beam's DaskRunner over a
LocalCluster of single-threaded worker processes, at 200 and 20,000 units. Each merge step
(a group's parts merged, the global combine's add, merge and extract: transforms.merging.probe)
records, with XTF_MERGE_MEMORY set in the build and in the Dask workers, the in-memory size of
what it is handed and what it returns; a build's peak is its largest step's. Whole-worker RSS
would mix in reads and encodes: this is the merges' own state.

Prints each runner's peak at each unit count (MB, and the step that held it), Dask/local at each
count (target: within 20%), the growth from the fewest units to the most (O(1), not O(units)),
and whether both runners wrote the same stats.json.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import yaml

from benchmarks import datasets
from benchmarks.dask_vs_local import build_command
from benchmarks.measure import run_measured
from benchmarks.outputs import REPO
from benchmarks.targets import MAX_MERGE_MEMORY_DASK_OVER_LOCAL, Target
from pipelines.demo import ArchiveShape
from transforms.merging import probe

UNIT_COUNTS = (200, 20_000)
QUICK_UNIT_COUNTS = (8, 40)
#: A unit budget of about one step's bytes: each step a unit, and each pair of steps a tendency unit.
UNIT_BUDGET = 1000.0
RUNNERS = ("local", "dask")
MB = 1e6


def archive_spec(units: int) -> datasets.DatasetSpec:
    """An archive of ``units`` steps of a 2-level 4x4 grid (files of 10 steps, 200 from 2,000 units on): one sample
    and one unit a step."""
    steps = min(units, 10) if units < 2_000 else 200
    files = -(-units // steps)
    if files * steps != units:
        raise SystemExit(f"--units {units}: give a multiple of {steps}")
    shape = ArchiveShape(num_files=files, steps_per_file=steps, levels=2, lat=4, lon=4)
    sample = {"window": {"lat": 4, "lon": 4}, "keep": ["level"]}
    return datasets.DatasetSpec(f"merge-{units}u", shape, ("t", "q"), sample, units, 2)


def write_config(workdir: Path, spec: datasets.DatasetSpec, archive: Path, output: Path) -> Path:
    config = {
        "input": {"paths": str(archive / "*.nc"), "concat_dim": "time"},
        "variables": list(spec.variables),
        "sample": spec.sample,
        "stats": {"per": ["level"], "tendency": True},
        "output": {"path": str(output), "num_shards": spec.num_shards},
    }
    path = workdir / "configs" / f"{spec.name}-{output.name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def peaks(folder: Path) -> dict:
    """A build's merge steps: its largest one's bytes and step, and each step's largest."""
    lines = probe.read_measures(folder)
    by_step: dict[str, int] = {}
    for line in lines:
        by_step[line["step"]] = max(by_step.get(line["step"], 0), line["bytes"])
    top = max(lines, key=lambda line: line["bytes"], default=None)
    return {
        "calls": len(lines),
        "peak": top["bytes"] if top else None,
        "step": top["step"] if top else None,
        "held": top["held"] if top else None,
        "by_step": by_step,
    }


def _set_variable(name: str, value: str) -> None:
    os.environ[name] = value


def measure(workdir: Path, counts: Sequence[int], workers: int, timeout: float | None) -> list[dict]:
    """One row per (unit count, runner): the build's merge peaks; one LocalCluster serves every Dask build."""
    from distributed import Client, LocalCluster

    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    cluster = LocalCluster(
        n_workers=workers, processes=True, threads_per_worker=1, dashboard_address=None, silence_logs=logging.ERROR
    )
    rows = []
    try:
        dask = ["--runner=DaskRunner", f"--dask_client_address={cluster.scheduler_address}", "--shared_filesystem"]
        flags = {"local": [], "dask": dask}
        for units in counts:
            spec = archive_spec(units)
            archive = datasets.ensure_archive(workdir, spec)
            for runner in RUNNERS:
                output = workdir / "out" / spec.name / runner
                folder = workdir / "merges" / spec.name / runner
                folder.mkdir(parents=True, exist_ok=True)
                for old in folder.glob("merges-*.jsonl"):
                    old.unlink()
                config = write_config(workdir, spec, archive, output)
                command = build_command(config, *flags[runner], unit_budget=UNIT_BUDGET)
                with Client(cluster) as client:  # the workers measure into this build's folder
                    client.run(_set_variable, probe.ENV, str(folder))
                    print(f"{units:,} units, {runner} runner", flush=True)
                    done = run_measured(command, str(REPO), {**env, probe.ENV: str(folder)}, timeout)
                    client.run(_set_variable, probe.ENV, "")
                row = {"units": units, "runner": runner, "ok": done.ok, "wall": done.wall_seconds}
                if not done.ok:
                    row["error"] = done.output_tail or f"exit status {done.returncode}"
                else:
                    row.update(peaks(folder))
                    row["stats"] = (output / "stats.json").read_text()
                rows.append(row)
    finally:
        cluster.close()
    return rows


def summarize(rows: Sequence[dict]) -> dict:
    """Dask/local at each unit count, and each runner's growth from the fewest units to the most."""
    found = {(row["units"], row["runner"]): row for row in rows if row.get("ok") and row.get("peak")}
    counts = sorted({row["units"] for row in rows})
    ratios = []
    for units in counts:
        local, dask = found.get((units, "local")), found.get((units, "dask"))
        if local and dask:
            same = dask["stats"] == local["stats"]
            ratios.append({"units": units, "dask_over_local": dask["peak"] / local["peak"], "same_stats": same})
    growth = {}
    for runner in RUNNERS:
        low, high = found.get((counts[0], runner)), found.get((counts[-1], runner))
        if low and high:
            growth[runner] = high["peak"] / low["peak"]
    failed = [f"merge memory, {row['units']} units, {row['runner']}" for row in rows if not row.get("ok")]
    return {"ratios": ratios, "growth": growth, "failed": failed}


def targets(results: dict) -> list[Target]:
    """Dask's and the local runner's largest merge within 20% of each other (either way), at each unit count."""
    found = []
    for ratio in results["ratios"]:
        value = ratio["dask_over_local"] if ratio["same_stats"] else None  # (different statistics: no result)
        apart = max(value, 1 / value) if value else None
        name = f"merge peak, Dask vs local runner (larger / smaller), {ratio['units']:,} units"
        found.append(Target(name, apart, MAX_MERGE_MEMORY_DASK_OVER_LOCAL, True))
    return found


def render(results: dict, *, for_docs: bool = False) -> str:
    """The section as printed (``for_docs``: the same; nothing of the run's machine is in it)."""
    lines = ["== the largest single merge (statistics, tendency, counts), Dask and local runner =="]
    lines.append(f"{'units':>8}  {'runner':<7}{'peak merge':>12}  {'step':<14}{'held on entry':>14}{'calls':>8}")
    for row in results["rows"]:
        if not row.get("ok"):
            lines.append(f"{row['units']:>8,}  {row['runner']:<7}  FAILED: {row.get('error', '')[-300:]}")
            continue
        lines.append(
            f"{row['units']:>8,}  {row['runner']:<7}{row['peak'] / MB:>9.3f} MB  {row['step']:<14}"
            f"{row['held'] / MB:>11.3f} MB{row['calls']:>8,}"
        )
    for ratio in results["ratios"]:
        same = "identical" if ratio["same_stats"] else "DIFFERENT"
        units = ratio["units"]
        lines.append(f"Dask / local merge peak, {units:,} units: {ratio['dask_over_local']:.2f}x (stats.json {same})")
    counts = sorted({row["units"] for row in results["rows"]})
    for runner, growth in results["growth"].items():
        lines.append(f"{runner} merge peak, {counts[-1]:,} / {counts[0]:,} units: {growth:.2f}x")
    for target in targets(results):
        value = "n/a" if target.value is None else f"{target.value:.2f}x"
        lines.append(f"target: {target.name}: {value} <= {target.limit:g}x {target.status}")
    return "\n".join(lines)


def run(
    workdir: Path, quick: bool, workers: int = 2, timeout: float | None = None, counts: Sequence[int] | None = None
) -> dict:
    """Every build measured, summarized and printed; the results (JSON-ready)."""
    rows = measure(workdir, counts or (QUICK_UNIT_COUNTS if quick else UNIT_COUNTS), workers, timeout)
    results = {"rows": rows, **summarize(rows)}
    results["rows"] = [{k: v for k, v in row.items() if k != "stats"} for row in rows]
    print(render(results), flush=True)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.merge_memory", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny data: a smoke test, not a measurement")
    parser.add_argument("--workers", type=int, default=2, help="Dask worker processes, one thread each")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds before a build is stopped")
    parser.add_argument("--workdir", default=str(Path(tempfile.gettempdir()) / "xtf-bench"))
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--units", type=int, nargs="+", help=f"unit counts to build (default: {UNIT_COUNTS})")
    args = parser.parse_args(argv)
    results = run(Path(args.workdir).resolve(), args.quick, args.workers, args.timeout, args.units)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 1 if results["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
