"""WriteShards: blocks -> shuffled, sharded TFRecord files, by the strategy chosen at planning.

The strategy (planning.write_strategy) is decided once, on the driver, and carried by the
spec; this stage only wires the steps that strategy needs. Every strategy writes the same bytes.
"""

from __future__ import annotations

import dataclasses

import apache_beam as beam

from planning.specs import WriteSpec
from planning.write_strategy import WriteStrategy
from transforms.encode import EncodeAndBucket, _EncodeAndBucketFn
from transforms.in_place import WriteInPlace, _WriteInPlaceFn
from transforms.shards import WriteBucketedShards


@dataclasses.dataclass
class WriteShards(beam.PTransform):
    """Blocks -> one ShardResult per shard written."""

    spec: WriteSpec

    def expand(self, blocks):
        if self.spec.strategy is WriteStrategy.IN_PLACE:
            # Block -> {shard: [records, bytes]} -> ShardResult
            return blocks | "WriteInPlace" >> WriteInPlace(self.spec)
        return (
            blocks
            | "EncodeAndBucket" >> EncodeAndBucket(self.spec)  # Block -> (shard, bucket path or bytes)
            | "WriteBucketedShards" >> WriteBucketedShards(self.spec)  # -> ShardResult
        )


def block_writer(spec: WriteSpec) -> beam.DoFn:
    """WriteShards' step that takes each block (transforms.streamed runs it beside the cutting)."""
    return _WriteInPlaceFn(spec) if spec.strategy is WriteStrategy.IN_PLACE else _EncodeAndBucketFn(spec)
