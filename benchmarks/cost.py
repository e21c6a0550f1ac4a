"""What a full-scale build costs, term by term (``python -m benchmarks.cost``).

Three sizes of the benchmark's patches archive are built the way Dataflow runs them: Beam's PortableRunner
(an embedded job server, LOOPBACK workers; the proto Dataflow's Runner v2 executes) to a gs:// output on the
storage emulator, where the workers share no filesystem and records go through spill objects. Measured per
build:

- bytes through the runner's shuffle: for each GroupByKey of the job's proto (Reshuffles and combines
  included), its input's element count times the mean encoded size the runner's SDK harness sampled
  (``beam:metric:element_count:v1`` and ``beam:metric:sampled_byte_size:v1``, the figures Dataflow itself
  reports for a PCollection): what a shuffle service receives;
- GCS operations, objects and bytes, from the emulator's own request log (tests/gcs_emulator.py), by what
  they touch (spill objects, the run's other working files, the output); class A = writes, copies, lists,
  class B = reads, deletes free; a batch's nested requests count each;
- intermediate objects and bytes (everything written under the output's ``_tmp/``), and what is left there
  after the commit;
- CPU seconds of the build's process tree (the emulator's own aside: it stands for the storage service).

Each size is built twice: with the default write-time shuffle (spill objects), and with shuffle.mode: read (no
shuffle: each shard written whole from its run of units, straight to gs://), whose bill is its own column.

Each quantity is fitted linearly (least squares) in what drives it: output bytes, units, shards or the
references a GroupByKey carries; the fits are carried to the ARCO-ERA5 1940-2024 plan, whose units,
shards, samples and bytes come from a dry run of the metadata-only store (benchmarks.job_graph), and
priced at the table below.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

from benchmarks.measure import run_captured, run_measured
from benchmarks.tables import table
from benchmarks.targets import Target

# List prices in USD (Dataflow batch and Cloud Storage Standard, us-central1): edit them for your region
# and contract. Dataflow Shuffle is billed per GB it processes.
VCPU_HOUR = 0.056
MEMORY_GB_HOUR = 0.003557
SHUFFLE_GB = 0.011
STORAGE_GB_MONTH = 0.020
CLASS_A_PER_10K = 0.05
CLASS_B_PER_10K = 0.004
#: The workers the bill assumes: memory per vCPU (n1-standard) and the job's vCPUs (its wall, which is how
#: long the intermediate objects are stored, is the CPU hours over these).
MEMORY_GB_PER_VCPU = 3.75
JOB_VCPUS = 1_000
HOURS_PER_MONTH = 730

#: The runner-shuffle path (before spill objects): every record's bytes through the GroupByKey, measured at
#: 1.0000-1.032x the output's bytes; the lower bound is carried.
RUNNER_SHUFFLE_OVER_OUTPUT = 1.0

#: Targets (issue 43, item 8).
MAX_SHUFFLE_SHARE = 0.01
MAX_INTERMEDIATE_OVER_OUTPUT = 1.1
MAX_BILL_USD = 1_500.0
MAX_NO_SHUFFLE_BILL_USD = 500.0

PORTABLE = ["--runner=PortableRunner", "--job_endpoint=embed", "--environment_type=LOOPBACK"]
REPO = Path(__file__).resolve().parents[1]
BUCKET = "xtf-cost"
#: Where the archives are put: their reads are the source's (a public dataset's owner pays them), not the bill's.
INPUT = "input"
GB = 1e9
#: Files of the patches archive at each size (the benchmark's 1x is 48 files, 811 MB), and its shards.
SIZES = ((6, 2), (24, 6), (48, 12))
QUICK_SIZES = ((2, 2), (4, 3), (8, 4))
#: The ERA5 plan's dry run: the whole record; --quick: a day, its counts scaled to the record's steps.
QUICK_PLAN_STEPS = 24
GROUP_BY_KEY = "beam:transform:group_by_key:v1"
ELEMENT_COUNT = "beam:metric:element_count:v1"
SAMPLED_BYTES = "beam:metric:sampled_byte_size:v1"
#: The write stage's GroupByKey: it carries (shard, spilled bucket) references, one per block and shard.
WRITE_GROUP = "GroupByShard"
#: What each write path costs that the plan does not; the last is shuffle.mode: read's.
PATHS = ("spill objects", "runner shuffle (before)", "no shuffle")
#: The config's shuffle.mode of each measured path: the default's runs, and the no-shuffle mode's.
WRITE_MODE, NO_SHUFFLE_MODE = "write", "read"


# ---------------------------------------------------------------- in the build's process


def build_child(config: str, result_path: str) -> None:
    """Build ``config`` on the PortableRunner; write the runner's figures for each GroupByKey's input."""
    from apache_beam.runners.portability.fn_api_runner import fn_runner

    from pipelines.build import main

    ran = []
    run_via_runner_api = fn_runner.FnApiRunner.run_via_runner_api

    def keeping(runner, pipeline_proto, options):  # the job server's runner: the proto it runs, its result
        result = run_via_runner_api(runner, pipeline_proto, options)
        ran.append((pipeline_proto, result))
        return result

    fn_runner.FnApiRunner.run_via_runner_api = keeping
    if main(["--config", config, "--quiet", *PORTABLE]) != 0:
        raise SystemExit(1)
    proto, result = ran[-1]
    Path(result_path).write_text(json.dumps(shuffled(proto, result.monitoring_infos())))


def shuffled(proto, infos) -> dict[str, dict]:
    """{GroupByKey label: {elements, bytes}}: each GroupByKey's input as the runner counted and sampled it."""
    from apache_beam.metrics import monitoring_infos

    counts, sizes = {}, {}
    for info in infos:
        pcollection = info.labels.get("PCOLLECTION")
        if info.urn == ELEMENT_COUNT and pcollection:
            counts[pcollection] = counts.get(pcollection, 0) + monitoring_infos.extract_counter_value(info)
        elif info.urn == SAMPLED_BYTES and pcollection:
            count, total, _, _ = monitoring_infos.extract_distribution(info)
            old = sizes.get(pcollection, (0, 0))
            sizes[pcollection] = (old[0] + total, old[1] + count)
    out = {}
    for transform in proto.components.transforms.values():
        if transform.spec.urn != GROUP_BY_KEY:
            continue
        (source,) = transform.inputs.values()
        elements = counts.get(source, 0)
        total, sampled = sizes.get(source, (0, 0))
        out[transform.unique_name] = {"elements": elements, "bytes": elements * total / sampled if sampled else 0}
    return out


def plan_child(steps: int, workdir: str, result_path: str) -> None:
    """A dry run of the ARCO-ERA5-shaped metadata store of ``steps`` hours: its units, shards, samples, bytes."""
    import yaml

    from benchmarks.job_graph import patches_config, write_metadata_store
    from pipelines.graph import run_build
    from planning.config import load_config
    from planning.sizing import record_bytes_bound

    store = Path(workdir) / f"metadata-{steps}.zarr"
    if not (store / "zarr.json").exists():
        write_metadata_store(store, steps)
    config = Path(workdir) / f"cost-metadata-{steps}.yaml"
    config.write_text(yaml.safe_dump(patches_config(store, Path(workdir) / f"cost-out-{steps}")))
    plan, _ = run_build(load_config(config), ["--dry_run=True"])
    record = record_bytes_bound(plan.schema.features, 1)
    result = {
        "steps": steps,
        "units": len(plan.units),
        "shards": plan.num_shards,
        "samples": plan.num_samples,
        "output_bytes": plan.num_samples * record,
    }
    Path(result_path).write_text(json.dumps(result))


# ---------------------------------------------------------------- the emulator's requests


def gcs_operations(lines: list[dict], output: str) -> dict[str, dict[str, float]]:
    """Class A and B operations, and bytes written, by what they touch: spill, run files, output, other."""
    tally: dict[str, dict[str, float]] = {}
    for row in lines:
        for name, kind in _operations(row):
            if kind is None:
                continue
            what = _what(name, output)
            counts = tally.setdefault(what, {"A": 0, "B": 0, "written": 0})
            counts[kind] += 1
        if row["method"] in ("POST", "PUT") and row["path"].startswith("/upload/") and row["name"]:
            tally.setdefault(_what(row["name"], output), {"A": 0, "B": 0, "written": 0})["written"] += row["received"]
    return tally


def _operations(row: dict):
    """(object name, class) of each operation in a logged request (a batch: each nested one's)."""
    from urllib.parse import unquote, urlparse

    if row["nested"]:
        for method, url in row["nested"]:
            path = urlparse(url).path
            name = unquote(path.split("/o/", 1)[1].split("/copyTo/", 1)[0]) if "/o/" in path else ""
            yield name, _class(method, path)
        return
    name = row["name"] or ""
    if row["path"].endswith("/o") and row["method"] == "GET":  # a listing: what it lists
        name = row["query"].get("prefix", "")
    yield name, _class(row["method"], row["path"])


def _class(method: str, path: str) -> str | None:
    """GCS's operation class: A writes, copies, moves and lists; B reads an object or its metadata; deletes free."""
    if method == "DELETE":
        return None
    if method in ("POST", "PUT", "PATCH") or (method == "GET" and path.endswith("/o")):
        return "A"
    return "B"


def _what(name: str, output: str) -> str:
    prefix = output.split("/", 3)[3] if output.startswith("gs://") else output
    if ".spill" in name:
        return "spill"
    if name.startswith(f"{INPUT}/"):
        return "input"
    if name.startswith(f"{prefix}/_tmp/"):
        return "run files"
    if name.startswith(prefix):
        return "output"
    return "other"


def intermediate_objects(lines: list[dict], output: str) -> set[str]:
    """The distinct objects written under the output's ``_tmp/`` (a temporary and its renamed object count once)."""
    from planning.run.names import TEMPORARY_MARK

    prefix = output.split("/", 3)[3] + "/_tmp/"
    names = set()
    for row in lines:
        if (
            row["method"] in ("POST", "PUT")
            and row["path"].startswith("/upload/")
            and (row["name"] or "").startswith(prefix)
        ):
            names.add(row["name"].split(TEMPORARY_MARK, 1)[0])
    return names


# ---------------------------------------------------------------- the runs


def _build(
    workdir: Path, files: int, shards: int, quick: bool, log: Path, timeout: float, mode: str = WRITE_MODE
) -> dict:
    import fsspec
    import yaml

    from benchmarks.datasets import ensure_archive, input_files, patches, write_config
    from schemas import load_schema

    spec = patches(1, quick, num_files=files)
    spec = dataclasses.replace(spec, num_shards=shards)
    archive = ensure_archive(workdir, spec)
    gcs = fsspec.filesystem("gs", skip_instance_cache=True)
    source = f"{BUCKET}/{INPUT}/{spec.name}"
    paths = input_files(archive)
    gcs.put([str(p) for p in paths], [f"{source}/{p.name}" for p in paths])
    name = spec.name if mode == WRITE_MODE else f"{spec.name}-{mode}"
    output = f"gs://{BUCKET}/cost/{name}"
    config = write_config(workdir, spec, archive, Path(spec.name))
    as_dict = yaml.safe_load(config.read_text())
    as_dict["input"]["paths"], as_dict["output"]["path"] = f"gs://{source}/*.nc", output
    as_dict["shuffle"] = {**(as_dict.get("shuffle") or {}), "mode": mode}
    config = config.with_name(f"{name}-cost.yaml")
    config.write_text(yaml.safe_dump(as_dict, sort_keys=False))
    result = workdir / "results" / f"cost-{name}.json"
    result.unlink(missing_ok=True)
    start = log.stat().st_size if log.exists() else 0
    command = [sys.executable, "-m", "benchmarks.cost", "--child-build", str(config), str(result)]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    measured = run_measured(command, str(REPO), env, timeout)
    row = {"name": spec.name, "files": files, "mode": mode, "ok": measured.ok and result.exists()}
    if not row["ok"]:
        print(measured.output_tail, file=sys.stderr)
        return {**row, "error": measured.output_tail[-2000:]}
    with open(log) as f:
        f.seek(start)
        lines = [json.loads(line) for line in f]
    schema = load_schema(output)
    groups = json.loads(result.read_text())
    written = [s for split in schema.splits.values() for s in split]
    tmp = f"{output}/_tmp"
    left = gcs.find(tmp) if gcs.exists(tmp) else []
    operations = gcs_operations(lines, output)
    intermediates = intermediate_objects(lines, output)
    row.update(
        output_bytes=sum(s.bytes for s in written),
        samples=sum(s.examples or s.records for s in written),
        shards=len(written),
        units=_units(groups),
        references=groups.get(_label(groups, WRITE_GROUP), {}).get("elements", 0),
        shuffle=groups,
        shuffle_bytes=sum(g["bytes"] for g in groups.values()),
        operations=operations,
        intermediate_objects=len(intermediates),
        intermediate_bytes=sum(v["written"] for k, v in operations.items() if k in ("spill", "run files")),
        spill_bytes=operations.get("spill", {}).get("written", 0),
        left_after_commit=len(left),
        cpu_seconds=sum(measured.cpu),
        wall=measured.wall_seconds,
    )
    gcs.rm(output, recursive=True)
    gcs.rm(source, recursive=True)
    return row


def _label(groups: dict, name: str) -> str:
    return next((label for label in groups if name in label), "")


def _units(groups: dict) -> int:
    """The build's units: what its SpreadUnits' Reshuffle carried after the fan-out (one element a unit); without
    one (shuffle.mode: read, whose shards cut their units), the unit summaries its statistics grouped."""
    label = _label(groups, "SpreadUnits") or _label(groups, "GroupUnits")
    return groups.get(label, {}).get("elements", 0)


def _plan(workdir: Path, quick: bool, timeout: float) -> dict:
    from benchmarks.job_graph import RECORD_STEPS

    steps = QUICK_PLAN_STEPS if quick else RECORD_STEPS
    result = workdir / "results" / f"cost-plan-{steps}.json"
    command = [sys.executable, "-m", "benchmarks.cost", "--child-plan", str(steps), str(workdir), str(result)]
    done = run_captured(command, cwd=str(REPO), timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"the ERA5 plan's dry run failed: {done.stderr[-2000:]}")
    plan = json.loads(result.read_text())
    factor = RECORD_STEPS / steps  # (1 unless --quick: the day's counts carried to the record's steps)
    scaled = {k: round(plan[k] * factor) for k in ("units", "shards", "samples", "output_bytes")}
    return {**scaled, "steps": RECORD_STEPS, "dry_run_steps": steps}


def run(workdir: Path, quick: bool = False, timeout: float = 3600) -> dict:
    """Build the three sizes, fit, carry to the ERA5 plan and price: the results as JSON."""
    from benchmarks.unit_memory import storage_emulator

    workdir = Path(workdir).resolve()
    (workdir / "results").mkdir(parents=True, exist_ok=True)
    log = workdir / "results" / "cost-requests.jsonl"
    log.unlink(missing_ok=True)
    results: dict = {"quick": quick, "runs": [], "no_shuffle_runs": [], "failed": []}
    with storage_emulator(BUCKET, log):
        for files, shards in QUICK_SIZES if quick else SIZES:
            for mode, runs in ((WRITE_MODE, results["runs"]), (NO_SHUFFLE_MODE, results["no_shuffle_runs"])):
                print(
                    f"[cost] building {files} files, shuffle.mode {mode}, on the PortableRunner to gs:// ...",
                    flush=True,
                )
                row = _build(workdir, files, shards, quick, log, timeout, mode)
                runs.append(row)
                if not row["ok"]:
                    results["failed"].append(f"cost: the build of {files} files, shuffle.mode {mode}")
                    return results
    print("[cost] the ERA5 1940-2024 plan's dry run ...", flush=True)
    results["plan"] = _plan(workdir, quick, timeout)
    results["fits"] = fits(results["runs"])
    results["no_shuffle_fits"] = fits(results["no_shuffle_runs"])
    results["bills"] = bills(results["fits"], results["plan"], results["no_shuffle_fits"])
    return results


# ---------------------------------------------------------------- fits and the bill


def fit(xs: list[float], ys: list[float]) -> dict[str, float]:
    """y = slope * x + intercept by least squares (the slope alone through the origin when x does not vary)."""
    x, y = np.asarray(xs, float), np.asarray(ys, float)
    if np.ptp(x) == 0:
        return {"slope": float(y.sum() / x.sum()) if x.sum() else 0.0, "intercept": 0.0}
    slope, intercept = np.polyfit(x, y, 1)
    return {"slope": float(slope), "intercept": float(intercept)}


def _ops(row: dict, what: str, kind: str) -> float:
    return row["operations"].get(what, {}).get(kind, 0)


#: Each fitted quantity: (its driver in a run and in the plan, how a run measures it).
QUANTITIES = {
    "shuffle bytes, references": ("references", lambda r: r["shuffle"].get(_label(r["shuffle"], WRITE_GROUP), {})),
    "shuffle bytes, other": ("units", None),
    "intermediate bytes": ("output_bytes", lambda r: r["intermediate_bytes"]),
    "intermediate objects": ("units", lambda r: r["intermediate_objects"]),
    "cpu seconds": ("output_bytes", lambda r: r["cpu_seconds"]),
    "class A, spill": ("units", lambda r: _ops(r, "spill", "A")),
    "class B, spill": ("references", lambda r: _ops(r, "spill", "B")),
    "class A, run files": ("units", lambda r: _ops(r, "run files", "A")),
    "class B, run files": ("units", lambda r: _ops(r, "run files", "B")),
    "class A, output": ("shards", lambda r: _ops(r, "output", "A") + _ops(r, "other", "A")),
    "class B, output": ("shards", lambda r: _ops(r, "output", "B") + _ops(r, "other", "B")),
}


def _measured(row: dict, name: str) -> float:
    if name == "shuffle bytes, references":
        return row["shuffle"].get(_label(row["shuffle"], WRITE_GROUP), {}).get("bytes", 0)
    if name == "shuffle bytes, other":
        return row["shuffle_bytes"] - _measured(row, "shuffle bytes, references")
    return QUANTITIES[name][1](row)


def fits(runs: list[dict]) -> dict[str, dict]:
    """Each quantity's fit in its driver over the runs."""
    return {
        name: {"driver": driver, **fit([r[driver] for r in runs], [_measured(r, name) for r in runs])}
        for name, (driver, _) in QUANTITIES.items()
    }


def references(units: int, shards: int, samples: int) -> float:
    """The (block, shard) references a plan's write sends: each unit's samples land in this many shards, expected."""
    per_unit = samples / units
    return units * shards * -math.expm1(per_unit * math.log1p(-1 / shards)) if shards > 1 else units


def carried(fits: dict, plan: dict) -> dict[str, float]:
    """Each fitted quantity at the plan's size (never below zero)."""
    drivers = {**plan, "references": references(plan["units"], plan["shards"], plan["samples"])}
    return {name: max(0.0, f["slope"] * drivers[f["driver"]] + f["intercept"]) for name, f in fits.items()}


def _terms(at: dict[str, float]) -> dict[str, float]:
    """A bill term by term, in USD, from the quantities carried to the plan's size."""
    vcpu_hours = at["cpu seconds"] / 3600
    job_hours = vcpu_hours / JOB_VCPUS
    return {
        "vCPU": vcpu_hours * VCPU_HOUR,
        "memory": vcpu_hours * MEMORY_GB_PER_VCPU * MEMORY_GB_HOUR,
        "Dataflow Shuffle": (at["shuffle bytes, references"] + at["shuffle bytes, other"]) / GB * SHUFFLE_GB,
        "storage (intermediates)": at["intermediate bytes"] / GB * STORAGE_GB_MONTH * job_hours / HOURS_PER_MONTH,
        "class A operations": sum(v for k, v in at.items() if k.startswith("class A")) / 1e4 * CLASS_A_PER_10K,
        "class B operations": sum(v for k, v in at.items() if k.startswith("class B")) / 1e4 * CLASS_B_PER_10K,
    }


def bills(fits: dict, plan: dict, no_shuffle_fits: dict | None = None) -> dict[str, dict[str, float] | None]:
    """Each write path's bill at the plan's size, term by term, in USD (None: the no-shuffle mode, not measured)."""
    at = carried(fits, plan)
    spill = _terms(at)
    # Before: the records themselves through the shuffle; no spill objects written or read.
    runner_shuffle = {
        **spill,
        "Dataflow Shuffle": (plan["output_bytes"] * RUNNER_SHUFFLE_OVER_OUTPUT + at["shuffle bytes, other"])
        / GB
        * SHUFFLE_GB,
        "storage (intermediates)": 0.0,
        "class A operations": spill["class A operations"] - at["class A, spill"] / 1e4 * CLASS_A_PER_10K,
        "class B operations": spill["class B operations"] - at["class B, spill"] / 1e4 * CLASS_B_PER_10K,
    }
    no_shuffle = _terms(carried(no_shuffle_fits, plan)) if no_shuffle_fits else None
    return {PATHS[0]: spill, PATHS[1]: runner_shuffle, PATHS[2]: no_shuffle}


def targets(results: dict) -> list[Target]:
    """The issue's targets: shuffle share, intermediate objects and bytes, leftovers, the plan's bill."""
    if "bills" not in results:
        return []
    largest = max(results["runs"], key=lambda r: r["output_bytes"])
    plan = results["plan"]
    at = carried(results["fits"], plan)
    share = (at["shuffle bytes, references"] + at["shuffle bytes, other"]) / plan["output_bytes"]
    bill = sum(results["bills"][PATHS[0]].values())
    # (a run's few fixed working files aside, which a small run's units do not outnumber: the table shows each run's)
    objects_over = at["intermediate objects"] / (plan["units"] + plan["shards"])
    return [
        Target("cost: shuffle bytes / output bytes, largest run", largest["shuffle_bytes"] / largest["output_bytes"],
               MAX_SHUFFLE_SHARE, True),
        Target("cost: shuffle bytes / output bytes, ERA5 plan", share, MAX_SHUFFLE_SHARE, True),
        Target("cost: intermediate objects / (units + shards), ERA5 plan", objects_over, 1.0, True),
        Target("cost: intermediate bytes / output bytes", max(r["intermediate_bytes"] / r["output_bytes"]
               for r in results["runs"]), MAX_INTERMEDIATE_OVER_OUTPUT, True),
        Target("cost: objects left under _tmp/ after the commit", sum(r["left_after_commit"] for r in results["runs"]),
               0, True, "objects"),
        Target("cost: ERA5 1940-2024 bill, spill objects", bill, MAX_BILL_USD, True, "USD"),
        *_no_shuffle_targets(results),
    ]  # fmt: skip


def _no_shuffle_targets(results: dict) -> list[Target]:
    """shuffle.mode: read's: its shuffle share at the plan's size, and its bill."""
    bill = results["bills"].get(PATHS[2])
    if bill is None:
        return []
    plan = results["plan"]
    at = carried(results["no_shuffle_fits"], plan)
    share = (at["shuffle bytes, references"] + at["shuffle bytes, other"]) / plan["output_bytes"]
    return [
        Target("cost: shuffle bytes / output bytes, no shuffle, ERA5 plan", share, MAX_SHUFFLE_SHARE, True),
        Target("cost: ERA5 1940-2024 bill, no shuffle", sum(bill.values()), MAX_NO_SHUFFLE_BILL_USD, True, "USD"),
    ]


def render(results: dict, *, for_docs: bool = False) -> str:
    """The section as printed: the runs, the fits, the plan, the bills, the targets."""
    lines = ["== cost: PortableRunner (LOOPBACK) builds to gs:// (storage emulator), spill objects =="]
    lines.append(runs_table(results["runs"]))
    if results.get("no_shuffle_runs"):
        lines.append("no shuffle (shuffle.mode: read): each shard written whole from its run of units, to gs://")
        lines.append(runs_table(results["no_shuffle_runs"]))
    if "fits" in results:
        fitted = [
            [name, f["driver"], f"{f['slope']:.4g}", f"{f['intercept']:.4g}"] for name, f in results["fits"].items()
        ]
        lines.append(table(("fitted", "per", "slope", "intercept"), fitted))
        if results.get("no_shuffle_fits"):
            fitted = [[name, f["driver"], f"{f['slope']:.4g}", f"{f['intercept']:.4g}"]
                      for name, f in results["no_shuffle_fits"].items() if f["slope"] or f["intercept"]]  # fmt: skip
            lines.append(table(("fitted, no shuffle", "per", "slope", "intercept"), fitted))
        plan = results["plan"]
        scaled = "" if plan["dry_run_steps"] == plan["steps"] else f" (a {plan['dry_run_steps']}-step dry run, scaled)"
        lines.append(
            f"ARCO-ERA5 1940-2024 plan{scaled}: {plan['units']:,} units, {plan['shards']:,} shards, "
            f"{plan['samples']:,} samples, {plan['output_bytes'] / 1e12:,.1f} TB; "
            f"{references(plan['units'], plan['shards'], plan['samples']):,.0f} references"
        )
        lines.append(bill_table(results["bills"]))
        lines.append(
            f"prices (USD): vCPU-h {VCPU_HOUR}, GB-h {MEMORY_GB_HOUR}, Shuffle GB {SHUFFLE_GB}, "
            f"GB-month {STORAGE_GB_MONTH}, class A/B per 10,000 {CLASS_A_PER_10K}/{CLASS_B_PER_10K}; "
            f"{MEMORY_GB_PER_VCPU} GB a vCPU, {JOB_VCPUS:,} vCPUs; the output's own storage "
            f"{plan['output_bytes'] / GB * STORAGE_GB_MONTH:,.0f} a month is not the build's"
        )
    for target in targets(results):
        lines.append(f"target {target.name}: {target.value:.4g} (limit {target.limit:g}) {target.status}")
    if results["failed"]:
        lines.append("FAILED: " + ", ".join(results["failed"]))
    return "\n".join(lines)


def runs_table(runs: list[dict]) -> str:
    """A row a measured build: its output, units and shards, shuffle, intermediates, operations, CPU."""
    rows = []
    for r in runs:
        if not r["ok"]:
            rows.append([f"{r['files']} files", "FAILED", *["-"] * 8])
            continue
        ops_a = sum(v["A"] for v in r["operations"].values())
        ops_b = sum(v["B"] for v in r["operations"].values())
        rows.append(
            [
                f"{r['files']} files",
                f"{r['output_bytes'] / 1e6:,.1f}",
                f"{r['units']}/{r['shards']}",
                f"{r['shuffle_bytes'] / 1e3:,.1f}",
                f"{r['shuffle_bytes'] / r['output_bytes']:.4f}",
                f"{r['intermediate_objects']}",
                f"{r['intermediate_bytes'] / r['output_bytes']:.3f}",
                f"{ops_a}/{ops_b}",
                f"{r['left_after_commit']}",
                f"{r['cpu_seconds'] / (r['output_bytes'] / GB):,.0f}",
            ]
        )
    headers = ("build", "output MB", "units/shards", "shuffle KB", "shuffle/out", "tmp objects", "tmp/out",
               "class A/B", "left", "CPU-s/GB")  # fmt: skip
    return table(headers, rows)


def bill_table(bills: dict) -> str:
    """The plan's bill, a column a write path (a path not built yet: its column says so)."""
    terms = list(next(b for b in bills.values() if b is not None))
    rows = [[term, *(f"{b[term]:,.0f}" if b is not None else "-" for b in bills.values())] for term in terms]
    rows.append(["total", *(f"{sum(b.values()):,.0f}" if b is not None else "not built" for b in bills.values())])
    return table(("USD, ERA5 1940-2024", *bills), rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.cost", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes and a day's plan: a smoke test")
    parser.add_argument("--workdir", default=str(Path(tempfile.gettempdir()) / "xtf-bench"), help="data and results")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds a build may take")
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--markdown", metavar="PAGE", help="also write the report between PAGE's cost markers")
    parser.add_argument("--child-build", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--child-plan", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child_build:
        build_child(*args.child_build)
        return 0
    if args.child_plan:
        steps, workdir, result = args.child_plan
        plan_child(int(steps), workdir, result)
        return 0
    results = run(Path(args.workdir), args.quick, args.timeout)
    results["targets"] = [t.to_json() for t in targets(results)]
    print(render(results))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    if args.markdown:
        write_markdown(Path(args.markdown), results, "python -m benchmarks.cost" + (" --quick" if args.quick else ""))
    return 1 if results["failed"] else 0


#: Where the docs hold the cost report (docs/performance.md), apart from benchmarks.run's table.
MARKDOWN_START, MARKDOWN_END = "<!-- cost:start -->", "<!-- cost:end -->"


def write_markdown(path: Path, results: dict, command: str) -> None:
    """Replace the report between the cost markers of ``path`` (a docs page) with this run's."""
    from pipelines.config_reference import replace_between

    report = f"Written by `{command}`:\n\n```text\n{render(results, for_docs=True)}\n```\n"
    path.write_text(replace_between(path.read_text(), MARKDOWN_START, MARKDOWN_END, report))


if __name__ == "__main__":
    raise SystemExit(main())
