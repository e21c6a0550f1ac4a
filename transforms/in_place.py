"""WriteInPlace: blocks -> their records written at their final offsets in the shard files.

The offsets come from the layout computed at planning (planning.layout). CommitShards then
checks that every shard received exactly the records and bytes laid out for it, and renames
the shards to their final names.
"""

from __future__ import annotations

import collections
import dataclasses
import os

import apache_beam as beam
import numpy as np
from apache_beam.metrics import Metrics

from planning.run.cancellation import writing
from planning.run.contracts import BYTES_WRITTEN, METRICS_NAMESPACE, RECORDS_WRITTEN, SAMPLE_ID, Block, ShardResult
from planning.run.progress import mark
from planning.specs import WriteSpec
from schemas.example_codec import ExampleEncoder
from schemas.shard_index import scan_index
from schemas.tfrecord import frame_parts
from transforms.encode import record_columns
from transforms.files import write_index


class _WriteInPlaceFn(beam.DoFn):
    def __init__(self, spec: WriteSpec):
        self._spec = spec
        self._bytes = Metrics.counter(METRICS_NAMESPACE, BYTES_WRITTEN)
        self._records = Metrics.counter(METRICS_NAMESPACE, RECORDS_WRITTEN)

    def setup(self):
        self._encoder = ExampleEncoder(self._spec.features)
        self._shard_of_id = self._spec.layout.shard_of_id()
        self._offset_of_id = self._spec.layout.offset_of_id()
        self._files: dict[int, int] = {}

    def _file(self, shard: int) -> int:
        if shard not in self._files:
            # Every writer creates the shard it first writes to, never truncating it: writes land
            # at disjoint offsets, the file sparse until all have.
            self._files[shard] = os.open(self._spec.temporary_shard_path(shard), os.O_WRONLY | os.O_CREAT, 0o666)
        return self._files[shard]

    def process(self, block: Block):
        ids = block.samples[SAMPLE_ID].values
        shards = np.asarray(self._shard_of_id[ids])
        offsets = np.asarray(self._offset_of_id[ids])
        if (shards < 0).any():
            raise RuntimeError("a block holds a sample the layout does not write; this is a bug, please report it")
        written: dict[int, list[int]] = collections.defaultdict(lambda: [0, 0])
        records = self._encoder.encode(record_columns(self._spec, block))
        with writing():  # a stopped build waits for this block's writes, then removes the run's files
            for shard, offset, record in zip(shards.tolist(), offsets.tolist(), records):
                parts = frame_parts(record)
                size = os.pwritev(self._file(shard), parts, offset)
                written[shard][0] += 1
                written[shard][1] += size
        total = sum(n for _, n in written.values())
        self._bytes.inc(total)
        self._records.inc(len(records))
        mark(self._spec.progress_dir, "unit", block.unit, block.piece, block.pieces, samples=len(records))
        yield dict(written)

    def teardown(self):
        for descriptor in getattr(self, "_files", {}).values():
            os.close(descriptor)


def _add_counts(parts) -> dict[int, list[int]]:
    total: dict[int, list[int]] = collections.defaultdict(lambda: [0, 0])
    for part in parts:
        for shard, (records, nbytes) in part.items():
            total[shard][0] += records
            total[shard][1] += nbytes
    return dict(total)


def commit_shards(written: dict[int, list[int]], spec: WriteSpec):
    """Check every shard got exactly its laid-out records and bytes, then give it its final name."""
    layout = spec.layout
    for shard, (records, nbytes) in enumerate(zip(layout.records, layout.bytes)):
        got = written.get(shard, [0, 0])
        if got != [records, nbytes]:
            raise RuntimeError(
                f"shard {shard}: {got[0]} records ({got[1]} bytes) written, {records} ({nbytes}) laid out; "
                "schema.json not written. This is a bug, please report it"
            )
        final = spec.shard_path(shard)
        with writing():  # not once a stopped build is removing the run's files
            if records == 0:  # no writer created it
                os.close(os.open(spec.temporary_shard_path(shard), os.O_WRONLY | os.O_CREAT, 0o666))
            index = write_index(final, _record_sizes(spec.temporary_shard_path(shard), records, nbytes))
            os.replace(spec.temporary_shard_path(shard), final)
        split, number = spec.split_of_shard(shard)
        mark(spec.progress_dir, "shard", shard, records=records, bytes=nbytes)
        yield ShardResult(split.name, number, os.path.basename(final), records, nbytes, records, index)


def _record_sizes(path: str, records: int, nbytes: int):
    """The framed sizes of a shard written in place, from its length headers (the writers wrote it in pieces)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return scan_index(lambda offset, size: os.pread(fd, size, offset), nbytes, records, path).sizes
    finally:
        os.close(fd)


@dataclasses.dataclass
class CommitInPlace(beam.PTransform):
    """What each block wrote ({shard: [records, bytes]}) -> one ShardResult per shard: WriteInPlace after its writes."""

    spec: WriteSpec

    def expand(self, written):
        return (
            written
            | "AddCounts" >> beam.CombineGlobally(_add_counts).without_defaults()
            | "CommitShards" >> beam.FlatMap(commit_shards, self.spec)
        )


@dataclasses.dataclass
class WriteInPlace(beam.PTransform):
    """Blocks -> records written in place -> one ShardResult per shard once all are written."""

    spec: WriteSpec

    def expand(self, blocks):
        return (
            blocks
            | "WriteRecords" >> beam.ParDo(_WriteInPlaceFn(self.spec))
            # Without defaults: a global combine's default value is a side input, which Beam's
            # DaskRunner evaluates by running every stage upstream of it again.
            | "AddCounts" >> beam.CombineGlobally(_add_counts).without_defaults()
            | "CommitShards" >> beam.FlatMap(commit_shards, self.spec)
        )
