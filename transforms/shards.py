"""WriteShards: merge a shard's buckets, sort by shuffle key, write one TFRecord file atomically.

With ``output.examples_per_record`` N > 1 the sorted samples are packed N to a record here:
each feature gains a leading axis of N and ``record/count`` says how many rows are real (the
last record of a shard may be part empty, its unused rows zero).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

import apache_beam as beam
import numpy as np
from apache_beam.metrics import Metrics

from schemas.example_codec import ExampleEncoder
from schemas.schema import RECORD_COUNT, Feature, shard_name
from schemas.tfrecord import frame
from transforms.buckets import row_dtype, unpack_bucket
from transforms.cut import METRICS_NAMESPACE
from transforms.output import join, read_bytes, write_atomically
from transforms.plan import BuildPlan
from transforms.progress import mark


@dataclasses.dataclass(frozen=True)
class ShardResult:
    split: str
    shard: int  # number within the split
    file: str
    records: int
    bytes: int
    examples: int


def sorted_payloads(buckets: Iterable[bytes | str]) -> tuple[list[memoryview], np.ndarray]:
    """All payloads of a shard's buckets in shuffle-key order, and their keys.

    A bucket is its bytes or the path of its file. Keys are unique by construction (a
    bijective hash of unique sample ids); a repeat means a sample was cut twice, which fails
    the build rather than writing a duplicate.
    """
    all_keys, payloads = [], []
    for bucket in buckets:
        blob = read_bytes(bucket) if isinstance(bucket, str) else bucket
        keys, lengths, payload = unpack_bucket(blob, name=bucket if isinstance(bucket, str) else "bucket")
        ends = np.cumsum(lengths, dtype=np.int64).tolist()
        starts = [0, *ends[:-1]]
        payloads.extend(payload[s:e] for s, e in zip(starts, ends))
        all_keys.append(keys)
    keys = np.concatenate(all_keys) if all_keys else np.zeros(0, np.uint64)
    order = np.argsort(keys, kind="stable")
    keys = keys[order]
    if len(keys) > 1 and np.any(keys[1:] == keys[:-1]):
        raise RuntimeError("duplicate shuffle key in a shard: a sample was cut twice; this is a bug, please report it")
    return [payloads[i] for i in order.tolist()], keys


def pack_rows(features: tuple[Feature, ...], rows: np.ndarray, per_record: int) -> dict[str, np.ndarray]:
    """Columns of packed records: every feature shaped (records, per_record, *shape), plus the counts."""
    n = len(rows)
    records = -(-n // per_record)
    padded = np.zeros(records * per_record, dtype=rows.dtype)
    padded[:n] = rows
    columns = {f.name: padded[f"f{i}"].reshape((records, per_record, *f.shape)) for i, f in enumerate(features)}
    counts = np.full(records, per_record, dtype=np.int64)
    if records:
        counts[-1] = n - (records - 1) * per_record
    columns[RECORD_COUNT] = counts
    return columns


def framed_records(plan: BuildPlan, payloads: list[memoryview]) -> tuple[list, int]:
    """The shard's framed records in order, and the number of samples they hold."""
    per_record = plan.config.output.examples_per_record
    if per_record == 1:
        return payloads, len(payloads)
    features = plan.schema.features
    rows = np.frombuffer(b"".join(payloads), dtype=row_dtype(features))
    encoder = ExampleEncoder(plan.schema.record_features())
    records = encoder.encode(pack_rows(features, rows, per_record)) if len(rows) else []
    return [frame(r) for r in records], len(rows)


def write_shard(plan: BuildPlan, shard: int, buckets: Iterable[bytes | str]) -> ShardResult:
    split, number = plan.split_of_shard(shard)
    payloads, _ = sorted_payloads(buckets)
    records, examples = framed_records(plan, payloads)
    compression = plan.config.output.compression
    name = shard_name(split.name, number, split.num_shards, compression)
    # Records go to the file one by one: joining them first would copy the shard once more.
    size = write_atomically(join(plan.output, name), records, compression)
    return ShardResult(split.name, number, name, len(records), size, examples)


class _WriteShardFn(beam.DoFn):
    def __init__(self, plan: BuildPlan, progress_dir: str | None):
        self._plan = plan
        self._progress_dir = progress_dir
        self._records = Metrics.counter(METRICS_NAMESPACE, "records_written")
        self._bytes = Metrics.counter(METRICS_NAMESPACE, "bytes_written")
        self._shard_bytes = Metrics.distribution(METRICS_NAMESPACE, "shard_bytes")

    def process(self, element):
        shard, buckets = element
        result = write_shard(self._plan, shard, buckets)
        self._records.inc(result.records)
        self._bytes.inc(result.bytes)
        self._shard_bytes.update(result.bytes)
        mark(self._progress_dir, "shard", shard, records=result.examples, bytes=result.bytes)
        yield result


class WriteShards(beam.PTransform):
    """(shard number, bucket) pairs -> one written TFRecord file per shard -> ShardResult."""

    def __init__(self, plan: BuildPlan, progress_dir: str | None = None):
        super().__init__()
        self._plan = plan
        self._progress_dir = progress_dir

    def expand(self, buckets):
        write = _WriteShardFn(self._plan, self._progress_dir)
        return buckets | "GroupByShard" >> beam.GroupByKey() | "WriteShard" >> beam.ParDo(write)
