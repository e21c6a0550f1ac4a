"""The read side: an output's generated ``parser.make_dataset`` against a hand-written expert tf.data pipeline.

Both read the same shards with the same batch size; one process reads every dataset given.
Rounds alternate the two readers (and which goes first), after one untimed warm-up pass
each, so a noisy neighbour slows both alike; the best round of each is reported.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import tensorflow as tf  # after quieting TensorFlow's C++ logging

from schemas import load_schema

_DTYPES = {"float32": tf.float32, "int64": tf.int64}


def import_parser(output: Path):
    """The output's parser.py as a module, registered as ``import parser`` would register it."""
    spec = importlib.util.spec_from_file_location("generated_parser", output / "parser.py")
    module = importlib.util.module_from_spec(spec)
    # AutoGraph looks functions' modules up in sys.modules; unregistered, it gives up with a warning.
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def expert_dataset(output: Path, features: list[dict], batch_size: int) -> tf.data.Dataset:
    """What an expert writes by hand: interleaved shards, batch, parse_example, prefetch."""
    files = sorted(str(p) for p in output.glob("data-*.tfrecord"))
    spec = {f["name"]: tf.io.FixedLenFeature(f["shape"], _DTYPES[f["dtype"]]) for f in features}
    dataset = tf.data.Dataset.from_tensor_slices(files).interleave(
        tf.data.TFRecordDataset,
        cycle_length=len(files),
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=False,
    )
    dataset = dataset.batch(batch_size).map(lambda r: tf.io.parse_example(r, spec), num_parallel_calls=tf.data.AUTOTUNE)
    return dataset.prefetch(tf.data.AUTOTUNE)


def drain(dataset: tf.data.Dataset, name: str) -> tuple[int, float]:
    """Examples read in one full pass, and the seconds it took."""
    started = time.perf_counter()
    count = 0
    for batch in dataset:
        count += int(batch[name].shape[0])
    return count, time.perf_counter() - started


def compare(output: Path, batch_size: int, rounds: int) -> dict:
    schema = json.loads((output / "schema.json").read_text())
    features = schema["features"]
    readers = {"parser": import_parser(output).make_dataset("data", batch_size=batch_size, data_dir=str(output))}
    if schema.get("examples_per_record", 1) == 1:  # the hand-written reader cannot unpack packed records
        readers["expert"] = expert_dataset(output, features, batch_size)
    first = features[0]["name"]
    for dataset in readers.values():
        drain(dataset, first)  # warm-up: page cache, graph tracing, autotuning
    rates: dict[str, list[float]] = {name: [] for name in readers}
    order = list(readers)
    for _ in range(rounds):
        for name in order:
            count, seconds = drain(readers[name], first)
            rates[name].append(count / seconds)
        order.reverse()
    shards = load_schema(str(output)).splits["data"]  # (schema.json's shards by rule, their counts beside it)
    return {
        "examples_per_record": schema.get("examples_per_record", 1),
        "records": sum(s.records for s in shards),
        "bytes": sum(s.bytes for s in shards),
        "batch_size": batch_size,
        "rounds": rounds,
        "examples_per_second": rates,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--dataset",
        nargs=2,
        action="append",
        required=True,
        metavar=("OUTPUT", "BATCH"),
        help="a built output directory (with schema.json and parser.py) and the batch size to read it with",
    )
    parser.add_argument("--rounds", type=int, default=3, help="timed passes per reader")
    parser.add_argument("--result", required=True, help="where to write the result JSON")
    args = parser.parse_args(argv)
    # One process for every dataset: TensorFlow's import (~5 s) is paid once.
    result = {output: compare(Path(output), int(batch), args.rounds) for output, batch in args.dataset}
    Path(args.result).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
