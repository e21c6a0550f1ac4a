"""WriteInPlace: blocks -> their records written at their final offsets in the shard files.

The offsets come from the layout computed at planning (planning.layout). CommitShards then
checks that every shard received exactly the records and bytes laid out for it, and renames
the shards to their final names.
"""

from __future__ import annotations

import collections
import dataclasses
import errno
import os
import shutil

import apache_beam as beam
import numpy as np
from apache_beam.metrics import Metrics

from planning.run.cancellation import writing
from planning.run.contracts import BYTES_WRITTEN, METRICS_NAMESPACE, RECORDS_WRITTEN, SAMPLE_ID, Block, ShardResult
from planning.run.disk import WRITEBACK, reserve_space
from planning.run.progress import mark
from planning.specs import WriteSpec
from schemas.errors import UserError
from schemas.example_codec import ExampleEncoder
from transforms.encode import record_columns
from transforms.files import write_index


class _WriteInPlaceFn(beam.DoFn):
    def __init__(self, spec: WriteSpec):
        self._spec = spec
        self._bytes = Metrics.counter(METRICS_NAMESPACE, BYTES_WRITTEN)
        self._records = Metrics.counter(METRICS_NAMESPACE, RECORDS_WRITTEN)

    def setup(self):
        layout = self._spec.layout
        self._encoder = ExampleEncoder(self._spec.features)
        self._shard_of_id = layout.shard_of_id()
        self._offset_of_id = layout.offset_of_id()
        self._record_ends = layout.record_ends()
        self._shard_starts = np.concatenate([[0], np.cumsum(layout.bytes, dtype=np.int64)[:-1]])
        self._files: dict[int, int] = {}
        self._paths = [self._spec.temporary_shard_path(shard) for shard in range(len(layout.bytes))]

    def _file(self, shard: int) -> int:
        if shard not in self._files:
            # Every writer creates the shard it first writes to, never truncating it: writes land
            # at disjoint offsets, the file sparse until all have.
            self._files[shard] = os.open(self._paths[shard], os.O_WRONLY | os.O_CREAT, 0o666)
        return self._files[shard]

    def process(self, block: Block):
        ids = block.samples[SAMPLE_ID].values
        shards = np.asarray(self._shard_of_id[ids])
        offsets = np.asarray(self._offset_of_id[ids])
        if (shards < 0).any():
            raise RuntimeError("a block holds a sample the layout does not write; this is a bug, please report it")
        records = self._encoder.rows(record_columns(self._spec, block))
        framed = records.sizes()
        self._check_sizes(shards, offsets, framed)
        wrote = 0
        with writing():  # a stopped build waits for this block's writes, then removes the run's files
            for rows, samples in zip(records.arrays, records.samples):
                for row, shard, offset in zip(rows, shards[samples].tolist(), offsets[samples].tolist()):
                    wrote += os.pwrite(self._file(shard), row, offset)
        if wrote != int(framed.sum()):
            raise OSError(f"short write: {wrote} of {int(framed.sum())} bytes of unit {block.unit} written")
        counts = np.bincount(shards, minlength=len(self._shard_starts))
        nbytes = np.bincount(shards, weights=framed, minlength=len(self._shard_starts)).astype(np.int64)
        written = {int(s): [int(counts[s]), int(nbytes[s])] for s in np.flatnonzero(counts)}
        for shard, (_, size) in written.items():
            WRITEBACK.wrote(self._paths[shard], size)
        self._bytes.inc(wrote)
        self._records.inc(len(ids))
        mark(self._spec.progress_dir, "unit", block.unit, block.piece, block.pieces, samples=len(ids))
        yield written

    def _check_sizes(self, shards: np.ndarray, offsets: np.ndarray, framed: np.ndarray) -> None:
        """Every record as long as laid out: then the layout's sizes are the shards' indexes (no re-read)."""
        starts = self._shard_starts[shards] + offsets
        ends = self._record_ends
        which = np.minimum(np.searchsorted(ends, starts, side="right"), len(ends) - 1)
        wrong = np.flatnonzero(ends[which] - starts != framed)
        if len(wrong):
            i = int(wrong[0])
            raise RuntimeError(
                f"a record of shard {shards[i]} at byte {offsets[i]} is {framed[i]} bytes framed, laid out as "
                f"{int(ends[which[i]] - starts[i])}; this is a bug, please report it"
            )

    def teardown(self):
        for descriptor in getattr(self, "_files", {}).values():
            os.close(descriptor)


def check_disk_space(spec: WriteSpec) -> None:
    """Refuse, in one line and before any unit runs, an output its disk has no room for: the layout knows its size."""
    folder = os.path.dirname(os.path.abspath(spec.temporary_shard_path(0)))
    needed, free = sum(spec.layout.bytes), shutil.disk_usage(folder).free  # (free: what a user may still write)
    if needed > free:
        raise _no_room(folder, needed, free)


def reserve_shards(spec: WriteSpec) -> None:
    """Each shard's temporary file made its laid-out size, its blocks allocated, before any unit runs (where the
    filesystem can: planning.run.disk); a disk that filled since check_disk_space is refused as it refuses it."""
    with writing():  # not once a stopped build is removing the run's files
        for shard, nbytes in enumerate(spec.layout.bytes):
            path = spec.temporary_shard_path(shard)
            try:
                if nbytes and not reserve_space(path, nbytes):
                    return  # this filesystem cannot: the writers fill sparse files, as before
            except OSError as error:
                if error.errno != errno.ENOSPC:
                    raise
                folder = os.path.dirname(os.path.abspath(path))
                raise _no_room(folder, sum(spec.layout.bytes), shutil.disk_usage(folder).free) from None


def _no_room(folder: str, needed: int, free: int) -> UserError:
    return UserError(
        f"{folder}: the shards need {_size(needed)} and the disk has {_size(free)} free; "
        "free some space, or write the output elsewhere (--output)"
    )


def _size(nbytes: int) -> str:
    return f"{nbytes / 1e9:.2f} GB" if nbytes >= 1e9 else f"{nbytes / 1e6:.1f} MB"


def add_counts(parts) -> dict[int, list[int]]:
    """Per shard, the [records, bytes] of every part ({shard: [records, bytes]}) added up."""
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
            index = write_index(final, _record_sizes(spec, shard))
            os.replace(spec.temporary_shard_path(shard), final)
        split, number = spec.split_of_shard(shard)
        mark(spec.progress_dir, "shard", shard, records=records, bytes=nbytes)
        yield ShardResult(split.name, number, os.path.basename(final), records, nbytes, records, index)


def _record_sizes(spec: WriteSpec, shard: int) -> np.ndarray:
    """The framed sizes of a shard's records, as laid out (every writer checked its records' sizes against them)."""
    return spec.layout.shard_sizes(shard)


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
            | "AddCounts" >> beam.CombineGlobally(add_counts).without_defaults()
            | "CommitShards" >> beam.FlatMap(commit_shards, self.spec)
        )
