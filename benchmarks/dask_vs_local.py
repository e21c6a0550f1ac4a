"""The build on a Dask cluster against the local runner, on one archive (``python -m benchmarks.dask_vs_local``).

A LocalCluster of single-threaded worker processes (Dask's statistical profiler off, as the docs
advises for a cluster that builds; ``--worker-profiler`` keeps it) is started once and warmed with one
untimed build (its workers import Beam and xarray once, as a long-lived HPC cluster's would).
Then builds alternate, each ``python -m pipelines.build`` in its own process: the local default
runner, and DaskRunner with --shared_filesystem (records written in place, as locally). Prints
each one's median wall time, their ratio, and whether every shard is byte-identical.
Memory is not compared: the Dask workers live outside the measured process tree.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from benchmarks import datasets
from benchmarks.measure import run_measured
from benchmarks.outputs import REPO, input_bytes, same_shards, warm_page_cache
from benchmarks.targets import MAX_DASK_OVER_LOCAL, MAX_DASK_TASKS_PER_UNIT, Target

DEFAULT_FILES = 12  # a quarter of the 1x patches set: ~200 MB, 4,704 samples


#: ``python -c`` program: pipelines.build with another unit budget (the first argument), to get more, smaller units.
_WITH_BUDGET = (
    "import functools, sys; from pipelines import graph; from planning.plan import make_plan; "
    "graph.make_plan = functools.partial(make_plan, unit_budget_bytes=float(sys.argv.pop(1))); "
    "from pipelines.build import main; sys.exit(main(sys.argv[1:]))"
)


def build_command(config: Path, *flags: str, unit_budget: float | None = None) -> list[str]:
    arguments = ["--config", str(config), "--overwrite", "--quiet", *flags]
    if unit_budget is None:
        return [sys.executable, "-m", "pipelines.build", *arguments]
    return [sys.executable, "-c", _WITH_BUDGET, str(unit_budget), *arguments]


def count_units(config: Path, unit_budget: float | None) -> int:
    from planning.config import load_config
    from planning.plan import UNIT_BUDGET_BYTES, make_plan

    return len(make_plan(load_config(str(config)), unit_budget_bytes=unit_budget or UNIT_BUDGET_BYTES).units)


def compare(
    workdir: Path,
    spec: datasets.DatasetSpec,
    budgets: Sequence[float | None],
    workers: int = 2,
    rounds: int = 3,
    flags: Sequence[str] = (),
    warm: bool = True,
    timeout: float | None = None,
    worker_profiler: bool = False,
) -> list[dict]:
    """One row per unit budget: each runner's wall times (alternating builds), their medians' ratio, the Dask tasks
    per unit and whether every shard is byte-identical. One LocalCluster serves every budget.

    ``worker_profiler``: keep Dask's statistical profiler on in the workers; off by default, as the docs
    advises for a cluster that builds (it takes the worker's GIL 100 times a second).
    """
    import dask
    from distributed import Client, LocalCluster, get_task_stream

    archive = datasets.ensure_archive(workdir, spec)
    outputs = {name: workdir / "out" / spec.name / name for name in ("local", "dask")}
    configs = {name: datasets.write_config(workdir, spec, archive, output) for name, output in outputs.items()}
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    with dask.config.set({"distributed.worker.profile.enabled": worker_profiler}):  # the workers start with it
        cluster = LocalCluster(
            n_workers=workers, processes=True, threads_per_worker=1, dashboard_address=None, silence_logs=logging.ERROR
        )
    rows = []
    try:
        dask = ["--runner=DaskRunner", f"--dask_client_address={cluster.scheduler_address}", "--shared_filesystem"]
        dask += flags
        for budget in budgets:
            commands = {
                "local": build_command(configs["local"], unit_budget=budget),
                "dask": build_command(configs["dask"], *dask, unit_budget=budget),
            }
            units = count_units(configs["local"], budget)
            print(f"{spec.name}: {spec.num_samples:,} samples, {input_bytes(archive) / 1e6:,.0f} MB, {units:,} units")
            if warm:  # the workers import Beam and xarray once, as a long-lived cluster's have
                print("  warming the cluster", flush=True)
                warming = run_measured(commands["dask"], str(REPO), env, timeout)
                if not warming.ok:
                    rows.append({"units": units, "unit_budget": budget, "ok": False, "error": warming.output_tail})
                    continue
                warm = False
            walls: dict[str, list[float]] = {"local": [], "dask": []}
            tasks: list[int] = []
            error: str | None = None
            for round_ in range(rounds):
                for name, command in commands.items():
                    warm_page_cache(archive)
                    with Client(cluster) as client, get_task_stream(client) as stream:
                        measurement = run_measured(command, str(REPO), env, timeout)
                    if not measurement.ok:
                        error = measurement.output_tail or f"{name} build: exit status {measurement.returncode}"
                        break
                    if name == "dask":
                        tasks.append(len(stream.data))
                    walls[name].append(measurement.wall_seconds)
                    print(f"  round {round_ + 1}: {name} {measurement.wall_seconds:.1f} s", flush=True)
                if error is not None:
                    break
            if error is not None:
                rows.append({"units": units, "unit_budget": budget, "ok": False, "error": error})
                continue
            medians = {name: statistics.median(values) for name, values in walls.items()}
            rows.append(
                {
                    "ok": True,
                    "dataset": spec.name,
                    "samples": spec.num_samples,
                    "input_bytes": input_bytes(archive),
                    "workers": workers,
                    "units": units,
                    "unit_budget": budget,
                    "dask_tasks": tasks,
                    "dask_tasks_per_unit": max(tasks) / max(units, 1),
                    "dask_flags": list(flags),
                    "worker_profiler": worker_profiler,
                    "walls": walls,
                    "medians": medians,
                    "dask_over_local": medians["dask"] / medians["local"],
                    "identical_shards": same_shards(outputs["dask"], outputs["local"]),
                }
            )
    finally:
        cluster.close()
    return rows


def targets(rows: Sequence[dict]) -> list[Target]:
    """Dask/local wall and Dask tasks per unit, each size; and every Dask output byte-identical to the local one."""
    found = []
    for row in rows:
        ok = row.get("ok") and row.get("identical_shards")
        what = f"{row['units']:,} units"
        ratio = row["dask_over_local"] if ok else None
        found.append(Target(f"Dask / local runner wall, {what}", ratio, MAX_DASK_OVER_LOCAL, True))
        per_unit = row["dask_tasks_per_unit"] if ok else None
        found.append(Target(f"Dask tasks a unit, {what}", per_unit, MAX_DASK_TASKS_PER_UNIT, True, "tasks"))
    return found


def report_rows(rows: Sequence[dict], by_name: dict[str, Target]) -> list[list[str]]:
    """The rows of benchmarks.scale's table: (what, value, against, ratio, target, result)."""
    out = []
    for row in rows:
        what = f"{row['units']:,} units"
        if not row.get("ok"):
            out.append([f"Dask / local runner, {what}: build", "FAILED", "-", "-", "-", ""])
            continue
        wall, tasks = by_name.get(f"Dask / local runner wall, {what}"), by_name.get(f"Dask tasks a unit, {what}")
        same = "byte-identical" if row["identical_shards"] else "shards DIFFERENT"
        rounds = len(row["walls"]["dask"])
        out.append(
            [
                f"Dask ({row['workers']} workers) / local runner wall, {what} (medians of {rounds}; {same})",
                f"{row['medians']['dask']:.2f}",
                f"{row['medians']['local']:.2f}",
                f"{row['dask_over_local']:.2f}",
                f"<= {wall.limit:g}x" if wall else "-",
                wall.status if wall else "",
            ]
        )
        out.append(
            [
                f"  Dask tasks a unit, {what}",
                f"{max(row['dask_tasks']):,}",
                f"{row['units']:,}",
                f"{row['dask_tasks_per_unit']:.2f}",
                f"<= {tasks.limit:g}" if tasks else "-",
                tasks.status if tasks else "",
            ]
        )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.dask_vs_local", description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=DEFAULT_FILES, help="files of the patches archive (1x: 48)")
    parser.add_argument("--workers", type=int, default=2, help="Dask worker processes, one thread each")
    parser.add_argument("--rounds", type=int, default=3, help="timed builds per runner (alternating)")
    parser.add_argument("--quick", action="store_true", help="tiny data: a smoke test, not a measurement")
    parser.add_argument("--workdir", default=str(Path(tempfile.gettempdir()) / "xtf-bench"))
    parser.add_argument("--json", help="write the results here")
    parser.add_argument(
        "--unit-budget", type=float, help="bytes a unit may take (default 64e6): lower it for more, smaller units"
    )
    parser.add_argument(
        "--dask-flag", action="append", default=[], help="another flag for the Dask build, e.g. --dask_npartitions=4"
    )
    parser.add_argument(
        "--worker-profiler",
        action="store_true",
        help="keep Dask's statistical profiler on in the workers (Dask's default)",
    )
    args = parser.parse_args(argv)
    spec = datasets.patches(1, args.quick, num_files=None if args.quick else args.files)
    workdir = Path(args.workdir).resolve()
    (results,) = compare(
        workdir,
        spec,
        [args.unit_budget],
        args.workers,
        args.rounds,
        args.dask_flag,
        worker_profiler=args.worker_profiler,
    )
    if not results["ok"]:
        print(results["error"], file=sys.stderr)
        return 1
    medians, identical, tasks, units = (results[k] for k in ("medians", "identical_shards", "dask_tasks", "units"))
    print(
        f"local runner {medians['local']:.1f} s, Dask ({args.workers} workers) {medians['dask']:.1f} s: "
        f"Dask/local = {results['dask_over_local']:.2f}x (medians of {args.rounds}); identical shards: {identical}; "
        f"{max(tasks):,} Dask tasks for {units:,} units ({results['dask_tasks_per_unit']:.2f} a unit)"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0 if identical else 1


if __name__ == "__main__":
    raise SystemExit(main())
