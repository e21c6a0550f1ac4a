"""WriteInPlace: blocks -> their records written at their final offsets in the shard files.

The offsets come from the layout computed at planning (transforms.layout). CommitShards then
checks that every shard received exactly the records and bytes laid out for it, and renames
the shards to their final names.
"""

from __future__ import annotations

import collections
import os

import apache_beam as beam
import numpy as np
import xarray as xr
from apache_beam.metrics import Metrics

from schemas.example_codec import ExampleEncoder
from schemas.tfrecord import frame_parts
from transforms.cut import METRICS_NAMESPACE
from transforms.encode import record_columns
from transforms.layout import ShardLayout
from transforms.plan import BuildPlan
from transforms.progress import mark
from transforms.shards import ShardResult


class _WriteInPlaceFn(beam.DoFn):
    def __init__(self, plan: BuildPlan, layout: ShardLayout, progress_dir: str | None):
        self._plan = plan
        self._layout = layout
        self._progress_dir = progress_dir
        self._bytes = Metrics.counter(METRICS_NAMESPACE, "bytes_written")
        self._records = Metrics.counter(METRICS_NAMESPACE, "records_written")

    def setup(self):
        self._encoder = ExampleEncoder(self._plan.schema.features)
        self._shard_of_id = self._layout.shard_of_id()
        self._offset_of_id = self._layout.offset_of_id()
        self._files: dict[int, int] = {}

    def _file(self, shard: int) -> int:
        if shard not in self._files:
            self._files[shard] = os.open(self._layout.temporary_path(self._plan, shard), os.O_WRONLY)
        return self._files[shard]

    def process(self, block: xr.Dataset):
        ids = block["sample_id"].values
        shards = np.asarray(self._shard_of_id[ids])
        offsets = np.asarray(self._offset_of_id[ids])
        if (shards < 0).any():
            raise RuntimeError("a block holds a sample the layout does not write; this is a bug, please report it")
        written: dict[int, list[int]] = collections.defaultdict(lambda: [0, 0])
        records = self._encoder.encode(record_columns(self._plan, block))
        for shard, offset, record in zip(shards.tolist(), offsets.tolist(), records):
            parts = frame_parts(record)
            size = os.pwritev(self._file(shard), parts, offset)
            written[shard][0] += 1
            written[shard][1] += size
        total = sum(n for _, n in written.values())
        self._bytes.inc(total)
        self._records.inc(len(records))
        mark(self._progress_dir, "unit", block.attrs["unit"], samples=len(records))
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


def commit_shards(written: dict[int, list[int]], plan: BuildPlan, layout: ShardLayout, progress_dir: str | None):
    """Check every shard got exactly its laid-out records and bytes, then give it its final name."""
    for shard, (records, nbytes) in enumerate(zip(layout.records, layout.bytes)):
        got = written.get(shard, [0, 0])
        if got != [records, nbytes]:
            raise RuntimeError(
                f"shard {shard}: {got[0]} records ({got[1]} bytes) written, {records} ({nbytes}) laid out; "
                "schema.json not written. This is a bug, please report it"
            )
        temporary = layout.temporary_path(plan, shard)
        final = temporary.rsplit(".tmp-", 1)[0]
        os.replace(temporary, final)
        split, number = plan.split_of_shard(shard)
        mark(progress_dir, "shard", shard, records=records, bytes=nbytes)
        yield ShardResult(split.name, number, os.path.basename(final), records, nbytes, records)


class WriteInPlace(beam.PTransform):
    """Blocks -> records written in place -> one ShardResult per shard once all are written."""

    def __init__(self, plan: BuildPlan, layout: ShardLayout, progress_dir: str | None = None):
        super().__init__()
        self._plan = plan
        self._layout = layout
        self._progress_dir = progress_dir

    def expand(self, blocks):
        write = _WriteInPlaceFn(self._plan, self._layout, self._progress_dir)
        return (
            blocks
            | "WriteRecords" >> beam.ParDo(write)
            | "AddCounts" >> beam.CombineGlobally(_add_counts)
            | "CommitShards" >> beam.FlatMap(commit_shards, self._plan, self._layout, self._progress_dir)
        )
