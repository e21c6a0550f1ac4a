"""WriteUnitRuns: shard numbers -> each shard written whole from its run of units, in unit order (shuffle.mode: read).

One worker cuts a shard's units one after the other and streams their records of the shard's
split into the shard (``transforms.files.write_atomically``: a temporary file renamed, or one
object on gs://), its index made from the bytes on their way (no re-read): nothing is sorted,
spilled or sent through the runner's shuffle but the shard's result and its units' statistics,
each unit's summarised from the same block as a write-shuffled build's (planning.unit_runs says
which shard summarises a unit that several cut).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterable, Iterator

import apache_beam as beam
import numpy as np
from apache_beam.metrics import Metrics

from planning.positions import Positions
from planning.run.contracts import (
    BYTES_WRITTEN,
    METRICS_NAMESPACE,
    RECORDS_WRITTEN,
    SAMPLE_ID,
    SPLIT,
    Block,
    ShardResult,
)
from planning.run.progress import mark
from planning.run.run_files import RunFile
from planning.sampling import Unit, Units
from planning.specs import CutSpec, StatsSpec, WriteSpec
from planning.unit_runs import UnitRuns, run_units, split_ranks
from schemas.example_codec import ExampleEncoder
from schemas.shard_index import FrameSizes
from transforms.compat import use_anonymous_credentials_for_emulator
from transforms.cut import _CutUnitFn
from transforms.encode import record_columns
from transforms.files import write_atomically, write_index
from transforms.shards import Tally, capped
from transforms.stats import keyed_summary
from transforms.streamed import _part
from transforms.units import DEFAULT_RANGES, load_run_file

#: WriteUnitRuns' elements are (kind, value): a ShardResult, or a unit's keyed summary. (Not a ParDo's tagged outputs:
#: Beam's DaskRunner hands a tagged output's elements to the main output's consumers too.)
SHARD, SUMMARY = 0, 1


def run_records(
    spec: WriteSpec, encoder: ExampleEncoder, block: Block, split: int, ranks: Callable[[np.ndarray], np.ndarray] | None
) -> tuple[bytes, int]:
    """The block's framed records of split ``split`` (its label) the shard holds, in the block's order, joined, and
    how many. ``ranks``: each sample id's rank among its unit's samples of the split, where the shard holds a part
    of them (None: it holds them all)."""
    mine = block.samples[SPLIT].values == split
    if ranks is not None:
        mine &= ranks(block.samples[SAMPLE_ID].values)
    count = int(np.count_nonzero(mine))
    if not count:
        return b"", 0
    columns = record_columns(spec, block)
    if count < len(mine):
        columns = {name: values[mine] for name, values in columns.items()}
    return b"".join(encoder.rows(columns).in_order()), count


def write_unit_run(
    spec: WriteSpec,
    runs: UnitRuns,
    units: Units,
    shard: int,
    cut: Callable[[Unit], Iterable[Block]],
    summarize: Callable[[Block], object],
    positions: Callable[[], Positions],
) -> tuple[ShardResult, list]:
    """Write shard ``shard`` from its run of units; its result, and the summaries of the units it summarises.

    ``cut``: a unit's blocks (its pieces, in order); ``summarize``: a block's part of the statistics;
    ``positions``: the grid's positions (which samples are a unit's, of which split), once the cut has loaded them.
    """
    split_plan, number = spec.split_of_shard(shard)
    label = int(runs.split_of_shard[shard])
    path = spec.shard_path(shard)
    name = os.path.basename(path)
    encoder = ExampleEncoder(spec.features)
    tally, parts = Tally(), []

    def chunks() -> Iterator[bytes]:
        for part in run_units(runs, units, shard):
            ranks = None
            if not part.whole:  # the run starts or ends inside this unit: its samples ranked [first, stop) only

                def ranks(ids, part=part):
                    ranked = split_ranks(positions(), part.unit, label, ids)
                    return (ranked >= part.first) & (ranked < part.stop)

            for block in cut(part.unit):
                if part.owns:
                    parts.append(summarize(block))
                    mark(spec.progress_dir, "unit", block.unit, block.piece, block.pieces, samples=block.num_samples)
                if part.stop > part.first:
                    records, count = run_records(spec, encoder, block, label, ranks)
                    tally.records += count
                    del block
                    if records:
                        yield records

    frames = FrameSizes()
    size = write_atomically(path, capped(frames.passing(chunks()), tally, spec.max_shard_bytes, name))
    index = write_index(path, chunks=frames.index_chunks())
    if frames.records != tally.records:
        raise RuntimeError(f"shard {name}: {frames.records} records written, {tally.records} cut; please report it")
    return ShardResult(split_plan.name, number, name, tally.records, size, tally.records, index), parts


class _WriteUnitRunFn(beam.DoFn):
    def __init__(self, cut: CutSpec, write: WriteSpec, stats: StatsSpec, units: Units, units_file: RunFile | None):
        self._cut = _CutUnitFn(cut)
        self._write = write
        self._stats = stats
        self._units = units if units_file is None else None
        self._units_file = units_file
        self._records = Metrics.counter(METRICS_NAMESPACE, RECORDS_WRITTEN)
        self._bytes = Metrics.counter(METRICS_NAMESPACE, BYTES_WRITTEN)

    def setup(self):
        use_anonymous_credentials_for_emulator()
        self._cut.setup()
        spec = self._write
        self._runs = (
            spec.unit_runs if spec.unit_runs_file is None else load_run_file(spec.unit_runs_file, UnitRuns.from_bytes)
        )
        if self._units_file is not None:
            self._units = load_run_file(self._units_file, Units.from_bytes)

    def _summarize(self, block: Block):
        stats = self._stats
        return keyed_summary(block, stats.split_names, stats.per, stats.features, stats.over)

    def _positions(self) -> Positions:
        return self._cut.spec.positions

    def process(self, shard: int):
        result, parts = write_unit_run(
            self._write, self._runs, self._units, shard, self._cut.process, self._summarize, self._positions
        )
        self._records.inc(result.records)
        self._bytes.inc(result.bytes)
        mark(self._write.progress_dir, "shard", shard, records=result.examples, bytes=result.bytes)
        yield SHARD, result
        for part in parts:
            yield SUMMARY, part

    def teardown(self):
        self._cut.teardown()


def _shard_numbers(bounds: tuple[int, int]) -> Iterator[int]:
    yield from range(*bounds)


@dataclasses.dataclass
class WriteUnitRuns(beam.PTransform):
    """Nothing -> (SHARD, ShardResult) per shard and (SUMMARY, keyed summary) per unit (shard_results and
    unit_summaries take them apart).

    ``units``: the plan's (the graph holds them only without ``units_file``); ``ranges``: of shard numbers, as
    EnumerateUnits' of unit numbers.
    """

    cut: CutSpec
    write: WriteSpec
    stats: StatsSpec
    units: Units
    units_file: RunFile | None = None
    ranges: int = DEFAULT_RANGES

    def expand(self, pbegin):
        shards = self.write.num_shards
        slices = [(shards * i // self.ranges, shards * (i + 1) // self.ranges) for i in range(self.ranges)]
        units = self.units.hollow() if self.units_file is not None else self.units
        return (
            pbegin
            | "Ranges" >> beam.Create([s for s in slices if s[1] > s[0]], reshuffle=False)
            | "SpreadRanges" >> beam.Reshuffle()
            | "Shards" >> beam.FlatMap(_shard_numbers)
            # Each shard is a long task (its units cut one after the other): spread them one by one.
            | "SpreadShards" >> beam.Reshuffle()
            | "CutAndWriteRuns" >> beam.ParDo(_WriteUnitRunFn(self.cut, self.write, self.stats, units, self.units_file))
        )


def shard_results(parts):
    """WriteUnitRuns' output -> its ShardResults."""
    return parts | "ShardResults" >> beam.FlatMap(_part, SHARD)


def unit_summaries(parts):
    """WriteUnitRuns' output -> the keyed summaries of its units (transforms.stats.keyed_summary)."""
    return parts | "UnitSummaries" >> beam.FlatMap(_part, SUMMARY)
