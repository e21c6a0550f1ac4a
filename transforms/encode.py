"""EncodeAndBucket: blocks -> framed tf.Example records, keyed and grouped into per-shard buckets.

On local runners a bucket is written to a file under ``<output>/_tmp/`` and only its path
travels through the GroupByKey; on distributed runners the bucket bytes themselves do, since
their shuffle service is built for it (DESIGN.md, decision 3).
"""

from __future__ import annotations

import apache_beam as beam
import numpy as np
import xarray as xr
from apache_beam.metrics import Metrics

from schemas.example_codec import ExampleEncoder
from schemas.tfrecord import frame
from transforms.buckets import pack_bucket
from transforms.cut import METRICS_NAMESPACE
from transforms.keys import sample_keys, shard_of
from transforms.output import join, write_atomically
from transforms.plan import BuildPlan


def bucket_block(plan: BuildPlan, encoder: ExampleEncoder, block: xr.Dataset) -> list[tuple[int, bytes]]:
    """Encode a block's samples and split them by shard: [(shard id, bucket blob)]."""
    keys = sample_keys(block["sample_id"].values, plan.seed)
    shards = shard_of(keys, plan.num_shards)
    records = encoder.encode({f.name: block[f.name].values for f in encoder.features})
    framed = [frame(r) for r in records]
    order = np.argsort(shards, kind="stable")
    sorted_shards = shards[order]
    bounds = np.flatnonzero(np.diff(sorted_shards)) + 1
    buckets = []
    for chunk in np.split(order, bounds):
        if len(chunk):
            buckets.append((int(shards[chunk[0]]), pack_bucket(keys[chunk], [framed[i] for i in chunk])))
    return buckets


class _EncodeAndBucketFn(beam.DoFn):
    def __init__(self, plan: BuildPlan, bucket_dir: str | None):
        self._plan = plan
        self._bucket_dir = bucket_dir
        self._bytes = Metrics.counter(METRICS_NAMESPACE, "bytes_encoded")

    def setup(self):
        self._encoder = ExampleEncoder(self._plan.schema.features)

    def process(self, block: xr.Dataset):
        unit = block.attrs["unit"]
        for shard, blob in bucket_block(self._plan, self._encoder, block):
            self._bytes.inc(len(blob))
            if self._bucket_dir is None:
                yield shard, blob
            else:
                path = join(self._bucket_dir, f"shard-{shard:05d}", f"unit-{unit:06d}.bucket")
                write_atomically(path, [blob])
                yield shard, path


class EncodeAndBucket(beam.PTransform):
    """Blocks -> (shard id, bucket): a bucket file path if ``bucket_dir`` is set, else the bytes."""

    def __init__(self, plan: BuildPlan, bucket_dir: str | None):
        super().__init__()
        self._plan = plan
        self._bucket_dir = bucket_dir

    def expand(self, blocks):
        return blocks | "Encode" >> beam.ParDo(_EncodeAndBucketFn(self._plan, self._bucket_dir))
