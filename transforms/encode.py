"""EncodeAndBucket: blocks -> records keyed for the shuffle and grouped into per-shard buckets.

Each sample's key picks its shard within its split. A bucket carries framed tf.Example
records, or raw sample rows when samples are packed several to a record (packing must wait for
the shard's sort). On local runners a bucket is written to a file and only its path travels
through the GroupByKey; on distributed runners the bytes do, as their shuffle is built for it
(DESIGN.md, decision 3).
"""

from __future__ import annotations

import apache_beam as beam
import numpy as np
import xarray as xr
from apache_beam.metrics import Metrics

from schemas.example_codec import ExampleEncoder
from schemas.tfrecord import frame_parts
from transforms.buckets import bucket_pieces, row_dtype
from transforms.cut import METRICS_NAMESPACE
from transforms.keys import sample_keys, shard_of
from transforms.output import join, write_atomically
from transforms.plan import BuildPlan
from transforms.progress import mark


def record_columns(plan: BuildPlan, block: xr.Dataset) -> dict[str, np.ndarray]:
    """Every record feature's values for the block's samples (stacked variables joined on their channel axis)."""
    columns = {name: block[name].values for name in block.data_vars}
    for stack in plan.stacks:
        axis = 1 if stack.axis == 0 else -1  # after the leading sample axis
        columns[stack.feature.name] = np.stack([columns.pop(name) for name in stack.variables], axis=axis)
    for name in block.coords:
        if name.startswith(("index/", "coord/")):
            columns[name] = block[name].values
    return columns


def global_shards(plan: BuildPlan, keys: np.ndarray, splits: np.ndarray) -> np.ndarray:
    """Each sample's shard, numbered across splits."""
    counts = np.array([s.num_shards for s in plan.splits], dtype=np.uint64)
    firsts = np.array([s.first_shard for s in plan.splits], dtype=np.int64)
    return firsts[splits] + shard_of(keys, counts[splits])


def sample_rows(plan: BuildPlan, columns: dict[str, np.ndarray]) -> np.ndarray:
    """The samples as raw fixed-size rows (for packing after the shard's sort)."""
    features = plan.schema.features
    n = len(columns[features[0].name])
    rows = np.empty(n, dtype=row_dtype(features))
    for i, feature in enumerate(features):
        rows[f"f{i}"] = columns[feature.name]
    return rows


def bucket_block(plan: BuildPlan, encoder: ExampleEncoder, block: xr.Dataset) -> list[tuple[int, list[bytes]]]:
    """Encode a block's samples and split them by shard: [(global shard number, bucket pieces)].

    The pieces of a bucket, joined, are its blob (see transforms.buckets); kept apart they can
    be written to a file without another copy of the records.
    """
    keys = sample_keys(block["sample_id"].values, plan.seed)
    shards = global_shards(plan, keys, block["split"].values.astype(np.int64))
    columns = record_columns(plan, block)
    if plan.config.output.examples_per_record > 1:
        payloads = sample_rows(plan, columns)
    else:
        payloads = [frame_parts(record) for record in encoder.encode(columns)]
    order = np.argsort(shards, kind="stable")
    bounds = np.flatnonzero(np.diff(shards[order])) + 1
    buckets = []
    for chunk in np.split(order, bounds):
        if len(chunk):
            part = payloads[chunk] if isinstance(payloads, np.ndarray) else [payloads[i] for i in chunk]
            buckets.append((int(shards[chunk[0]]), bucket_pieces(keys[chunk], part)))
    return buckets


class _EncodeAndBucketFn(beam.DoFn):
    def __init__(self, plan: BuildPlan, bucket_dir: str | None, progress_dir: str | None):
        self._plan = plan
        self._bucket_dir = bucket_dir
        self._progress_dir = progress_dir
        self._bytes = Metrics.counter(METRICS_NAMESPACE, "bytes_encoded")

    def setup(self):
        self._encoder = ExampleEncoder(self._plan.schema.features)

    def process(self, block: xr.Dataset):
        unit = block.attrs["unit"]
        for shard, pieces in bucket_block(self._plan, self._encoder, block):
            self._bytes.inc(sum(map(len, pieces)))
            if self._bucket_dir is None:
                yield shard, b"".join(pieces)
            else:
                path = join(self._bucket_dir, f"shard-{shard:05d}", f"unit-{unit:06d}.bucket")
                write_atomically(path, pieces)
                yield shard, path
        mark(self._progress_dir, "unit", unit, samples=block.sizes["sample"])


class EncodeAndBucket(beam.PTransform):
    """Blocks -> (shard number, bucket): a bucket file path if ``bucket_dir`` is set, else the bytes."""

    def __init__(self, plan: BuildPlan, bucket_dir: str | None, progress_dir: str | None = None):
        super().__init__()
        self._plan = plan
        self._bucket_dir = bucket_dir
        self._progress_dir = progress_dir

    def expand(self, blocks):
        return blocks | "Encode" >> beam.ParDo(_EncodeAndBucketFn(self._plan, self._bucket_dir, self._progress_dir))
