"""The streaming shard writer against the old in-memory one, peak RSS and speed (``python -m benchmarks.shard_writer``).

Each case is one shard (256 MB by default) in 64 bucket files, as 64 units would write them:
small records (~0.5 KB), large records (~44 KB), and ~0.5 KB samples packed 32 to a record.
Every writer run is its own process; its peak RSS is measured from outside (benchmarks.measure),
less the RSS of a process that only imports the same modules (the interpreter's baseline).
Throughput is the shard's bytes over the time of the write call alone (imports excluded).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.measure import run_measured
from benchmarks.tables import table
from benchmarks.targets import MAX_WRITER_RSS_OVER_BUDGET

MB = 1e6
BUCKETS = 64
SEED = 0
WRITERS = ("stream", "memory")


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    label: str
    values: int  # float32 values per sample
    per_record: int = 1


CASES = (
    Case("small", "small records (~0.5 KB)", 110),
    Case("large", "large records (~44 KB)", 11_000),
    Case("packed", "~0.5 KB samples, 32 per record", 110, 32),
)


def features(case: Case):
    from schemas.schema import Feature

    return (
        Feature("x", "float32", (case.values,), ("v",), "variable"),
        Feature("index/time", "int64", (), (), "index"),
        Feature("index/lat", "int64", (), (), "index"),
        Feature("index/lon", "int64", (), (), "index"),
    )


def write_spec(case: Case, output: str, budget_bytes: int, compression: str | None):
    from planning.specs import WriteSpec
    from planning.splits import SplitPlan
    from planning.write_strategy import WriteStrategy
    from schemas.schema import Schema

    schema = Schema(features(case), examples_per_record=case.per_record)
    return WriteSpec(
        output=output,
        run_id="bench",
        strategy=WriteStrategy.BUCKET_FILES,
        features=schema.features,
        record_features=schema.record_features(),
        stacks=(),
        splits=(SplitPlan("data", 0, 1, num_shards=1),),
        seed=SEED,
        compression=compression,
        examples_per_record=case.per_record,
        writer_budget_bytes=budget_bytes,
        max_shard_bytes=2**62,  # the benchmark may write shards of any size
    )


def ensure_buckets(workdir: Path, case: Case, shard_mb: float) -> Path:
    """The case's bucket files (written once per size): samples in id order, keys as the pipeline makes them."""
    from planning.keys import sample_keys
    from schemas.example_codec import ExampleEncoder
    from schemas.tfrecord import frame_parts
    from transforms.buckets.blobs import bucket_pieces, row_dtype

    directory = workdir / "shard-writer" / f"{case.name}-{shard_mb:g}mb"
    if (directory / "done").exists():
        return directory
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    feats = features(case)
    encoder = ExampleEncoder(feats)
    sample_bytes = encoder.max_record_length() if case.per_record == 1 else row_dtype(feats).itemsize
    samples = int(shard_mb * MB / sample_bytes)
    rng = np.random.default_rng(SEED)
    for unit, ids in enumerate(np.array_split(np.arange(samples), BUCKETS)):
        columns = {
            "x": rng.standard_normal((len(ids), case.values), dtype=np.float32),
            "index/time": ids // 1000,
            "index/lat": ids % 1000 // 40,
            "index/lon": ids % 40,
        }
        if case.per_record == 1:
            payloads = [frame_parts(record) for record in encoder.encode(columns)]
        else:
            payloads = np.empty(len(ids), dtype=row_dtype(feats))
            for i, feature in enumerate(feats):
                payloads[f"f{i}"] = columns[feature.name]
        with open(directory / f"unit-{unit:06d}.bucket", "wb") as stream:
            stream.writelines(bucket_pieces(sample_keys(ids, SEED), payloads))
    (directory / "done").write_text(str(samples))
    return directory


# ---------------------------------------------------------------------------------------------
# The competitor: the writer as it was, holding the whole shard in memory.


def old_sorted_payloads(buckets) -> list[memoryview]:
    from apache_beam.io.filesystem import CompressionTypes
    from apache_beam.io.filesystems import FileSystems

    from transforms.buckets.blobs import unpack_bucket

    all_keys, payloads = [], []
    for bucket in buckets:
        with FileSystems.open(bucket, compression_type=CompressionTypes.UNCOMPRESSED) as stream:
            blob = stream.read()
        keys, lengths, payload = unpack_bucket(blob, name=bucket)
        ends = np.cumsum(lengths, dtype=np.int64).tolist()
        starts = [0, *ends[:-1]]
        payloads.extend(payload[s:e] for s, e in zip(starts, ends))
        all_keys.append(keys)
    keys = np.concatenate(all_keys) if all_keys else np.zeros(0, np.uint64)
    order = np.argsort(keys, kind="stable")
    return [payloads[i] for i in order.tolist()]


def old_write_shard(spec, buckets) -> tuple[int, int]:
    """The old write_shard: every payload of the shard in memory, sorted, packed whole, then written."""
    from schemas.example_codec import ExampleEncoder
    from schemas.tfrecord import frame
    from transforms.buckets.blobs import row_dtype
    from transforms.files import write_atomically

    payloads = old_sorted_payloads(buckets)
    per_record = spec.examples_per_record
    records = payloads
    if per_record > 1:
        rows = np.frombuffer(b"".join(payloads), dtype=row_dtype(spec.features))
        n = len(rows)
        count = -(-n // per_record)
        padded = np.zeros(count * per_record, dtype=rows.dtype)
        padded[:n] = rows
        columns = {f.name: padded[f"f{i}"].reshape((count, per_record, *f.shape)) for i, f in enumerate(spec.features)}
        columns["record/count"] = np.full(count, per_record, dtype=np.int64)
        columns["record/count"][-1] = n - (count - 1) * per_record
        records = [frame(r) for r in ExampleEncoder(spec.record_features).encode(columns)]
    size = write_atomically(spec.shard_path(0), records, spec.compression)
    return len(records), size


# ---------------------------------------------------------------------------------------------
# One measured process.


def child(args: argparse.Namespace) -> None:
    from transforms.buckets.sorting import BufferLedger
    from transforms.shards import write_shard

    if args.child == "baseline":
        time.sleep(0.5)  # long enough for the parent's 50 ms RSS sampler
        return
    case = next(c for c in CASES if c.name == args.case)
    spec = write_spec(case, args.output, int(args.budget_mb * MB), args.compression)
    buckets = sorted(str(p) for p in Path(args.buckets).glob("*.bucket"))
    ledger = BufferLedger()
    started = time.perf_counter()
    if args.child == "stream":
        result = write_shard(spec, 0, buckets, ledger)
        records, size = result.records, result.bytes
    else:
        records, size = old_write_shard(spec, buckets)
    seconds = time.perf_counter() - started
    result = {"seconds": seconds, "records": records, "bytes": size, "ledger_peak": ledger.peak, "runs": ledger.runs}
    Path(args.result).write_text(json.dumps({**result, "path": spec.shard_path(0)}))


def _digest_and_remove(path: str) -> str:
    """The shard's sha256, read by the orchestrator (so the writer's process holds no read buffer)."""
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        while block := stream.read(1 << 20):
            digest.update(block)
    os.unlink(path)
    return digest.hexdigest()


def _env() -> dict[str, str]:
    repo = str(Path(__file__).resolve().parents[1])
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (repo, env.get("PYTHONPATH")) if p)
    return env


def _measure(workdir: Path, arguments: list[str], timeout: float) -> dict:
    result = workdir / "shard-writer" / "result.json"
    result.unlink(missing_ok=True)
    command = [sys.executable, "-m", "benchmarks.shard_writer", *arguments, "--result", str(result)]
    measurement = run_measured(command, str(Path(__file__).resolve().parents[1]), _env(), timeout)
    row = {"ok": measurement.ok, "peak_rss": measurement.peak_rss_bytes, "wall": measurement.wall_seconds}
    if measurement.ok and result.exists():
        row.update(json.loads(result.read_text()))
        if "path" in row:
            row["sha256"] = _digest_and_remove(row.pop("path"))
    elif not measurement.ok:
        row["error"] = measurement.output_tail
        print(measurement.output_tail, file=sys.stderr)
    return row


def run(
    workdir: Path,
    shard_mb: float = 256,
    budget_mb: float = 64,
    repeat: int = 1,
    timeout: float = 3600,
    compression: str | None = None,
    cases: tuple[str, ...] = tuple(c.name for c in CASES),
) -> dict:
    """Every case, each writer in its own process (the fastest of ``repeat`` runs kept)."""
    workdir = Path(workdir)
    out = workdir / "shard-writer" / "out"
    out.mkdir(parents=True, exist_ok=True)
    section = {"shard_mb": shard_mb, "budget_mb": budget_mb, "compression": compression, "cases": {}}
    print("[shard-writer] baseline (imports only) ...", flush=True)
    baseline = min(
        (_measure(workdir, ["--child", "baseline"], timeout) for _ in range(max(1, repeat))),
        key=lambda r: r["peak_rss"],
    )
    section["baseline_rss"] = baseline["peak_rss"]
    for case in (c for c in CASES if c.name in cases):
        buckets = ensure_buckets(workdir, case, shard_mb)
        # The shard's payload bytes (buckets less their keys and lengths): the same for every writer.
        section.setdefault("bucket_bytes", {})[case.name] = sum(p.stat().st_size for p in buckets.glob("*.bucket"))
        rows = {}
        for writer in WRITERS:
            print(f"[shard-writer] {case.name}: {writer} ...", flush=True)
            arguments = ["--child", writer, "--case", case.name, "--buckets", str(buckets), "--output", str(out)]
            arguments += ["--budget-mb", str(budget_mb)] + (["--compression", compression] if compression else [])
            runs = [_measure(workdir, arguments, timeout) for _ in range(max(1, repeat))]
            ok = [r for r in runs if r["ok"]]
            rows[writer] = min(ok, key=lambda r: r["seconds"]) if len(ok) == len(runs) else runs[0]
        stream, memory = rows["stream"], rows["memory"]
        if stream["ok"] and memory["ok"]:
            stream["identical"] = stream["sha256"] == memory["sha256"]
        section["cases"][case.name] = {"label": case.label, **rows}
    shutil.rmtree(out, ignore_errors=True)
    return section


def failed(section: dict) -> list[str]:
    rows = [(f"shard-writer {name} {w}", case[w]) for name, case in section["cases"].items() for w in WRITERS]
    return [name for name, row in rows if not row["ok"] or row.get("identical") is False]


def render(section: dict) -> str:
    baseline = section["baseline_rss"]
    rows = []
    for name, case in section["cases"].items():
        stream, memory = case["stream"], case["memory"]
        if not (stream["ok"] and memory["ok"]):
            rows.append([case["label"], "FAILED", *["-"] * 7])
            continue
        shard = section["bucket_bytes"][name]
        rate = shard / stream["seconds"], shard / memory["seconds"]
        rows.append(
            [
                case["label"],
                f"{shard / MB:,.0f}",
                f"{(stream['peak_rss'] - baseline) / MB:,.0f}",
                f"{(stream['peak_rss'] - baseline) / (section['budget_mb'] * MB):.2f}",
                f"{(memory['peak_rss'] - baseline) / MB:,.0f}",
                f"{(memory['peak_rss'] - baseline) / shard:.2f}",
                f"{rate[0] / rate[1]:.2f}",
                str(stream["runs"]),
                "yes" if stream.get("identical") else "NO",
            ]
        )
    headers = (
        "shard",
        "MB",
        "stream RSS MB",
        "/budget",
        "in-memory RSS MB",
        "/shard",
        "rate stream/in-memory",
        "runs spilled",
        "same bytes",
    )
    compression = f", {section['compression']}" if section.get("compression") else ""
    return (
        f"== shard writer: one shard from {BUCKETS} bucket files, budget {section['budget_mb']:g} MB{compression} ==\n"
        + table(headers, rows)
        + f"\n  RSS: each writer's process peak less the baseline of a process that only imports them "
        f"({baseline / MB:,.0f} MB, subtracted); target: stream RSS <= {MAX_WRITER_RSS_OVER_BUDGET:g}x the budget\n"
        "  rate: the shard's bytes over the write call's time (imports excluded), stream / in-memory"
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.shard_writer", description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", default=str(Path(tempfile.gettempdir()) / "xtf-bench"), help="buckets, outputs")
    parser.add_argument("--shard-mb", type=float, default=256, help="shard size (default 256)")
    parser.add_argument("--budget-mb", type=float, default=64, help="the streaming writer's budget (default 64)")
    parser.add_argument("--repeat", type=int, default=1, help="runs per writer; the fastest is kept")
    parser.add_argument("--compression", choices=["gzip"], help="write gzip shards")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds before a writer is stopped")
    parser.add_argument("--cases", nargs="+", choices=[c.name for c in CASES], help="run only these cases")
    parser.add_argument("--json", help="also write the results here")
    # One measured process (used by the orchestrator):
    parser.add_argument("--child", choices=["baseline", *WRITERS], help=argparse.SUPPRESS)
    parser.add_argument("--case", help=argparse.SUPPRESS)
    parser.add_argument("--buckets", help=argparse.SUPPRESS)
    parser.add_argument("--output", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        child(args)
        return 0
    cases = tuple(args.cases or (c.name for c in CASES))
    workdir = Path(args.workdir).resolve()
    section = run(workdir, args.shard_mb, args.budget_mb, args.repeat, args.timeout, args.compression, cases)
    print()
    print(render(section))
    if args.json:
        Path(args.json).write_text(json.dumps(section, indent=2))
    return 1 if failed(section) else 0


if __name__ == "__main__":
    raise SystemExit(main())
