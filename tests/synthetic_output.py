"""Outputs written directly (no Beam): any features, shard count, gzip or packed records, for reader tests."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np

from schemas.example_codec import ExampleEncoder
from schemas.schema import RECORD_COUNT, Feature, Schema, Shard
from schemas.shard_index import index_lines, index_name
from schemas.tfrecord import frame

#: A mix of what readers must get right: multi-dim floats, scalars, negative and huge int64s.
FEATURES = (
    Feature("t", "float32", (2, 3, 4), ("level", "lat", "lon"), "variable", {"attrs": {"units": "K"}}),
    Feature("w", "float32", (), (), "variable"),
    Feature("index/time", "int64", (), (), "index", {"dim": "time"}),
    Feature("coord/time", "int64", (3,), ("time",), "coord", {"dim": "time"}),
    Feature("coord/lat", "float32", (3,), ("lat",), "coord", {"dim": "lat", "units": "degrees_north"}),
)


def make_columns(features, n: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Random values per feature, with the awkward ones included: NaN, inf, -0.0, int64 extremes."""
    rng = np.random.default_rng(seed)
    columns = {}
    for f in features:
        if f.dtype == "float32":
            values = rng.standard_normal((n, *f.shape)).astype(np.float32) * 1e3
            flat = values.reshape(-1)
            flat[: min(3, flat.size)] = [np.nan, np.inf, -0.0][: min(3, flat.size)]
        else:
            values = rng.integers(-(2**62), 2**62, size=(n, *f.shape), dtype=np.int64)
            flat = values.reshape(-1)
            flat[: min(3, flat.size)] = [np.iinfo(np.int64).min, np.iinfo(np.int64).max, 0][: min(3, flat.size)]
        columns[f.name] = values
    columns["index/time"] = np.arange(n, dtype=np.int64)  # identifies each sample in the tests
    return columns


def pack(columns: dict[str, np.ndarray], n_per_record: int) -> dict[str, np.ndarray]:
    """Group consecutive samples into records of n_per_record; the last one padded with zeros."""
    n = len(columns["index/time"])
    records = -(-n // n_per_record)
    packed = {}
    for name, values in columns.items():
        padded = np.zeros((records * n_per_record, *values.shape[1:]), values.dtype)
        padded[:n] = values
        packed[name] = padded.reshape(records, n_per_record, *values.shape[1:])
    packed[RECORD_COUNT] = np.minimum(n_per_record, n - n_per_record * np.arange(records)).astype(np.int64)
    return packed


def write_output(
    directory: Path,
    columns: dict[str, np.ndarray],
    shard_sizes: list[int],
    features=FEATURES,
    compression: str | None = None,
    examples_per_record: int = 1,
    split: str = "data",
    index: bool = True,
    listed: bool = False,
) -> Schema:
    """Write samples as shards of ``shard_sizes`` samples each (and their .tfindex), then schema.json, stats.json.

    ``listed``: schema.json in its first format (every shard listed in it), as outputs of earlier versions hold it;
    else its shards by rule, their counts in shards.npz."""
    directory.mkdir(parents=True, exist_ok=True)
    schema = Schema(features=tuple(features), compression=compression, examples_per_record=examples_per_record)
    encoder = ExampleEncoder(schema.record_features())
    shards, start = [], 0
    suffix = ".tfrecord.gz" if compression == "gzip" else ".tfrecord"
    for number, size in enumerate(shard_sizes):
        part = {name: values[start : start + size] for name, values in columns.items()}
        start += size
        if examples_per_record > 1 and size:
            part = pack(part, examples_per_record)
        records = encoder.encode(part) if size else []
        framed = [frame(r) for r in records]
        data = b"".join(framed)
        if compression == "gzip":
            data = gzip.compress(data)
        name = f"{split}-{number:05d}-of-{len(shard_sizes):05d}{suffix}"
        (directory / name).write_bytes(data)
        indexed = index and not compression
        if indexed:
            (directory / index_name(name)).write_bytes(index_lines([len(f) for f in framed]))
        shards.append(Shard(name, len(records), len(data), size, index_name(name) if indexed else None))
    schema = Schema(
        features=tuple(features),
        splits={split: tuple(shards)},
        compression=compression,
        examples_per_record=examples_per_record,
        seed=7,
    )
    schema = schema if listed else schema.by_rule()
    write_schema(directory, schema, listed)
    variables = {f.name: {"mean": 0.0, "std": 1.0} for f in features if f.role == "variable"}
    (directory / "stats.json").write_text(json.dumps({"variables": variables}))
    return schema


def write_schema(directory: Path, schema: Schema, listed: bool = False) -> None:
    """schema.json (and its shards.npz unless ``listed``: every shard listed in it, the first format)."""
    if listed:
        (directory / "schema.json").write_text(schema.dumps(listed=True))
        return
    for name, data in schema.by_rule().files().items():
        (directory / name).write_bytes(data)


def rewrite_counts(directory: Path, change) -> None:
    """Rewrite an output's shards.npz with ``change(counts)`` applied to its arrays, and schema.json to match
    (totals, size, digest): a forgery consistent but for what ``change`` does to the shards themselves."""
    from schemas.metadata import load_schema
    from schemas.shards import ShardTable

    schema = load_schema(str(directory))
    table = schema.shard_table
    counts = {key: np.array(values) for key, values in table.counts().items()}
    change(counts)
    forged = ShardTable.from_arrays(table.rules, counts)
    document = json.loads((directory / "schema.json").read_text())
    document["splits"], document["shards"] = forged.to_json()
    (directory / "schema.json").write_text(json.dumps(document))
    (directory / forged.reference["file"]).write_bytes(forged.data())
