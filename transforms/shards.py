"""WriteShards: merge a shard's buckets, sort by shuffle key, write one TFRecord file atomically."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

import apache_beam as beam
import numpy as np
from apache_beam.metrics import Metrics

from transforms.buckets import unpack_bucket
from transforms.cut import METRICS_NAMESPACE
from transforms.output import join, read_bytes, shard_name, write_atomically
from transforms.plan import BuildPlan

_RECORDS_PER_WRITE = 4096


@dataclasses.dataclass(frozen=True)
class ShardResult:
    split: str
    shard: int
    file: str
    records: int
    bytes: int


def sorted_records(buckets: Iterable[bytes | str]) -> tuple[list[memoryview], np.ndarray]:
    """All framed records of a shard's buckets in shuffle-key order, and their keys.

    A bucket is its bytes or the path of its file. Keys are unique by construction (a
    bijective hash of unique sample ids); a repeat means a sample was cut twice, which fails
    the build rather than writing a duplicate.
    """
    all_keys, records = [], []
    for bucket in buckets:
        blob = read_bytes(bucket) if isinstance(bucket, str) else bucket
        keys, lengths, payload = unpack_bucket(blob, name=bucket if isinstance(bucket, str) else "bucket")
        ends = np.cumsum(lengths, dtype=np.int64).tolist()
        starts = [0, *ends[:-1]]
        records.extend(payload[s:e] for s, e in zip(starts, ends))
        all_keys.append(keys)
    keys = np.concatenate(all_keys) if all_keys else np.zeros(0, np.uint64)
    order = np.argsort(keys, kind="stable")
    keys = keys[order]
    if len(keys) > 1 and np.any(keys[1:] == keys[:-1]):
        raise RuntimeError(
            "duplicate shuffle key in one shard: a sample was cut twice; this is a bug, please report it"
        )
    return [records[i] for i in order.tolist()], keys


def write_shard(plan: BuildPlan, split: str, shard: int, buckets: Iterable[bytes | str]) -> ShardResult:
    records, _ = sorted_records(buckets)
    name = shard_name(split, shard, plan.num_shards)
    chunks = (b"".join(records[i : i + _RECORDS_PER_WRITE]) for i in range(0, len(records), _RECORDS_PER_WRITE))
    written = write_atomically(join(plan.output, name), chunks)
    return ShardResult(split, shard, name, len(records), written)


class _WriteShardFn(beam.DoFn):
    def __init__(self, plan: BuildPlan, split: str):
        self._plan = plan
        self._split = split
        self._records = Metrics.counter(METRICS_NAMESPACE, "records_written")
        self._bytes = Metrics.counter(METRICS_NAMESPACE, "bytes_written")
        self._shard_bytes = Metrics.distribution(METRICS_NAMESPACE, "shard_bytes")

    def process(self, element):
        shard, buckets = element
        result = write_shard(self._plan, self._split, shard, buckets)
        self._records.inc(result.records)
        self._bytes.inc(result.bytes)
        self._shard_bytes.update(result.bytes)
        yield result


class WriteShards(beam.PTransform):
    """(shard id, bucket) pairs -> one written TFRecord file per shard -> ShardResult."""

    def __init__(self, plan: BuildPlan, split: str = "data"):
        super().__init__()
        self._plan = plan
        self._split = split

    def expand(self, buckets):
        return (
            buckets
            | "GroupByShard" >> beam.GroupByKey()
            | "WriteShard" >> beam.ParDo(_WriteShardFn(self._plan, self._split))
        )
