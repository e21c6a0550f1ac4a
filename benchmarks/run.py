"""Side-by-side benchmark of the build and its reader against a floor and a naive peer (``python -m benchmarks.run``).

Every competitor runs in its own process; wall time and the peak RSS of its process tree are
measured from outside. Datasets are generated once and cached in the work directory.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

from benchmarks import (
    bytecode,
    cost,
    datasets,
    inputs_vs_netcdf,
    measure,
    merge_memory,
    remote_planning,
    report,
    shard_writer,
)
from benchmarks import scale as many_files
from benchmarks.datasets import DatasetSpec
from benchmarks.measure import Measurement, run_measured
from benchmarks.outputs import REPO, input_bytes, same_shards, warm_page_cache

COMPETITORS = (
    "floor",
    "io-limit",
    "pipeline",
    "pipeline-2w",
    "naive",
    "startup",
    "demo",
    "read",
    "help",
    "shard-writer",
    "scale",
    "inputs",
    "remote-planning",
    "cost",
    "merge-memory",
)
#: What runs without --only: "scale" (many small files against one, benchmarks.scale: minutes, and about
#: 1 GB of cached archives), "inputs" (the 1x set as GRIB and as a kerchunk reference,
#: benchmarks.inputs_vs_netcdf: a GRIB copy written once) and "remote-planning" (2,100 gs:// files planned
#: with 1 core and with 2, benchmarks.remote_planning: minutes) and "cost" (three builds on the PortableRunner to
#: gs:// and the ERA5 plan's dry run, priced: benchmarks.cost, minutes) and "merge-memory" (the largest merge on Dask
#: and on the local runner at 200 and 20,000 units, benchmarks.merge_memory: minutes) only when asked for.
ON_REQUEST = ("scale", "inputs", "remote-planning", "cost", "merge-memory")
DEFAULT_COMPETITORS = tuple(c for c in COMPETITORS if c not in ON_REQUEST)
#: Competitors that need the patches archive of every --scales size.
_ON_SCALES = frozenset({"floor", "io-limit", "pipeline", "pipeline-2w", "naive", "startup", "read"})
TWO_WORKERS = ("--direct_num_workers=2", "--direct_running_mode=multi_processing")
#: Batch sizes of the read side: a training-sized batch of big samples, a larger one of small.
READ_BATCH = {"patches": 128, "points": 1024}
READ_ROUNDS = 5
PACKED = 32  # point series per record in the packed read-side set
HELP_RUNS = 3  # one with --quick: a smoke test, not a measurement
#: Timed runs of the demo build (its data written by an untimed one first; one with --quick); the median is kept.
DEMO_RUNS = 3
#: The shard-writer competitor's shard and budget in MB (quick: a smoke test).
SHARD_WRITER_MB = {False: (256, 64), True: (16, 4)}
#: --quick writes the packed shard alone: the other cases run the same code on other record sizes.
QUICK_SHARD_WRITER_CASES = ("packed",)


@dataclasses.dataclass(frozen=True)
class Bench:
    """Where and how competitors run."""

    workdir: Path
    quick: bool
    repeat: int
    naive_files: int
    timeout: float
    selected: frozenset[str]

    @property
    def env(self) -> dict[str, str]:
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
        return env

    def output(self, spec: DatasetSpec, competitor: str) -> Path:
        return self.workdir / "out" / spec.name / competitor

    def result_path(self, spec: DatasetSpec, competitor: str) -> Path:
        return self.workdir / "results" / f"{spec.name}-{competitor}.json"

    def run(self, command: list[str], archive: Path | None = None, output: Path | None = None) -> Measurement:
        """The fastest of ``repeat`` runs (a failed run is returned at once), each from the same start.

        ``output``: the competitor's output, removed before each run (untimed), so that no competitor
        pays for removing an earlier one (the pipeline's of the previous benchmark run used to cost it
        ~1.2 s of --overwrite at 4x, which the floor and the I/O limit, whose outputs are removed at the
        end, never paid); and the disk synced, so that none is slowed by another's writes still pending.
        """
        best = None
        for _ in range(self.repeat):
            if output is not None:
                shutil.rmtree(output, ignore_errors=True)
            os.sync()
            if archive is not None:
                warm_page_cache(archive)
            measurement = run_measured([sys.executable, *command], str(REPO), self.env, self.timeout)
            if not measurement.ok:
                return measurement
            if best is None or measurement.wall_seconds < best.wall_seconds:
                best = measurement
        return best


def summary(label: str, measurement: Measurement, samples: int, nbytes: int, **extra) -> dict:
    """A competitor's row: wall, rates and peak RSS (rates over the full dataset's samples and input)."""
    wall = extra.pop("wall", measurement.wall_seconds)
    row = {
        "label": label,
        "ok": measurement.ok,
        "wall": wall,
        "samples": samples,
        "input_bytes": nbytes,
        "samples_per_second": samples / wall if wall else None,
        "mb_per_second": nbytes / 1e6 / wall if wall else None,
        "peak_rss": measurement.peak_rss_bytes,
        "cpu": list(measurement.cpu),  # (user, system) seconds
        "load": [measurement.load_before, measurement.load_after],
        "note": "",
    }
    row.update(extra)
    if not measurement.ok:
        row["error"] = measurement.output_tail
        print(f"  {label} FAILED (exit {measurement.returncode}):\n{measurement.output_tail}", file=sys.stderr)
    return row


def read_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


def run_floor(bench: Bench, spec: DatasetSpec, archive: Path) -> dict:
    config = datasets.write_config(bench.workdir, spec, archive, bench.output(spec, "floor"))
    result = bench.result_path(spec, "floor")
    command = ["-m", "benchmarks.floor", "--config", str(config), "--result", str(result)]
    measurement = bench.run(command, archive, bench.output(spec, "floor"))
    details = read_json(result) if measurement.ok else {}
    return summary("floor (numpy, 1 process)", measurement, spec.num_samples, input_bytes(archive), details=details)


def run_io_limit(bench: Bench, spec: DatasetSpec, archive: Path) -> dict:
    """Read the inputs, write the same bytes and sync them (benchmarks.io_limit): what any build costs at least."""
    result = bench.result_path(spec, "io-limit")
    command = ["-m", "benchmarks.io_limit", "--inputs", str(archive), "--output", str(bench.output(spec, "io-limit"))]
    command += ["--shards", str(spec.num_shards), "--result", str(result)]
    measurement = bench.run(command, archive, bench.output(spec, "io-limit"))
    details = read_json(result) if measurement.ok else {}
    seconds = details.get("seconds", {})
    note = ", ".join(f"{phase} {value:.1f} s" for phase, value in seconds.items())
    label = "I/O limit (read, write, sync)"
    return summary(label, measurement, spec.num_samples, input_bytes(archive), details=details, note=note)


def run_pipeline(bench: Bench, spec: DatasetSpec, archive: Path, name: str = "pipeline") -> dict:
    two = name.endswith("-2w")
    config = datasets.write_config(bench.workdir, spec, archive, bench.output(spec, name))
    command = ["-m", "pipelines.build", "--config", str(config), "--overwrite", "--quiet"]
    command += TWO_WORKERS if two else []
    measurement = bench.run(command, archive, bench.output(spec, name))
    label = "pipeline, 2 workers" if two else "pipeline (default runner)"
    return summary(label, measurement, spec.num_samples, input_bytes(archive))


def run_naive(bench: Bench, spec: DatasetSpec, archive: Path) -> dict:
    """The naive peer on the first few files, its time scaled to the full set."""
    files = min(bench.naive_files, spec.shape.num_files)
    config = datasets.write_config(bench.workdir, spec, archive, bench.output(spec, "naive"))
    result = bench.result_path(spec, "naive")
    command = ["-m", "benchmarks.naive", "--config", str(config), "--files", str(files), "--result", str(result)]
    measurement = bench.run(command, archive, bench.output(spec, "naive"))
    label = "naive peer (xbatcher + tf.train)"
    if not measurement.ok:
        return summary(label, measurement, spec.num_samples, input_bytes(archive))
    details = read_json(result)
    factor = spec.num_samples / details["samples"]
    # Start-up (imports) is paid once; only the conversion grows with the number of samples.
    wall = measurement.wall_seconds + details["work_seconds"] * (factor - 1)
    note = "not shuffled"
    if factor != 1:
        label += ", estimated"
        note = (
            f"measured on {files}/{spec.shape.num_files} files ({details['samples']:,} samples: "
            f"{measurement.wall_seconds:.1f} s wall, {details['work_seconds']:.1f} s converting), conversion "
            f"time scaled x{factor:.0f}; RSS is the subset's; {note}"
        )
    row = summary(label, measurement, spec.num_samples, input_bytes(archive), wall=wall, details=details)
    row.update(estimated=factor != 1, measured_wall=measurement.wall_seconds, note=note)
    return row


def run_reads(bench: Bench, outputs: dict[str, tuple[Path, str]]) -> dict[str, dict]:
    """Race the two readers on every output in one process: {key: result}."""
    result = bench.workdir / "results" / "read.json"
    rounds = 1 if bench.quick else READ_ROUNDS
    command = ["-m", "benchmarks.readside", "--rounds", str(rounds), "--result", str(result)]
    for output, kind in outputs.values():
        command += ["--dataset", str(output), str(READ_BATCH[kind])]
    measurement = bench.run(command)
    if not measurement.ok:
        return {key: {"ok": False, "error": measurement.output_tail} for key in outputs}
    details = read_json(result)
    return {key: read_summary(details[str(output)], kind, measurement) for key, (output, kind) in outputs.items()}


def read_summary(details: dict, kind: str, measurement: Measurement) -> dict:
    rates = details["examples_per_second"]
    best = {name: max(values) for name, values in rates.items()}
    # The two readers run back to back in each round, so a round's ratio sees one machine load;
    # the median over rounds shrugs off a round that a neighbour disturbed.
    paired = [parser / expert for parser, expert in zip(rates["parser"], rates.get("expert", []))]
    return {
        "ok": True,
        "kind": kind,
        **details,
        "best": best,
        "paired_ratios": paired,
        "ratio": statistics.median(paired) if paired else None,
        "process_wall": measurement.wall_seconds,
        "process_peak_rss": measurement.peak_rss_bytes,
    }


def ensure_pipeline_output(bench: Bench, spec: DatasetSpec, archive: Path) -> Path | None:
    """The pipeline's output of ``spec`` for the read side, built (untimed) if this run did not."""
    output = bench.output(spec, "pipeline")
    if not (output / "schema.json").exists():
        row = run_pipeline(bench, spec, archive)
        if not row["ok"]:
            return None
    return output


def run_scale(bench: Bench, scale: int) -> dict:
    spec = datasets.patches(scale, bench.quick)
    print(f"[{scale}x] dataset {spec.name}: {spec.num_samples:,} samples", flush=True)
    archive = datasets.ensure_archive(bench.workdir, spec)
    section = {"dataset": dataset_info(spec, archive), "competitors": {}}
    runners = {
        "floor": run_floor,
        "io-limit": run_io_limit,
        "pipeline": run_pipeline,
        "pipeline-2w": run_pipeline,
        "naive": run_naive,
    }
    # --repeat N: N rounds, each competitor once a round, so that a slow spell of the shared disk or
    # CPU falls on every competitor of its round alike (N runs of one, then N of the next, let one
    # competitor have a fast spell to itself); each keeps its fastest run, and its walls by round
    once, rounds = dataclasses.replace(bench, repeat=1), bench.repeat
    competitors = section["competitors"]
    for round_number in range(rounds):
        for name, runner in runners.items():
            if name not in bench.selected or (name in competitors and not competitors[name]["ok"]):
                continue  # not chosen, or failed: a failure is reported, never hidden by a later run
            print(f"[{scale}x] {name}{f' (round {round_number + 1}/{rounds})' if rounds > 1 else ''} ...", flush=True)
            args = (name,) if runner is run_pipeline else ()
            row = runner(once, spec, archive, *args)
            kept = competitors.get(name)
            row["walls"] = (kept["walls"] if kept else []) + [row["wall"]]
            if kept and row["ok"] and row["wall"] >= kept["wall"]:
                kept["walls"] = row["walls"]
            else:
                competitors[name] = row
            print(f"[{scale}x] {name}: {row['wall']:.1f} s, {row['peak_rss'] / 1e6:,.0f} MB", flush=True)
    pipeline_out = bench.output(spec, "pipeline")
    section["identical_to_pipeline"] = {
        name: same_shards(bench.output(spec, name), pipeline_out) for name in ("floor", "pipeline-2w")
    }
    for name in ("floor", "io-limit", "pipeline-2w", "naive"):
        shutil.rmtree(bench.output(spec, name), ignore_errors=True)  # at 4x, each is gigabytes
    return section


def dataset_info(spec: DatasetSpec, archive: Path) -> dict:
    return {
        "name": spec.name,
        "files": spec.shape.num_files,
        "shape": dataclasses.asdict(spec.shape),
        "input_bytes": input_bytes(archive),
        "samples": spec.num_samples,
        "num_shards": spec.num_shards,
        "path": str(archive),
    }


def run_startup(bench: Bench) -> dict:
    """The pipeline's fixed cost: a build of a single file (392 samples at full size)."""
    spec = datasets.patches(1, bench.quick, num_files=1)
    archive = datasets.ensure_archive(bench.workdir, spec)
    print(f"[start-up] pipeline on {spec.name} ...", flush=True)
    rows = {name: run_pipeline(bench, spec, archive, name) for name in ("pipeline", "pipeline-2w")}
    shutil.rmtree(bench.workdir / "out" / spec.name, ignore_errors=True)
    return {"dataset": dataset_info(spec, archive), **rows}


def quick_startup(results: dict, scales: list[int]) -> dict | None:
    """In quick mode the dataset is start-up sized already: its pipeline rows stand in (saves two runs)."""
    section = results["scales"][str(scales[0])]
    rows = {name: section["competitors"].get(name) for name in ("pipeline", "pipeline-2w")}
    if None in rows.values():
        return None
    return {"dataset": section["dataset"], "from_scale_rows": True, **rows}


def read_side(bench: Bench, results: dict, scales: list[int]) -> None:
    """Build the point-series set (timed), then race the readers on it and on each scale's patches."""
    spec = datasets.points(bench.quick)
    archive = datasets.ensure_archive(bench.workdir, spec)
    print(f"[read] building {spec.name} ({spec.num_samples:,} samples) with the pipeline ...", flush=True)
    small = {"dataset": dataset_info(spec, archive), "build": run_pipeline(bench, spec, archive)}
    results["read_small"] = small
    outputs = {"points": (bench.output(spec, "pipeline"), "points")} if small["build"]["ok"] else {}
    packed = datasets.points(bench.quick, examples_per_record=PACKED)
    packed_output = bench.workdir / "out" / f"{packed.name}-packed{PACKED}" / "pipeline"
    print(f"[read] building {packed.name} packed {PACKED} to a record ...", flush=True)
    packed_build = run_packed(bench, packed, archive, packed_output)
    if packed_build["ok"]:
        outputs["points_packed"] = (packed_output, "points")
    for scale in scales:
        patches = datasets.patches(scale, bench.quick)
        output = ensure_pipeline_output(bench, patches, datasets.ensure_archive(bench.workdir, patches))
        if output is not None:
            outputs[str(scale)] = (output, "patches")
    print(f"[read] parser vs expert on {len(outputs)} dataset(s) ...", flush=True)
    read = run_reads(bench, outputs) if outputs else {}
    small.update(read.get("points", {"ok": False}))
    results["read_small_packed"] = {"build": packed_build, **read.get("points_packed", {"ok": False})}
    for scale in scales:
        results["scales"][str(scale)]["read"] = read.get(str(scale), {"ok": False})


def run_packed(bench: Bench, spec: DatasetSpec, archive: Path, output: Path) -> dict:
    """Build the packed point series into ``output`` (untimed: only its read speed is compared)."""
    config = datasets.write_config(bench.workdir, spec, archive, output)
    measurement = bench.run(["-m", "pipelines.build", "--config", str(config), "--overwrite", "--quiet"], archive)
    return {"ok": measurement.ok, "error": None if measurement.ok else measurement.output_tail}


def time_demo(bench: Bench) -> dict:
    """The demo build's wall (``python -m pipelines.build`` with no arguments), its data already written."""
    directory = bench.workdir / "demo-build"
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    command = [sys.executable, "-m", "pipelines.build", "--quiet"]
    first = run_measured(command, str(directory), bench.env, bench.timeout)  # writes the demo's archive
    if not first.ok:
        return {"ok": False, "error": first.output_tail}
    if measure.smoke():  # the build ran: nothing is timed in a smoke run
        runs = [first]
    else:
        runs = [
            run_measured(command, str(directory), bench.env, bench.timeout)
            for _ in range(1 if bench.quick else DEMO_RUNS)
        ]
    walls = [r.wall_seconds for r in runs]
    shutil.rmtree(directory, ignore_errors=True)
    return {
        "ok": all(r.ok for r in runs),
        "runs": walls,
        "median": statistics.median(walls),
        "peak_rss": max(r.peak_rss_bytes for r in runs),
        "load": [runs[0].load_before, runs[-1].load_after],
    }


def time_help(bench: Bench) -> dict:
    runs = [
        run_measured([sys.executable, "-m", "pipelines.build", "--help"], str(REPO), bench.env)
        for _ in range(1 if bench.quick else HELP_RUNS)
    ]
    walls = [r.wall_seconds for r in runs]
    return {"ok": all(r.ok for r in runs), "runs": walls, "median": statistics.median(walls)}


def host_info() -> dict:
    versions = {}
    for package in ("apache-beam", "tensorflow-cpu", "numpy", "xarray", "netCDF4", "xbatcher", "protobuf"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = None
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        # Beam imports its GCP clients where they are installed: the [build] install leaves them out, [test] has them.
        "beam_gcp": importlib.util.find_spec("gcsfs") is not None,
        "platform": platform.platform(),
        "load_at_start": os.getloadavg(),
        "versions": versions,
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__.splitlines()[0])
    sizes = parser.add_mutually_exclusive_group()
    sizes.add_argument("--scale", type=int, default=1, help="dataset size: 1 = 48 files, 811 MiB (default); 4 = 4x")
    sizes.add_argument("--scales", type=int, nargs="+", help="several scales in one run, e.g. --scales 1 4")
    parser.add_argument(
        "--workdir", default=str(Path(tempfile.gettempdir()) / "xtf-bench"), help="datasets and outputs"
    )
    parser.add_argument("--quick", action="store_true", help="tiny datasets: a smoke test, not a measurement")
    parser.add_argument(
        "--only",
        nargs="+",
        choices=COMPETITORS,
        help="run only these competitors (scale, inputs, remote-planning, cost, merge-memory: only when named here)",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="runs per competitor (of a scale's, in rounds: each once a round); the fastest is kept, and wall ratios "
        "are the median of the rounds' ratios",
    )
    parser.add_argument("--naive-files", type=int, default=4, help="files the naive peer converts (then scaled)")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds before a competitor is stopped")
    parser.add_argument("--json", help="results file (default: <workdir>/results-<scales>.json)")
    parser.add_argument(
        "--markdown",
        metavar="PAGE",
        help="also write the report as the current table of this docs page, between its benchmark markers "
        "(e.g. docs/performance.md)",
    )
    parser.add_argument("--keep-outputs", action="store_true", help="keep the pipeline's outputs in the workdir")
    return parser.parse_args(argv)


def run_all(bench: Bench, scales: list[int]) -> dict:
    results: dict = {"started": time.strftime("%Y-%m-%dT%H:%M:%S"), "host": host_info(), "scales": {}}
    results["options"] = {
        "quick": bench.quick,
        "repeat": bench.repeat,
        "scales": scales,
        "only": sorted(bench.selected),
    }
    if not measure.smoke():  # every competitor is a fresh interpreter: time what a user's second run does
        results["bytecode"] = bytecode.cache_project_bytecode()
    if "help" in bench.selected:
        results["help"] = time_help(bench)
    if "demo" in bench.selected:
        results["demo"] = time_demo(bench)
    for scale in scales if bench.selected & _ON_SCALES else ():
        results["scales"][str(scale)] = run_scale(bench, scale)
    if "startup" in bench.selected:
        results["startup"] = (bench.quick and quick_startup(results, scales)) or run_startup(bench)
    if "read" in bench.selected:
        read_side(bench, results, scales)
    if "shard-writer" in bench.selected:
        shard_mb, budget_mb = SHARD_WRITER_MB[bench.quick]
        cases = QUICK_SHARD_WRITER_CASES if bench.quick else tuple(c.name for c in shard_writer.CASES)
        results["shard_writer"] = shard_writer.run(
            bench.workdir, shard_mb, budget_mb, bench.repeat, bench.timeout, cases=cases
        )
    if "scale" in bench.selected:
        results["many_files"] = many_files.run(bench.workdir, bench.quick, repeat=bench.repeat, timeout=bench.timeout)
    if "inputs" in bench.selected:
        results["inputs"] = inputs_vs_netcdf.run(bench.workdir, bench.quick, bench.repeat, bench.timeout)
    if "remote-planning" in bench.selected:
        results["remote_planning"] = remote_planning.run(bench.workdir, bench.quick, bench.repeat, bench.timeout)
    if "cost" in bench.selected:
        results["cost"] = cost.run(bench.workdir, bench.quick, bench.timeout)
    if "merge-memory" in bench.selected:
        results["merge_memory"] = merge_memory.run(bench.workdir, bench.quick, timeout=bench.timeout)
    results["targets"] = [t.to_json() for t in report.all_targets(results)]
    return results


def failures(results: dict) -> list[str]:
    rows = [(f"{s}x {n}", r) for s, sec in results["scales"].items() for n, r in sec["competitors"].items()]
    rows += [(f"{s}x read", sec["read"]) for s, sec in results["scales"].items() if "read" in sec]
    rows += [(f"start-up {n}", results["startup"][n]) for n in ("pipeline", "pipeline-2w") if "startup" in results]
    rows += [(name, results[name]) for name in ("read_small", "help", "demo") if name in results]
    failed = [name for name, row in rows if not row.get("ok")]
    failed += shard_writer.failed(results["shard_writer"]) if "shard_writer" in results else []
    failed += results["inputs"]["failed"] if "inputs" in results else []
    failed += results["remote_planning"]["failed"] if "remote_planning" in results else []
    failed += results["cost"]["failed"] if "cost" in results else []
    failed += results["merge_memory"]["failed"] if "merge_memory" in results else []
    return failed + (results["many_files"]["failed"] if "many_files" in results else [])


#: Options whose values are places on the machine that ran the benchmark: left out of the docs' command line.
_LOCAL_OPTIONS = ("--workdir", "--json")


def docs_command(argv: list[str]) -> str:
    """The command line that wrote the docs' table, as a reader would type it: without this machine's folders."""
    kept, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in _LOCAL_OPTIONS:
            skip = True
        elif not arg.startswith(tuple(f"{option}=" for option in _LOCAL_OPTIONS)):
            kept.append(arg)
    return " ".join(["python -m benchmarks.run", *kept])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    scales = args.scales or [args.scale]
    workdir = Path(args.workdir).resolve()
    selected = frozenset(args.only or DEFAULT_COMPETITORS)
    (workdir / "results").mkdir(parents=True, exist_ok=True)
    bench = Bench(workdir, args.quick, max(1, args.repeat), args.naive_files, args.timeout, selected)
    if measure.smoke() and selected & {"naive", "read"}:
        measure.WARM_MODULES.append("tensorflow")  # the naive peer and the read side import it: once
    results = run_all(bench, scales)
    results["failed"] = failures(results)
    if not args.keep_outputs:
        shutil.rmtree(workdir / "out", ignore_errors=True)
    print()
    print(report.render(results))
    suffix = "-quick" if args.quick else ""
    path = Path(args.json) if args.json else workdir / f"results-{'-'.join(map(str, scales))}x{suffix}.json"
    path.write_text(json.dumps(results, indent=2, default=str))
    print(f"\nResults: {path}")
    if args.markdown:
        report.write_markdown(Path(args.markdown), results, docs_command(argv if argv is not None else sys.argv[1:]))
        print(f"Written into {args.markdown}")
    return 1 if results["failed"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
