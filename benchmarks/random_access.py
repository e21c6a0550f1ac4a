"""Random access by position: our shards and .tfindex against ArrayRecord (``python -m benchmarks.random_access``).

The same serialized ``tf.train.Example`` records (44 KB patches, 0.5 KB points) are written as our
TFRecord shards with their index and as ArrayRecord files (``group_size:1``, its random-access
setting), then read from the page cache in one process, rounds alternating:

- single reads per second on one thread, at random positions: ours as records (the serialized
  Example, both CRCs checked) and as samples (decoded to numpy), ArrayRecord's ``__getitem__``;
- batches of 256 random positions per second: ours ``records`` / ``__getitems__``, ArrayRecord's
  ``__getitems__``;
- sequential ``tf.data`` reading of our shards (records per second), the ceiling random access
  is measured against.

Only the ratios between rows of one run are meant to be compared; the best round of each is kept.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.tables import table
from schemas.example_codec import ExampleEncoder
from schemas.random_access import RandomAccessSource
from schemas.schema import Feature, Schema, Shard
from schemas.shard_index import index_lines, index_name
from schemas.tfrecord import frame

#: (name, feature shape, records, shards): a 44 KB patch (11 x 32 x 32 float32) and a 0.5 KB point (120 float32).
SETS = (("patches 44 KB", (11, 32, 32), 4000, 4), ("points 0.5 KB", (120,), 100_000, 4))
QUICK_SETS = (("patches 44 KB", (11, 32, 32), 64, 2), ("points 0.5 KB", (120,), 512, 2))  # a smoke test
BATCH = 256
#: Targets: our rate over ArrayRecord's (issue 23).
MIN_SINGLE_RATIO = 1.0
MIN_BATCH_RATIO = 1.0


def write_sets(directory: Path, shape: tuple[int, ...], records: int, shards: int) -> tuple[Path, list[Path]]:
    """The same records as our output (shards, .tfindex, schema.json) and as ArrayRecord files."""
    from array_record.python.array_record_module import ArrayRecordWriter

    features = (
        Feature("x", "float32", shape, tuple(f"d{i}" for i in range(len(shape))), "variable"),
        Feature("index/time", "int64", (), (), "index", {"dim": "time"}),
    )
    encoder = ExampleEncoder(features)
    rng = np.random.default_rng(0)
    ours, theirs, written = directory / "ours", [], []
    ours.mkdir(parents=True)
    per_shard = -(-records // shards)
    for number in range(shards):
        start, stop = number * per_shard, min(records, (number + 1) * per_shard)
        columns = {
            "x": rng.standard_normal((stop - start, *shape)).astype(np.float32),
            "index/time": np.arange(start, stop, dtype=np.int64),
        }
        encoded = encoder.encode(columns)
        framed = [frame(r) for r in encoded]
        name = f"data-{number:05d}-of-{shards:05d}.tfrecord"
        (ours / name).write_bytes(b"".join(framed))
        (ours / index_name(name)).write_bytes(index_lines([len(f) for f in framed]))
        written.append(Shard(name, len(framed), sum(map(len, framed)), index=index_name(name)))
        path = directory / f"theirs-{number:05d}.array_record"
        writer = ArrayRecordWriter(str(path), "group_size:1")
        for record in encoded:
            writer.write(record)
        writer.close()
        theirs.append(path)
    (ours / "schema.json").write_text(Schema(features=features, splits={"data": tuple(written)}).dumps())
    return ours, theirs


def _rate(read, positions: np.ndarray, per_call: int) -> float:
    started = time.perf_counter()
    for start in range(0, len(positions), per_call):
        read(positions[start : start + per_call])
    return len(positions) / (time.perf_counter() - started)


def _sequential_tf(ours: Path) -> float:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf

    files = sorted(str(p) for p in ours.glob("*.tfrecord"))
    dataset = (
        tf.data.Dataset.from_tensor_slices(files)
        .interleave(tf.data.TFRecordDataset, cycle_length=len(files), num_parallel_calls=tf.data.AUTOTUNE)
        .batch(BATCH)
        .prefetch(tf.data.AUTOTUNE)
    )
    best = 0.0
    for _ in range(3):
        started, count = time.perf_counter(), 0
        for batch in dataset:
            count += int(batch.shape[0])
        best = max(best, count / (time.perf_counter() - started))
    return best


def measure(name: str, shape, records: int, shards: int, rounds: int, workdir: Path) -> dict:
    from array_record.python.array_record_data_source import ArrayRecordDataSource

    ours_path, theirs_paths = write_sets(workdir / name.split()[0], shape, records, shards)
    ours = RandomAccessSource(str(ours_path))
    theirs = ArrayRecordDataSource([str(p) for p in theirs_paths])
    assert len(ours) == len(theirs) == records
    probe = np.random.default_rng(1).integers(0, records, 50)
    assert ours.records(probe) == [theirs[int(i)] for i in probe], "the two hold different records"
    singles = min(records, 20_000)
    readers = {
        "ours: record": (lambda p: ours.records(p), 1),
        "ours: sample (decoded)": (lambda p: ours.__getitems__(p), 1),
        "ArrayRecord": (lambda p: theirs[int(p[0])], 1),
        "ours: batch of records": (lambda p: ours.records(p), BATCH),
        "ours: batch of samples": (lambda p: ours.__getitems__(p), BATCH),
        "ArrayRecord: batch": (lambda p: theirs.__getitems__(p.tolist()), BATCH),
    }
    rates: dict[str, float] = {key: 0.0 for key in readers}
    rng = np.random.default_rng(2)
    for read, per_call in readers.values():  # warm-up: page cache, open files, indexes
        _rate(read, rng.integers(0, records, min(records, 2000)), per_call)
    for _ in range(rounds):
        for key, (read, per_call) in readers.items():
            count = singles if per_call == 1 else min(records, 50 * BATCH)
            rates[key] = max(rates[key], _rate(read, rng.integers(0, records, count), per_call))
    rates["tf.data sequential (ours)"] = _sequential_tf(ours_path)
    size = sum(p.stat().st_size for p in ours_path.glob("*.tfrecord")) / records
    return {"name": name, "records": records, "record_bytes": size, "per_second": rates}


#: A build with the index written, or with writing it patched out (the A/B of what the index costs a build).
_BUILD = """
import sys
from pipelines import build
if sys.argv[1] == "without":
    import transforms.files, transforms.in_place, transforms.shards
    none = lambda path, sizes: None
    transforms.shards.write_index = transforms.in_place.write_index = none
    transforms.in_place._record_sizes = lambda spec, shard: []
    transforms.in_place._WriteInPlaceFn._check_sizes = lambda self, shards, offsets, framed: None
    import transforms.finalize  # schema.json's rule then says the shards have no index, as the writers did
    rule = transforms.finalize.Generation
    transforms.finalize.Generation = lambda generation, shards, compression, index, *counts: rule(
        generation, shards, compression, False, *counts
    )
sys.exit(build.main(["--config", sys.argv[2], "--quiet", "--overwrite"]))
"""
#: The same build with the time spent inside the index's own functions summed (over every worker thread):
#: what the index costs a build, read inside one run (a whole-build A/B on a shared machine varies by +-10%).
_TIMED_BUILD = """
import json, sys, threading, time
import transforms.in_place as in_place, transforms.shards as shards
spent, lock = [0.0], threading.Lock()
def timed(function):
    def wrapper(*args, **kwargs):
        started = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            with lock:
                spent[0] += time.perf_counter() - started
    return wrapper
shards.write_index, in_place.write_index = timed(shards.write_index), timed(in_place.write_index)
in_place._record_sizes = timed(in_place._record_sizes)
in_place._WriteInPlaceFn._check_sizes = timed(in_place._WriteInPlaceFn._check_sizes)
from pipelines import build
started = time.perf_counter()
code = build.main(["--config", sys.argv[1], "--quiet", "--overwrite"])
print(json.dumps({"wall": time.perf_counter() - started, "index": spent[0]}))
sys.exit(code)
"""
#: Target: a build writing the index takes at most this much longer (the 1x patches set).
MAX_INDEX_BUILD_RATIO = 1.02


def build_cost(workdir: Path, quick: bool, rounds: int) -> dict:
    """What the index costs the 1x build: the time inside its functions against the build's wall (the verdict),
    and the walls of the same build with and without it, rounds alternating (an A/B: noisy on a shared machine)."""
    import sys

    from benchmarks import datasets
    from benchmarks.measure import run_captured

    spec = datasets.patches(1, quick=quick)
    archive = datasets.ensure_archive(workdir, spec)
    config = datasets.write_config(workdir, spec, archive, workdir / "index-cost-out")
    walls: dict[str, list[float]] = {"with": [], "without": []}
    order = ["with", "without"]
    for _ in range(rounds):
        for which in order:
            started = time.perf_counter()
            run_captured([sys.executable, "-c", _BUILD, which, str(config)]).check_returncode()
            walls[which].append(time.perf_counter() - started)
        order.reverse()
    inside = []
    for _ in range(rounds):
        done = run_captured([sys.executable, "-c", _TIMED_BUILD, str(config)])
        done.check_returncode()
        inside.append(json.loads(done.stdout.strip().splitlines()[-1]))
    spent = statistics.median(run["index"] / (run["wall"] - run["index"]) for run in inside)
    return {
        "set": spec.name,
        "walls": walls,
        "ab_ratio": statistics.median(walls["with"]) / statistics.median(walls["without"]),
        "inside": inside,
        "ratio": 1 + spent,
    }


def render(results: list[dict]) -> str:
    rows, lines = [], []
    for result in results:
        rates = result["per_second"]
        for key, rate in rates.items():
            base = rates["ArrayRecord: batch"] if "batch" in key or "sequential" in key else rates["ArrayRecord"]
            rows.append([f"{result['name']}: {key}", f"{rate:,.0f}", f"{rate / base:.2f}"])
        single = rates["ours: record"] / rates["ArrayRecord"]
        batch = rates["ours: batch of records"] / rates["ArrayRecord: batch"]
        lines.append(
            f"{result['name']}: single reads {single:.2f}x ArrayRecord (target >= {MIN_SINGLE_RATIO}), "
            f"batches {batch:.2f}x (target >= {MIN_BATCH_RATIO}) "
            f"{'ok' if single >= MIN_SINGLE_RATIO and batch >= MIN_BATCH_RATIO else 'MISSED'}"
        )
    return "\n".join([table(("reader", "per second", "x ArrayRecord"), rows), "", *lines])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sets, one round (a smoke test)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--result", help="where to write the result JSON")
    parser.add_argument("--build-cost", action="store_true", help="also: a build with the index against without")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="random-access-") as workdir:
        sets = QUICK_SETS if args.quick else SETS
        rounds = 1 if args.quick else args.rounds
        results = [measure(*spec, rounds, Path(workdir)) for spec in sets]
        print(render(results))
        cost = build_cost(Path(workdir), args.quick, rounds) if args.build_cost else None
    if cost is not None:
        verdict = "ok" if cost["ratio"] <= MAX_INDEX_BUILD_RATIO else "MISSED"
        print(
            f"build of {cost['set']} with the index: {cost['ratio']:.3f}x without, from the time inside the index's "
            f"functions (target <= {MAX_INDEX_BUILD_RATIO}) {verdict}; whole builds with / without: "
            f"{cost['ab_ratio']:.3f}x (medians of {len(cost['walls']['with'])}, +-10% noise on a shared machine)"
        )
    if args.result:
        Path(args.result).write_text(json.dumps({"reads": results, "build_cost": cost}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
