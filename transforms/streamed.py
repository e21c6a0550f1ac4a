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
Finalize would be three global combines in a row; here each unit's statistics and counts ride
together through the merge tree's two GroupByKeys (transforms.stats.MergeBranches: a group's
parts, then a branch's groups), and one combine collects the branches (one a 65,536 units) and
the shard results, and one step commits the shards, merges the statistics in the order ComputeStats
merges them (the same bits) and writes the metadata. Beam's DaskRunner runs a global combine as
one GroupByKey and one task over its whole list: fed every unit's result, that task held them all
(O(units): 11.6 MB at 2,000 tiny units, 9.9x its peak at 200, benchmarks.merge_memory). Bucket
files and spill objects still meet their shard through one GroupByKey before it. Not for Beam's
multi-threaded local runner (its own graph: pipelines.graph).
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
from transforms.merging.probe import measured
from transforms.shards import WriteBucketedShards
from transforms.stats import MergeBranches, keyed_part, merge_by_name, summarize_block, summary_tree_of
from transforms.write import block_writer

_WRITTEN, _SUMMARY, _SHARD, _MERGED, _BRANCH = 0, 1, 2, 3, 4


class _CutWriteSummarizeFn(beam.DoFn):
    def __init__(self, cut: CutSpec, write: WriteSpec, stats: StatsSpec):
        self._cut = _CutUnitFn(cut)
        self._write = block_writer(write)
        self._in_place = write.strategy is WriteStrategy.IN_PLACE
        self._stats = stats

    def setup(self):
        self._cut.setup()
        self._write.setup()

    def process(self, unit: Unit):
        for block in self._cut.process(unit):
            counts = []  # written in place: {shard: [records, bytes]}, merged in the statistics' tree
            for written in self._write.process(block):
                if self._in_place:
                    counts.append(written)
                else:  # references to bucket files or spill objects, for their shard's writer
                    yield _WRITTEN, written
            stats = self._stats
            summary = summarize_block(block, stats.split_names, stats.per, stats.features, stats.over)
            yield _SUMMARY, keyed_part(block.unit, (summary, add_counts(counts)), block.piece, block.pieces)

    def teardown(self):
        self._write.teardown()
        self._cut.teardown()


def values_of_kind(element: tuple, which: int):
    """The value of a (kind, value) element if it is of kind ``which`` (a FlatMap's function): one output split by
    kinds, as Beam's DaskRunner hands a ParDo's tagged outputs to the main output's consumers too."""
    kind, value = element
    if kind == which:
        yield value


def _tagged(value, kind: int) -> tuple:
    return kind, value


def merge_with_counts(parts) -> tuple[dict, dict]:
    """(summary, counts) parts -> their summaries merged in the order given, and their counts added up."""
    parts = list(parts)
    return merge_by_name(summary for summary, _ in parts), add_counts(counts for _, counts in parts)


class _CollectFn(beam.CombineFn):
    """The branches of the units' merge tree ((statistics, counts written in place), one a UNITS_PER_GROUP x
    GROUPS_PER_BRANCH units), shard results as arrays and statistics merged elsewhere -> one element: no part a unit."""

    def create_accumulator(self):
        return ShardCounts(), summary_tree_of(0, merge_with_counts), {}

    @measured("Collect", method=True)
    def add_input(self, accumulator, element):
        results, tree, merged = accumulator
        kind, value = element
        if kind == _SHARD:
            results.add(value)
        elif kind == _MERGED:
            merged = merge_by_name([merged, value])
        else:
            tree.add_branch(*value)
        return results, tree, merged

    @measured("Collect", method=True)
    def add_inputs(self, accumulator, elements):
        for element in elements:
            accumulator = self.add_input(accumulator, element)
        return accumulator

    @measured("Collect", method=True)
    def merge_accumulators(self, accumulators):
        results, tree, merged = self.create_accumulator()
        for other_results, other_tree, other_merged in accumulators:
            results.absorb(other_results)
            tree.absorb(other_tree)
            merged = merge_by_name([merged, other_merged])
        return results, tree, merged

    @measured("Collect", method=True)
    def extract_output(self, accumulator):
        return accumulator


def _commit(collected: tuple, write: WriteSpec, finalize: FinalizeSpec) -> Schema:
    """Shards written in place committed, the statistics merged as ComputeStats merges them (the same tree of
    units, groups and branches: the same float additions), the metadata written."""
    use_anonymous_credentials_for_emulator()
    results, tree, merged = collected
    summaries, written = tree.result() if tree.folded else ({}, {})
    if write.strategy is WriteStrategy.IN_PLACE:
        results = ShardCounts.of(commit_shards(written, write))
    return finalize_output(finalize, results, merge_by_name([summaries, merged]))


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
        cut = units | "CutWriteSummarize" >> beam.ParDo(_CutWriteSummarizeFn(self.cut, self.write, self.stats))
        # Each unit's statistics and counts written in place, merged in the tree's groups and branches (every
        # GroupByKey's key a group or a branch: no task holds more than 256 of a kind, whatever the units).
        parts = (
            cut
            | "Summaries" >> beam.FlatMap(values_of_kind, _SUMMARY)
            | "MergeTree" >> MergeBranches(merge_with_counts)
            | "TagBranches" >> beam.Map(_tagged, _BRANCH)
        )
        if self.write.strategy is not WriteStrategy.IN_PLACE:
            shards = (
                cut
                | "Buckets" >> beam.FlatMap(values_of_kind, _WRITTEN)
                | "WriteShards" >> WriteBucketedShards(self.write)  # (its GroupByKey: a shard's bucket files)
                | "TagShards" >> beam.Map(_tagged, _SHARD)
            )
            parts = (shards, parts) | "Join" >> beam.Flatten()
        if merged:
            parts = (parts, merged[0] | "TagMerged" >> beam.Map(_tagged, _MERGED)) | "JoinMerged" >> beam.Flatten()
        return (
            parts
            # Without defaults: a global combine's default value is a side input, which Beam's
            # DaskRunner evaluates by running every stage upstream of it again.
            | "Collect" >> beam.CombineGlobally(_CollectFn()).without_defaults()
            | "Commit" >> beam.Map(_commit, self.write, self.finalize)
        )
