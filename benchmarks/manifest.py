"""_manifest.json by rules against one entry per file, --overwrite of many small files, and the launcher of the
ARCO-ERA5 1940-2024 plan up to its submission (``python -m benchmarks.manifest``).

- Formats: the manifest's bytes, reading it, and ``owns()`` per name, at 4 / 50,000 / 2,190,000 shards (each
  with its index), format 1 (every name listed) against format 2 (a rule per split and generation).
- Overwrite: ``prepare_output(--overwrite)`` of an output of many small shards, locally and on ``gs://`` (the
  storage emulator, whose request log counts the requests), by this version and by the code of ``--old`` (a
  copy of an earlier version's tree, e.g. ``git archive main``), each in its own process.
- Launcher: the build's own code (``pipelines.graph.run_build``) on the ARCO-ERA5-shaped metadata store
  (benchmarks.job_graph) with Beam's PortableRunner, stopped where the job would be submitted: the peak RSS
  up to there (planning, the manifest, the output's clearing, the run files, the graph) and the manifest's
  bytes, by this version and by ``--old``'s. The remote-setup checks are skipped: paths stay local.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.measure import run_measured

REPO = Path(__file__).resolve().parents[1]
RUN = "0123456789ab"
SHARD_COUNTS = (4, 50_000, 2_190_000)
#: Names asked of owns() per format and size: shards, indexes and lookalikes (named like shards, owned by none).
PROBES = 20_000
#: Shards of the output --overwrite clears, locally and on the emulator (each with its index: twice the files).
LOCAL_SHARDS = 20_000
REMOTE_SHARDS = 1_000
QUICK_SHARDS = (4, 5_000)
QUICK_LOCAL, QUICK_REMOTE = 500, 100
BUCKET = "xtf-bench"

#: Runs in the code under test (this tree's or --old's): prepare_output(--overwrite) of ``argv[1]``, timed.
OVERWRITE_CHILD = """
import json, sys, time
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions
from pipelines.output import prepare_output
from planning.run import manifest as m
FileSystems.set_options(PipelineOptions([]))
rules = [m.ShardRule("train", 1)] if hasattr(m, "ShardRule") else ["train-00000-of-00001.tfrecord"]
started = time.perf_counter()
prepare_output(sys.argv[1], True, m.build_manifest("fedcba987654", rules))
print(json.dumps({"seconds": time.perf_counter() - started}))
"""

#: Runs in the code under test: the build up to the job's submission, with the peak RSS there.
LAUNCHER_CHILD = """
import json, sys
import pipelines.graph as graph
import pipelines.output as output
from planning.config import load_config

class Submitted(Exception):
    pass

seen = {}
def peak():  # this process's own high-water mark (getrusage's would count the pages of the process that forked it)
    line = next(line for line in open("/proc/self/status") if line.startswith("VmHWM:"))
    return int(line.split()[1]) * 1024

def submit(pipeline, options, local):
    seen["submitted_rss"] = peak()
    raise Submitted

real_plan, real_prepare = graph.make_plan, graph.prepare_output
def make_plan(*args, **kwargs):
    plan = real_plan(*args, **kwargs)
    seen["planned_rss"] = peak()
    seen["shards"] = plan.num_shards
    return plan
def prepare_output(path, overwrite, manifest):
    seen["manifest_bytes"] = len(manifest.dumps().encode())
    return real_prepare(path, overwrite, manifest)

graph._run_and_wait, graph.make_plan, graph.prepare_output = submit, make_plan, prepare_output
graph.check_remote_setup = lambda *args, **kwargs: None  # (local paths for a remote runner)
runner = ["--runner=PortableRunner", "--job_endpoint=embed", "--environment_type=LOOPBACK"]
try:
    graph.run_build(load_config(sys.argv[1]), runner, overwrite=True)
except Submitted:
    pass
print(json.dumps(seen))
"""


def _env(code: Path) -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(code))


def _last_json(text: str) -> dict:
    return json.loads([line for line in text.splitlines() if line.startswith("{")][-1])


# ---------------------------------------------------------------- formats


def formats(counts) -> list[dict]:
    """Each size's manifest in both formats: bytes, read time, owns() per name."""
    from planning.run.manifest import FORMAT_1, METADATA, Manifest, ShardRule, build_manifest
    from schemas.schema import shard_name
    from schemas.shard_index import index_name

    rows = []
    for count in counts:
        names = [shard_name("train", i, count) for i in range(count)]
        files = sorted([*names, *map(index_name, names), *METADATA, "_manifest.json", "_inventory.json"])
        old_text = json.dumps({"format": FORMAT_1, "runs": [RUN], "files": files}, indent=1)
        new = build_manifest(RUN, [ShardRule("train", count)])
        new_text = new.dumps()
        step = max(1, count // PROBES)
        probes = [n for i in range(0, count, step) for n in (names[i], index_name(names[i]))]
        probes += [shard_name("train", i, count + 1) for i in range(0, count, step)]  # lookalikes
        listed = Manifest(frozenset(files), frozenset([RUN]))  # what format 1 held: every name, in a set
        rows.append(
            {
                "shards": count,
                "old_bytes": len(old_text.encode()),
                "new_bytes": len(new_text.encode()),
                "old_read_s": _timed(lambda t=old_text: Manifest.loads(t)),
                # (what an append to an output of format 1 does once: its manifest written again, as rules)
                "old_rewrite_s": _timed(lambda m=listed: m.union(build_manifest(RUN), [RUN]).dumps()),
                "new_read_s": _timed(lambda t=new_text: Manifest.loads(t)),
                "old_owns_us": _per_name(listed, probes),
                "new_owns_us": _per_name(Manifest.loads(new_text), probes),
                "same_answers": [listed.owns(p) for p in probes] == [new.owns(p) for p in probes],
            }
        )
        del names, files, old_text, listed, probes
    return rows


def _timed(action) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def _per_name(manifest, probes: list[str]) -> float:
    started = time.perf_counter()
    for name in probes:
        manifest.owns(name)
    return (time.perf_counter() - started) / len(probes) * 1e6


# ---------------------------------------------------------------- overwrite


def _write_output(write, shards: int, rules: bool) -> None:
    """An output of ``shards`` tiny shards and indexes, with its manifest in format 2 (``rules``) or 1."""
    from planning.run.manifest import FORMAT_1, METADATA, ShardRule, build_manifest
    from schemas.schema import shard_name
    from schemas.shard_index import index_name

    names = [shard_name("train", i, shards) for i in range(shards)]
    files = [*names, *map(index_name, names), *METADATA]
    for name in files:
        write(name, b"x")  # (no trailing CR or LF: the emulator's multipart uploads drop one)
    if rules:
        manifest = build_manifest(RUN, [ShardRule("train", shards)]).dumps()
    else:
        manifest = json.dumps({"format": FORMAT_1, "runs": [], "files": sorted([*files, "_manifest.json"])})
    write("_manifest.json", manifest.encode())


def overwrite_local(workdir: Path, old: Path | None, shards: int) -> dict:
    row: dict = {"where": "local", "files": 2 * shards + 6}
    for label, code, rules in (("old", old, False), ("new", REPO, True)):
        if code is None:
            continue
        output = workdir / f"overwrite-{label}"

        def write(name: str, data: bytes, output=output) -> None:
            (output / name).write_bytes(data)

        output.mkdir(parents=True, exist_ok=True)
        _write_output(write, shards, rules)
        measured = run_measured([sys.executable, "-c", OVERWRITE_CHILD, str(output)], str(code), env=_env(code))
        if not measured.ok:
            raise RuntimeError(f"overwrite ({label}) failed: {measured.output_tail[-1500:]}")
        left = sorted(p.name for p in output.iterdir())
        row[f"{label}_s"] = _last_json(measured.output_tail)["seconds"]
        row[f"{label}_cleared"] = left == ["_manifest.json"]
    return row


def overwrite_remote(workdir: Path, old: Path | None, shards: int) -> dict:
    import fsspec

    from benchmarks.unit_memory import storage_emulator

    row: dict = {"where": "gs:// (emulator)", "files": 2 * shards + 6}
    for label, code, rules in (("old", old, False), ("new", REPO, True)):
        if code is None:
            continue
        log = workdir / f"requests-{label}.jsonl"
        log.unlink(missing_ok=True)
        with storage_emulator(BUCKET, log):
            gcs = fsspec.filesystem("gs", skip_instance_cache=True)
            output = f"gs://{BUCKET}/overwrite-{label}"
            _write_output(lambda name, data, output=output, gcs=gcs: gcs.pipe(f"{output}/{name}", data), shards, rules)
            before = sum(1 for _ in log.open())
            command = [sys.executable, "-c", OVERWRITE_CHILD, output]
            measured = run_measured(command, str(code), env=_env(code))
            if not measured.ok:
                raise RuntimeError(f"overwrite ({label}) on gs:// failed: {measured.output_tail[-1500:]}")
            lines = [json.loads(line) for line in log.open()][before:]
            gcs.invalidate_cache()
            left = sorted(p.rsplit("/", 1)[-1] for p in gcs.find(output.removeprefix("gs://")))
        row[f"{label}_s"] = _last_json(measured.output_tail)["seconds"]
        row[f"{label}_requests"] = len(lines)
        row[f"{label}_operations"] = sum(max(1, len(line["nested"] or ())) for line in lines)
        row[f"{label}_cleared"] = left == ["_manifest.json"]
    return row


# ---------------------------------------------------------------- launcher


def launcher(workdir: Path, old: Path | None, steps: int) -> list[dict]:
    import yaml

    from benchmarks.job_graph import patches_config, write_metadata_store

    store = workdir / f"metadata-{steps}.zarr"
    if not (store / "zarr.json").exists():
        write_metadata_store(store, steps)
    rows = []
    for label, code in (("old", old), ("new", REPO)):
        if code is None:
            continue
        config = workdir / f"launcher-{label}.yaml"
        config.write_text(yaml.safe_dump(patches_config(store, workdir / f"launcher-out-{label}")))
        measured = run_measured([sys.executable, "-c", LAUNCHER_CHILD, str(config)], str(code), env=_env(code))
        if not measured.ok:
            raise RuntimeError(f"launcher ({label}) failed: {measured.output_tail[-2000:]}")
        seen = _last_json(measured.output_tail)
        rows.append(
            {
                "code": label,
                "steps": steps,
                "wall_s": measured.wall_seconds,
                "peak_rss": measured.peak_rss_bytes,
                **seen,
            }
        )
    return rows


# ---------------------------------------------------------------- report


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:,.1f}x" if a and b else "-"


def render(results: dict) -> str:
    lines = ["== manifest: format 1 (every name) vs format 2 (rules) =="]
    lines.append("| shards | format 1 | format 2 | read 1 | 1 rewritten as 2 | read 2 | owns() 1 | owns() 2 | same |")
    lines.append("|---|---|---|---|---|---|---|---|---|")
    for row in results["formats"]:
        lines.append(
            f"| {row['shards']:,} | {row['old_bytes'] / 1e6:,.3f} MB | {row['new_bytes']:,} B "
            f"| {row['old_read_s']:.3f} s | {row['old_rewrite_s']:.3f} s | {row['new_read_s'] * 1e3:.2f} ms "
            f"| {row['old_owns_us']:.2f} us | {row['new_owns_us']:.2f} us | {row['same_answers']} |"
        )
    lines.append("")
    lines.append("== --overwrite of many small files: old vs new ==")
    lines.append("| where | files | old | new | old/new wall | requests old | requests new | cleared |")
    lines.append("|---|---|---|---|---|---|---|---|")
    for row in results["overwrite"]:
        lines.append(
            f"| {row['where']} | {row['files']:,} | {row.get('old_s', 0):.2f} s | {row['new_s']:.2f} s "
            f"| {_ratio(row.get('old_s'), row['new_s'])} | {row.get('old_requests', '-')} "
            f"| {row.get('new_requests', '-')} | {row.get('old_cleared', '-')}/{row['new_cleared']} |"
        )
    lines.append("")
    lines.append("== launcher up to submission (PortableRunner), ARCO-ERA5-shaped plan ==")
    lines.append("| code | steps | shards | planned peak RSS | submission peak RSS | whole run | manifest | wall |")
    lines.append("|---|---|---|---|---|---|---|---|")
    for row in results["launcher"]:
        lines.append(
            f"| {row['code']} | {row['steps']:,} | {row.get('shards', 0):,} | {row.get('planned_rss', 0) / 1e9:.2f} GB "
            f"| {row.get('submitted_rss', 0) / 1e9:.2f} GB | {row.get('peak_rss', 0) / 1e9:.2f} GB "
            f"| {row.get('manifest_bytes', 0) / 1e6:,.3f} MB "
            f"| {row['wall_s']:.0f} s |"
        )
    return "\n".join(lines)


def run(
    workdir: Path, old: Path | None, quick: bool, parts: set[str], local: int | None = None, remote: int | None = None
) -> dict:
    from benchmarks.job_graph import RECORD_STEPS

    results: dict = {"formats": [], "overwrite": [], "launcher": []}
    if "formats" in parts:
        results["formats"] = formats(QUICK_SHARDS if quick else SHARD_COUNTS)
    if "overwrite" in parts:
        results["overwrite"] = [
            overwrite_local(workdir, old, local or (QUICK_LOCAL if quick else LOCAL_SHARDS)),
            overwrite_remote(workdir, old, remote or (QUICK_REMOTE if quick else REMOTE_SHARDS)),
        ]
    if "launcher" in parts:
        results["launcher"] = launcher(workdir, old, 24 if quick else RECORD_STEPS)
    return results


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--old", type=Path, default=None, help="an earlier version's tree to compare with")
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke test, not a measurement")
    parser.add_argument("--parts", default="formats,overwrite,launcher")
    parser.add_argument("--local-shards", type=int, default=None, help="shards of the local output --overwrite clears")
    parser.add_argument("--remote-shards", type=int, default=None, help="shards of the gs:// output it clears")
    parser.add_argument("--json", type=Path, default=None)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="xtf-manifest-"))
    workdir.mkdir(parents=True, exist_ok=True)
    results = run(workdir, args.old, args.quick, set(args.parts.split(",")), args.local_shards, args.remote_shards)
    print(render(results))
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
