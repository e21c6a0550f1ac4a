"""EncodeAndBucket: blocks -> records keyed for the shuffle and grouped into per-shard buckets.

Each sample's key picks its shard within its split. A bucket carries framed tf.Example
records, or raw sample rows when samples are packed several to a record (packing must wait for
the shard's sort). Where the workers share a filesystem (local runners) a bucket is written to a
file of its own; otherwise a block's buckets go to one spill object under the output's ``_tmp/``
(transforms.buckets.spill). Either way only a reference travels through the GroupByKey: a
runner's shuffle is billed by the byte, and some hold a key's values in memory (docs/design.md,
decision 3).
"""

from __future__ import annotations

import dataclasses

import apache_beam as beam
import numpy as np
from apache_beam.metrics import Metrics

from planning.features import CHANNELS_KEY, ROLE_KEY, is_role_stack, role_values, variable_of
from planning.run.contracts import BYTES_ENCODED, METRICS_NAMESPACE, SAMPLE_ID, SPLIT, Block
from planning.run.names import bucket_path
from planning.run.progress import mark
from planning.specs import WriteSpec
from schemas.example_codec import ExampleEncoder
from transforms.buckets.blobs import bucket_pieces, row_dtype
from transforms.buckets.spill import spill_buckets
from transforms.compat import use_anonymous_credentials_for_emulator
from transforms.files import write_atomically


def _filled(block: Block, name: str) -> np.ndarray:
    """Where variable ``name`` was NaN and filled in the block (all False where it had no NaN)."""
    mask = block.filled.get(name)
    return mask if mask is not None else np.zeros(block.samples[name].shape, dtype=bool)


def record_columns(spec: WriteSpec, block: Block) -> dict[str, np.ndarray]:
    """Every record feature's values for the block's samples (stacked variables joined on their channel axis)."""
    samples = block.samples
    columns = {name: samples[name].values for name in samples.data_vars}
    values = dict(columns)  # (a role's stacked feature takes each channel's)
    stacks = {stack.feature.name: stack for stack in spec.stacks}
    roles = {f.name: f for f in spec.features if ROLE_KEY in f.source}
    for stack in spec.stacks:
        axis = 1 if stack.axis == 0 else -1  # after the leading sample axis
        columns[stack.feature.name] = np.stack([columns.pop(name) for name in stack.variables], axis=axis)
    for feature in spec.features:
        if is_role_stack(feature):
            columns[feature.name] = role_values(feature, values)
        elif ROLE_KEY in feature.source:
            columns[feature.name] = role_values(feature, samples[variable_of(feature)].values)
        elif feature.role in ("index", "coord", "aux_coord", "time_feature"):
            columns[feature.name] = samples[feature.name].values
        elif feature.role == "mask":
            of = feature.source["of"]
            marked = roles.get(of)
            if marked is not None and is_role_stack(marked):  # a role's stack: each channel's, at the role's steps
                channels = marked.source[CHANNELS_KEY]
                columns[feature.name] = role_values(marked, {name: _filled(block, name) for name in channels})
            elif marked is not None:  # a role's feature: its variable's, at the role's steps and crop
                columns[feature.name] = role_values(marked, _filled(block, variable_of(marked)))
            elif of in stacks:
                axis = 1 if stacks[of].axis == 0 else -1
                columns[feature.name] = np.stack([_filled(block, name) for name in stacks[of].variables], axis=axis)
            else:
                columns[feature.name] = _filled(block, of)
    return columns


def sample_rows(spec: WriteSpec, columns: dict[str, np.ndarray]) -> np.ndarray:
    """The samples as raw fixed-size rows (for packing after the shard's sort)."""
    features = spec.features
    n = len(columns[features[0].name])
    rows = np.empty(n, dtype=row_dtype(features))
    for i, feature in enumerate(features):
        rows[f"f{i}"] = columns[feature.name]
    return rows


def bucket_block(spec: WriteSpec, encoder: ExampleEncoder, block: Block) -> list[tuple[int, list[bytes]]]:
    """Encode a block's samples and split them by shard: [(global shard number, bucket pieces)].

    The pieces of a bucket, joined, are its blob (see transforms.buckets.blobs); kept apart they can
    be written to a file without another copy of the records.
    """
    keys, shards = spec.keys_and_shards(block.samples[SAMPLE_ID].values, block.samples[SPLIT].values)
    columns = record_columns(spec, block)
    if spec.examples_per_record > 1:
        payloads = sample_rows(spec, columns)
    else:
        payloads = [(record,) for record in encoder.rows(columns).in_order()]
    order = np.argsort(shards, kind="stable")
    bounds = np.flatnonzero(np.diff(shards[order])) + 1
    buckets = []
    for chunk in np.split(order, bounds):
        if len(chunk):
            part = payloads[chunk] if isinstance(payloads, np.ndarray) else [payloads[i] for i in chunk]
            buckets.append((int(shards[chunk[0]]), bucket_pieces(keys[chunk], part)))
    return buckets


class _EncodeAndBucketFn(beam.DoFn):
    def __init__(self, spec: WriteSpec):
        self._spec = spec
        self._bytes = Metrics.counter(METRICS_NAMESPACE, BYTES_ENCODED)

    def setup(self):
        use_anonymous_credentials_for_emulator()
        self._encoder = ExampleEncoder(self._spec.features)

    def process(self, block: Block):
        buckets = bucket_block(self._spec, self._encoder, block)
        self._bytes.inc(sum(len(piece) for _, pieces in buckets for piece in pieces))
        if self._spec.spill_dir is not None:
            yield from spill_buckets(self._spec.spill_dir, block.unit, block.piece, buckets)
        else:
            for shard, pieces in buckets:
                path = bucket_path(self._spec.bucket_dir, shard, block.unit, block.piece)
                write_atomically(path, pieces)
                yield shard, path
        mark(self._spec.progress_dir, "unit", block.unit, block.piece, block.pieces, samples=block.num_samples)


@dataclasses.dataclass
class EncodeAndBucket(beam.PTransform):
    """Blocks -> (shard number, bucket): a bucket file's path, or where its bytes are in the block's spill object."""

    spec: WriteSpec

    def expand(self, blocks):
        return blocks | "Encode" >> beam.ParDo(_EncodeAndBucketFn(self.spec))
