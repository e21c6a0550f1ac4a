"""StreamBlocks: cut each unit and hand its block at once to the writer and the statistics, then commit the build in
one combine (Beam's DaskRunner).

Beam's DaskRunner runs each stage over a whole partition and keeps its output as a list until
every next stage has read it, so CutSamples followed by WriteShards would hold every block of a
partition at once. Here one step cuts a unit, writes its records (in place or to bucket files)
and summarises it before the next unit is cut: what a partition keeps is a small result per
unit (counts, or references to bucket files or spill objects: on Dask, bucket bytes never ride the
runner's GroupByKey, which lists a key's values in memory; planning.write_strategy).

Every GroupByKey is a shuffle of every partition on Dask (a few dozen scheduler tasks, each a
round trip). Counting what was written in place, merging the statistics and collecting for
Finalize would be three in a row (four global combines in all); here they are one: every
unit's small result goes to one combine, and one step commits the shards, merges the
statistics in the order ComputeStats merges them (the same bits) and writes the metadata. Bucket
files and spill objects still meet their shard through one GroupByKey before it. Not for Beam's multi-threaded local
runner: the combine's accumulators carry every unit's summaries, megabytes at scale, which it garbled
through the combine's GroupByKey ("Invalid PaneInfoEncoding" in a 4x build; the cause, Beam's timed
flush, is turned off since: pipelines.runners).
"""

from __future__ import annotations

import dataclasses

import apache_beam as beam

from planning.run.shard_counts import ShardCounts
from planning.sampling import Unit
from planning.specs import CutSpec, FinalizeSpec, StatsSpec, WriteSpec
from planning.write_strategy import WriteStrategy
from schemas.schema import Schema
from transforms.compat import use_anonymous_credentials_for_emulator
from transforms.cut import _CutUnitFn
from transforms.finalize import finalize_output
from transforms.in_place import add_counts, commit_shards
from transforms.shards import WriteBucketedShards
from transforms.stats import keyed_summary, merge_by_name, summary_tree_of
from transforms.write import block_writer

_WRITTEN, _SUMMARY, _SHARD, _MERGED = 0, 1, 2, 3


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
            stats = self._stats
            yield _SUMMARY, keyed_summary(block, stats.split_names, stats.per, stats.features, stats.over)

    def teardown(self):
        self._write.teardown()
        self._cut.teardown()


def _part(element: tuple, which: int):
    kind, value = element
    if kind == which:
        yield value


def _tagged(value, kind: int) -> tuple:
    return kind, value


def _is_summary(element: tuple) -> bool:
    return element[0] == _SUMMARY


class _CollectFn(beam.CombineFn):
    """Every unit's result -> (shard -> [records, bytes] written in place, shard results as arrays, the units'
    summaries in their merge tree (transforms.merging.summary_tree: a few nodes, not a summary a unit), statistics
    merged elsewhere), as one element."""

    def __init__(self, units: int):
        self._units = units

    def create_accumulator(self):
        return {}, ShardCounts(), summary_tree_of(self._units), {}

    def add_input(self, accumulator, element):
        written, results, tree, merged = accumulator
        kind, value = element
        if kind == _WRITTEN:
            written = add_counts([written, value])
        elif kind == _SHARD:
            results.add(value)
        elif kind == _MERGED:
            merged = merge_by_name([merged, value])
        else:
            group, ((unit, piece, pieces), summary) = value
            tree.add_part(group, unit, piece, pieces, summary)
        return written, results, tree, merged

    def merge_accumulators(self, accumulators):
        written, results, tree, merged = self.create_accumulator()
        for other_written, other_results, other_tree, other_merged in accumulators:
            written = add_counts([written, other_written])
            results.absorb(other_results)
            tree.absorb(other_tree)
            merged = merge_by_name([merged, other_merged])
        return written, results, tree, merged

    def extract_output(self, accumulator):
        return accumulator


def _commit(collected: tuple, write: WriteSpec, finalize: FinalizeSpec) -> Schema:
    """Shards written in place committed, the statistics merged as ComputeStats merges them (the same tree of
    units, groups and branches: the same float additions), the metadata written."""
    use_anonymous_credentials_for_emulator()
    written, results, tree, merged = collected
    if write.strategy is WriteStrategy.IN_PLACE:
        results = ShardCounts.of(commit_shards(written, write))
    summaries = merge_by_name([tree.result(), merged])
    return finalize_output(finalize, results, summaries)


@dataclasses.dataclass
class StreamBlocks(beam.PTransform):
    """Units -> the committed schema (one element): CutSamples, WriteShards, ComputeStats and Finalize with no block
    kept beyond its unit, and one global combine."""

    cut: CutSpec
    write: WriteSpec
    stats: StatsSpec
    finalize: FinalizeSpec

    def expand(self, inputs):
        # Units, or (units, statistics merged elsewhere: {split: SplitSummary} elements, stats.tendency's).
        units, *merged = inputs if isinstance(inputs, tuple) else (inputs,)
        parts = units | "CutWriteSummarize" >> beam.ParDo(_CutWriteSummarizeFn(self.cut, self.write, self.stats))
        if self.write.strategy is not WriteStrategy.IN_PLACE:
            shards = (
                parts
                | "Buckets" >> beam.FlatMap(_part, _WRITTEN)
                | "WriteShards" >> WriteBucketedShards(self.write)  # (its GroupByKey: a shard's bucket files)
                | "TagShards" >> beam.Map(_tagged, _SHARD)
            )
            summaries = parts | "Summaries" >> beam.Filter(_is_summary)
            parts = (shards, summaries) | "Join" >> beam.Flatten()
        if merged:
            parts = (parts, merged[0] | "TagMerged" >> beam.Map(_tagged, _MERGED)) | "JoinMerged" >> beam.Flatten()
        return (
            parts
            # Without defaults: a global combine's default value is a side input, which Beam's
            # DaskRunner evaluates by running every stage upstream of it again.
            | "Collect" >> beam.CombineGlobally(_CollectFn(self.stats.units)).without_defaults()
            | "Commit" >> beam.Map(_commit, self.write, self.finalize)
        )
