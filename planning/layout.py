"""The shards' byte layout, known before any data is read, so units can write records in place.

A sample's shuffle key depends only on its position, so its shard and its rank in the shard
are known at planning; its record's size depends only on its int64 values (positions and
coordinates), floats having fixed sizes. Hence every record's final byte offset is known up
front, and each unit writes its records straight into the shard files (sparse until every
record is in, transforms.in_place): every byte is written once, with no bucket files and no
sorting stage, and memory stays bounded by a unit.
A retried unit rewrites the same bytes at the same offsets. When it applies: planning.write_strategy.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from planning.keys import keys_and_shards
from planning.plan import BuildPlan
from schemas.example_codec import ExampleEncoder
from schemas.npy_files import mapped_npy
from schemas.tfrecord import FOOTER_BYTES, HEADER_BYTES

_CHUNK = 1_000_000
_FRAMING = HEADER_BYTES + FOOTER_BYTES


@dataclasses.dataclass(frozen=True)
class ShardLayout:
    """Where every record goes: arrays by sample id (mapped from ``directory``) and per-shard totals."""

    directory: str
    records: tuple[int, ...]  # per shard (numbered across splits)
    bytes: tuple[int, ...]

    def shard_of_id(self) -> np.ndarray:
        """Each sample id's shard, or -1 if it is not written (outside the splits, across a gap)."""
        return mapped_npy(os.path.join(self.directory, "shard_of_id.npy"))

    def offset_of_id(self) -> np.ndarray:
        """Each sample id's record's byte offset in its shard."""
        return mapped_npy(os.path.join(self.directory, "offset_of_id.npy"))

    def record_ends(self) -> np.ndarray:
        """Where each record ends, counted from the first shard's start as if the shards were one file, in the
        order the records lie in the shards: a shard's index is its slice (``shard_sizes``), without a re-read."""
        return mapped_npy(os.path.join(self.directory, "record_ends.npy"))

    def shard_start(self, shard: int) -> int:
        """Where ``shard`` starts in ``record_ends``' count of bytes."""
        return sum(self.bytes[:shard])

    def shard_sizes(self, shard: int) -> np.ndarray:
        """The framed sizes of ``shard``'s records, in the order they lie in it (what its index lists)."""
        first = sum(self.records[:shard])
        ends = np.asarray(self.record_ends()[first : first + self.records[shard]])
        return np.diff(ends, prepend=self.shard_start(shard))


def _chunk_layout(plan: BuildPlan, encoder: ExampleEncoder, ids: np.ndarray):
    """Shard, key and framed record size of the samples with these ids that are written."""
    positions = list(np.unravel_index(ids, plan.grid.shape)) if plan.grid.grid_axes else []
    labels = plan.positions.split_labels(positions)
    written = labels >= 0
    ids, labels = ids[written], labels[written]
    positions = [p[written] for p in positions]
    keys, shards = keys_and_shards(ids, labels, plan.seed, plan.splits)
    columns = {name: values for name, (_, values) in plan.positions.columns(positions).items()}
    sizes = encoder.record_lengths(columns, len(ids)) + _FRAMING
    return ids, shards, keys, sizes


def plan_layout(plan: BuildPlan, directory: str) -> ShardLayout:
    """Compute every record's shard and offset, save them under ``directory``, return the totals."""
    encoder = ExampleEncoder(plan.schema.features)
    total = plan.grid.num_samples
    parts = [_chunk_layout(plan, encoder, np.arange(s, min(s + _CHUNK, total))) for s in range(0, total, _CHUNK)]
    ids, shards, keys, sizes = (np.concatenate(column) for column in zip(*parts))
    order = np.lexsort((keys, shards))  # by shard, then by shuffle key within it
    sorted_shards, sorted_sizes = shards[order], sizes[order]
    ends = np.cumsum(sorted_sizes)
    firsts = np.searchsorted(sorted_shards, np.arange(plan.num_shards))
    starts_of_shard = np.concatenate(([0], ends))[firsts]
    offsets = ends - sorted_sizes - starts_of_shard[sorted_shards]
    shard_of_id = np.full(total, -1, dtype=np.int32)
    offset_of_id = np.zeros(total, dtype=np.int64)
    shard_of_id[ids[order]] = sorted_shards
    offset_of_id[ids[order]] = offsets
    os.makedirs(directory, exist_ok=True)
    np.save(os.path.join(directory, "shard_of_id.npy"), shard_of_id)
    np.save(os.path.join(directory, "offset_of_id.npy"), offset_of_id)
    np.save(os.path.join(directory, "record_ends.npy"), ends)
    records = np.bincount(shards, minlength=plan.num_shards)
    nbytes = np.bincount(shards, weights=sizes, minlength=plan.num_shards).astype(np.int64)
    return ShardLayout(directory, tuple(int(r) for r in records), tuple(int(b) for b in nbytes))
