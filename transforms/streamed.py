"""StreamBlocks: cut each unit and hand its block at once to the writer and the statistics (Beam's DaskRunner).

Beam's DaskRunner runs each stage over a whole partition and keeps its output as a list until
every next stage has read it, so CutSamples followed by WriteShards would hold every block of a
partition at once. Here one step cuts a unit, writes its records (in place or to bucket files)
and summarises it before the next unit is cut: what a partition keeps is a small result per
unit (counts, or a bucket file's path: on Dask, bucket bytes never ride the runner's
GroupByKey, which lists a key's values in memory; planning.write_strategy).
"""

from __future__ import annotations

import dataclasses

import apache_beam as beam

from planning.sampling import Unit
from planning.specs import CutSpec, StatsSpec, WriteSpec
from transforms.cut import _CutUnitFn
from transforms.stats import MergeSummaries, keyed_summary
from transforms.write import after_block_writer, block_writer

_WRITTEN, _SUMMARY = 0, 1


class _CutWriteSummarizeFn(beam.DoFn):
    def __init__(self, cut: CutSpec, write: WriteSpec, stats: StatsSpec):
        self._cut = _CutUnitFn(cut)
        self._write = block_writer(write)
        self._stats = stats

    def setup(self):
        self._cut.setup()
        self._write.setup()

    def process(self, unit: Unit):
        for block in self._cut.process(unit):
            for written in self._write.process(block):
                yield _WRITTEN, written
            yield _SUMMARY, keyed_summary(block, self._stats.split_names, self._stats.per)

    def teardown(self):
        self._write.teardown()
        self._cut.teardown()


def _part(element: tuple, which: int):
    kind, value = element
    if kind == which:
        yield value


@dataclasses.dataclass
class StreamBlocks(beam.PTransform):
    """Units -> (one ShardResult per shard written, one merged statistics dict): CutSamples, WriteShards and
    ComputeStats with no block kept beyond its unit."""

    cut: CutSpec
    write: WriteSpec
    stats: StatsSpec

    def expand(self, units):
        parts = units | "CutWriteSummarize" >> beam.ParDo(_CutWriteSummarizeFn(self.cut, self.write, self.stats))
        shards = parts | "Written" >> beam.FlatMap(_part, _WRITTEN) | "WriteShards" >> after_block_writer(self.write)
        summaries = parts | "Summaries" >> beam.FlatMap(_part, _SUMMARY) | "ComputeStats" >> MergeSummaries()
        return shards, summaries
