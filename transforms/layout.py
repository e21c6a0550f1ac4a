"""The shards' byte layout, known before any data is read, so units can write records in place.

A sample's shuffle key depends only on its position, so its shard and its rank in the shard
are known at planning; its record's size depends only on its int64 values (positions and
coordinates), floats having fixed sizes. Hence every record's final byte offset is known up
front, and each unit writes its records straight into preallocated shard files: every byte is
written once, with no bucket files and no sorting stage, and memory stays bounded by a unit.
A retried unit rewrites the same bytes at the same offsets.

It applies when the workers share the output's filesystem (local runner, local output) and
which samples are written is known at planning: no nan_policy: drop, no packed records, no
compression. Other builds use bucket files or the runner's shuffle (transforms.encode).
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from schemas.example_codec import ExampleEncoder
from schemas.schema import shard_name
from schemas.tfrecord import FOOTER_BYTES, HEADER_BYTES
from transforms.encode import global_shards
from transforms.keys import sample_keys
from transforms.plan import BuildPlan
from transforms.positions import position_columns, split_labels

#: Above this many samples the layout's arrays (about 20 bytes a sample on the driver) are not
#: worth holding; such builds use bucket files.
MAX_SAMPLES = 20_000_000
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
        return np.load(os.path.join(self.directory, "shard_of_id.npy"), mmap_mode="r")

    def offset_of_id(self) -> np.ndarray:
        """Each sample id's record's byte offset in its shard."""
        return np.load(os.path.join(self.directory, "offset_of_id.npy"), mmap_mode="r")

    def temporary_path(self, plan: BuildPlan, shard: int) -> str:
        split, number = plan.split_of_shard(shard)
        name = shard_name(split.name, number, split.num_shards, plan.config.output.compression)
        return os.path.join(plan.output, f"{name}.tmp-{plan.run_id}")


def why_not_in_place(plan: BuildPlan, local_runner: bool) -> str | None:
    """Why this build cannot write records in place, or None if it can."""
    output = plan.config.output
    if not output.in_place:
        return "output.in_place is false"
    if not local_runner or "://" in plan.output:
        return "workers may not share the output's filesystem"
    if plan.config.nan_policy == "drop":
        return "nan_policy: drop decides on the workers which samples are written"
    if output.examples_per_record > 1 or output.compression:
        return "packed or compressed records are only laid out after the shard's sort"
    if any(feature.dtype == "int64" for feature in plan.schema.variable_features):
        return "integer variables are varint-encoded: their records' sizes depend on the data"
    if plan.grid.num_samples > MAX_SAMPLES:
        return f"more than {MAX_SAMPLES:,} samples"
    return None


def _chunk_layout(plan: BuildPlan, encoder: ExampleEncoder, ids: np.ndarray):
    """Shard, key and framed record size of the samples with these ids that are written."""
    positions = list(np.unravel_index(ids, plan.grid.shape)) if plan.grid.grid_axes else []
    labels = split_labels(plan, positions)
    written = labels >= 0
    ids, labels = ids[written], labels[written].astype(np.int64)
    positions = [p[written] for p in positions]
    keys = sample_keys(ids, plan.seed)
    shards = global_shards(plan, keys, labels)
    columns = {name: values for name, (_, values) in position_columns(plan, positions).items()}
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
    records = np.bincount(shards, minlength=plan.num_shards)
    nbytes = np.bincount(shards, weights=sizes, minlength=plan.num_shards).astype(np.int64)
    return ShardLayout(directory, tuple(int(r) for r in records), tuple(int(b) for b in nbytes))


def preallocate(plan: BuildPlan, layout: ShardLayout) -> None:
    """Create every shard under its temporary name at its final size (sparse until written)."""
    os.makedirs(plan.output, exist_ok=True)
    for shard, size in enumerate(layout.bytes):
        with open(layout.temporary_path(plan, shard), "wb") as stream:
            stream.truncate(size)
