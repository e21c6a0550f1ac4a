"""The plan compiled into one small frozen spec per stage, holding only what that stage uses.

Specs are what the Beam stages are built from and what is pickled into their DoFns: the input
files travel only in the cut spec, the shard layout only in the write spec.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np

from planning.config.model import MAX_SHARD_BYTES
from planning.features import ROLE_KEY
from planning.keys import keys_and_shards
from planning.layout import ShardLayout
from planning.plan import BuildPlan, FieldPlan, TendencyPlan
from planning.positions import Positions
from planning.preprocess import Preprocess
from planning.reads.selection import Selection
from planning.reads.source_index import SourceIndex
from planning.run.names import join, run_dir, shard_path, temporary_path
from planning.run.run_files import RunFile
from planning.run.variables import StackPlan, VariablePlan
from planning.splits import SplitPlan
from planning.unit_runs import UnitRuns
from planning.write_strategy import WritePlan, WriteStrategy
from schemas.grid_file import split_grid
from schemas.schema import Feature, Schema

#: Bytes a shard writer may hold in its buffers, whatever the shard's size, record size or
#: packing (transforms.shards; the bucket-file and runner-shuffle strategies).
WRITER_BUDGET_BYTES = 64 * 2**20


@dataclasses.dataclass(frozen=True, eq=False)
class CutSpec:
    """CutSamples: where the input is, which positions make samples, and how values are stored."""

    #: the files along the concat dim: in the spec (small runs, tests) or saved in sources_file,
    #: which each worker process loads once (the job graph does not grow with the archive)
    sources: SourceIndex | None
    sources_file: RunFile | None
    #: hollow when positions_file is set: each worker process loads the arrays (coordinates,
    #: split labels) from there once, so the job graph does not grow with the grid
    positions: Positions
    variables: tuple[VariablePlan, ...]
    split_names: tuple[str, ...]
    nan_policy: str
    fill_value: float | None
    allow_float32_overflow: bool
    #: what the grid's positions are in the source along the selected dims (config ``select``)
    selection: Selection = dataclasses.field(default_factory=Selection)
    zarr_store: str | None = None  # the input is this Zarr store: units are read from it (planning.reads.zarr_reads)
    zarr_missing_chunks: str = "error"  # config input.missing_chunks: an absent chunk is an error, or fill values
    zarr_snapshot: str | None = None  # the store is an Icechunk repository: the snapshot read
    #: the input is GRIB files: the hypercube each is read at (planning.reads.grib_reads)
    grib: tuple[tuple[str, str | int | float], ...] | None = None
    #: config input.preprocess: read its inputs, apply it to the slab, cut its outputs (``variables``)
    preprocess: Preprocess | None = None
    #: the config's ``coords``: read with the variables, cut into coord/<name> (planning.aux_coords)
    coords: tuple[VariablePlan, ...] = ()
    #: positions per piece along each grid dim: a unit is cut in pieces of this size, a block each (empty: whole)
    pieces: tuple[int, ...] = ()
    positions_file: RunFile | None = None


@dataclasses.dataclass(frozen=True, eq=False)
class WriteSpec:
    """WriteShards: how records are encoded, shuffled into shards, and where they are written."""

    output: str
    run_id: str
    strategy: WriteStrategy
    features: tuple[Feature, ...]  # of one sample, in record order
    record_features: tuple[Feature, ...]  # of one record (with packing: a leading axis and the count)
    stacks: tuple[StackPlan, ...]
    splits: tuple[SplitPlan, ...]
    seed: int
    compression: str | None
    examples_per_record: int
    #: local runs: where bucket files and progress markers go (None: no progress markers)
    bucket_dir: str | None = None
    #: workers that share no filesystem: where each unit's spill object goes (transforms.buckets.spill)
    spill_dir: str | None = None
    progress_dir: str | None = None
    layout: ShardLayout | None = None  # IN_PLACE only
    #: UNIT_RUNS only: each shard's run of units, in the spec (small runs, tests) or in the run's file of them
    unit_runs: UnitRuns | None = None
    unit_runs_file: RunFile | None = None
    writer_budget_bytes: int = WRITER_BUDGET_BYTES
    #: a shard writer fails rather than write more (before compression); planning keeps shards below it
    max_shard_bytes: int = MAX_SHARD_BYTES

    @property
    def num_shards(self) -> int:
        return sum(s.num_shards for s in self.splits)

    def split_of_shard(self, shard: int) -> tuple[SplitPlan, int]:
        """The split a global shard number belongs to, and its number within the split."""
        for split in self.splits:
            if split.first_shard <= shard < split.first_shard + split.num_shards:
                return split, shard - split.first_shard
        raise IndexError(shard)

    def shard_path(self, shard: int) -> str:
        split, number = self.split_of_shard(shard)
        return shard_path(self.output, split.name, number, split.num_shards, self.compression, split.generation)

    def temporary_shard_path(self, shard: int) -> str:
        """Where shard ``shard`` is written in place before its count is checked."""
        return temporary_path(self.shard_path(shard), self.run_id)

    def keys_and_shards(self, sample_ids: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each sample's shuffle key and its shard (numbered across splits)."""
        return keys_and_shards(sample_ids, labels, self.seed, self.splits)


@dataclasses.dataclass(frozen=True)
class StatsSpec:
    """ComputeStats: the splits, in label order, the kept dims statistics are kept per index of, and the record's
    role features (sample.roles: which cells of a variable's samples the records store)."""

    split_names: tuple[str, ...]
    per: tuple[str, ...] = ()
    features: tuple[Feature, ...] = ()
    #: config stats.over: "field" leaves the values' moments to ComputeFieldStats (blocks give sample counts only)
    over: str = "samples"


@dataclasses.dataclass(frozen=True, eq=False)
class TendencySpec:
    """ComputeTendency: how the source is read (the cut spec's sources, selection, store, preprocess), which
    pairs of steps are summarised, for which split, per which kept dims."""

    cut: CutSpec
    plan: TendencyPlan
    split: str  # the reference split
    per: tuple[str, ...] = ()
    units_file: RunFile | None = None  # where workers load the plan's units from (None: the graph holds them)
    pairs_file: RunFile | None = None  # ... and its pairs (None: the graph holds them)

    def for_workers(self) -> TendencySpec:
        """What the summarising step carries in the job graph: the plan without what the run's files hold."""
        plan = self.plan
        if self.units_file is not None:
            plan = dataclasses.replace(plan, units=plan.units.hollow())
        if self.pairs_file is not None:
            plan = dataclasses.replace(plan, pairs=np.zeros(0, dtype=bool))
        return dataclasses.replace(self, plan=plan)


@dataclasses.dataclass(frozen=True, eq=False)
class FieldSpec:
    """ComputeFieldStats (stats.over: field): how the source is read (the cut spec's), which steps and cells each
    split counts, per which kept dims."""

    cut: CutSpec
    plan: FieldPlan
    split_names: tuple[str, ...]
    per: tuple[str, ...] = ()
    units_file: RunFile | None = None  # where workers load the plan's units from (None: the graph holds them)

    def for_workers(self) -> FieldSpec:
        """What the summarising step carries in the job graph: the plan without the units (enumerated apart)."""
        if self.units_file is None:
            return self
        return dataclasses.replace(self, plan=dataclasses.replace(self.plan, units=self.plan.units.hollow()))


@dataclasses.dataclass(frozen=True, eq=False)
class FinalizeSpec:
    """Finalize: what to check the written counts against, and what to write beside the shards."""

    output: str
    schema: Schema  # without shards
    splits: tuple[SplitPlan, ...]
    variables: tuple[VariablePlan, ...]
    stacks: tuple[StackPlan, ...]
    stats: StatsSpec
    reference_split: str  # whose statistics normalise
    compression: str | None
    run_id: str  # the output's manifest must still name it when the output is committed
    run_dir: str  # the run's directory beside the output (under _tmp): removed once the output is complete
    work_dir: str | None = None  # removed once the output is complete too
    fill_value: float | None = None  # nan_policy: fill's value: normalisation must know the filled points
    generation: int = 0  # the generation this run commits (above 0: an append, merged into the output's earlier ones)
    generation_record: dict = dataclasses.field(default_factory=dict)  # its record in generations.json, so far
    tendency: bool = False  # config stats.tendency: stats.json gains `tendency`
    over: str = "samples"  # config stats.over: what stats.json's statistics count
    concat_dim: str = ""
    #: the values of the grid's large entries (grid.npz, schemas.grid_file), saved for Finalize: ``schema``'s grid
    #: then refers to them (None: ``schema``'s grid holds every value, split off when it is written)
    grid_file: RunFile | None = None


#: The run's files for the workers (``run_files``), by name.
SOURCES, UNITS, POSITIONS = "sources", "units", "positions"
TENDENCY_UNITS, TENDENCY_PAIRS, FIELD_UNITS = "tendency_units", "tendency_pairs", "field_units"
GRID = "grid"
UNIT_RUNS = "unit_runs"


def run_files(plan: BuildPlan, directory: str) -> dict[str, tuple[RunFile, bytes]]:
    """What the job graph leaves out because it grows with the input, saved under ``directory`` for the workers.

    The input files' index, the work units, and the positions' arrays (coordinates, splits); the
    units of stats.tendency and stats.over: field, and the tendency's pairs; the grid's large coordinates (a
    curvilinear grid's 2-D lat, lon: grid.npz, which Finalize writes): the graph carries each file's URL and
    digest only, the same few bytes for a month as for 85 years, for 64 x 64 points as for 1799 x 1059.
    """
    contents = {
        SOURCES: plan.sources.to_bytes(),
        UNITS: plan.units.to_bytes(),
        POSITIONS: plan.positions.to_bytes(),
    }
    if plan.tendency is not None and len(plan.tendency.units):
        contents[TENDENCY_UNITS] = plan.tendency.units.to_bytes()
        contents[TENDENCY_PAIRS] = plan.tendency.pairs_to_bytes()
    if plan.field is not None and len(plan.field.units):
        contents[FIELD_UNITS] = plan.field.units.to_bytes()
    if plan.unit_runs is not None:
        contents[UNIT_RUNS] = plan.unit_runs.to_bytes()
    _, grid = split_grid(plan.schema)
    if grid is not None:
        contents[GRID] = grid  # (an .npz, as the others are)
    return {name: (RunFile.of(join(directory, f"{name}.npz"), data), data) for name, data in contents.items()}


def cut_spec(plan: BuildPlan, files: Mapping[str, RunFile] | None = None) -> CutSpec:
    """The cut stage's spec; with ``files`` (run_files), workers load the input index and positions from there."""
    files = files or {}
    return CutSpec(
        sources=None if SOURCES in files else plan.sources,
        sources_file=files.get(SOURCES),
        positions=plan.positions.hollow() if POSITIONS in files else plan.positions,
        positions_file=files.get(POSITIONS),
        variables=plan.variables,
        split_names=tuple(s.name for s in plan.splits),
        nan_policy=plan.nan_policy,
        fill_value=plan.fill_value,
        allow_float32_overflow=plan.allow_float32_overflow,
        selection=plan.selection,
        zarr_store=plan.zarr_store,
        zarr_missing_chunks=plan.missing_chunks,
        zarr_snapshot=plan.zarr_snapshot,
        grib=plan.grib,
        preprocess=plan.preprocess,
        coords=plan.coordinates,
        pieces=plan.pieces,
    )


def write_spec(plan: BuildPlan, write: WritePlan, files: Mapping[str, RunFile] | None = None) -> WriteSpec:
    runs_file = (files or {}).get(UNIT_RUNS)
    return WriteSpec(
        output=plan.output,
        run_id=plan.run_id,
        strategy=write.strategy,
        features=plan.schema.features,
        record_features=plan.schema.record_features(),
        stacks=plan.stacks,
        splits=plan.splits,
        seed=plan.seed,
        compression=plan.compression,
        examples_per_record=plan.examples_per_record,
        bucket_dir=write.bucket_dir,
        spill_dir=write.spill_dir,
        progress_dir=write.progress_dir,
        layout=write.layout,
        unit_runs=None if runs_file is not None else plan.unit_runs,
        unit_runs_file=runs_file,
    )


def stats_spec(plan: BuildPlan) -> StatsSpec:
    roles = tuple(f for f in plan.schema.features if ROLE_KEY in f.source)
    return StatsSpec(tuple(s.name for s in plan.splits), plan.stats_per, roles, plan.stats_over)


def field_spec(plan: BuildPlan, files: Mapping[str, RunFile] | None = None) -> FieldSpec | None:
    """ComputeFieldStats' spec (None unless stats.over: field, or when no unit holds a step to count)."""
    if plan.field is None or not len(plan.field.units):
        return None
    files = files or {}
    cut = dataclasses.replace(cut_spec(plan, files), positions_file=None)  # (positions: the samples', not read)
    return FieldSpec(cut, plan.field, tuple(s.name for s in plan.splits), plan.stats_per, files.get(FIELD_UNITS))


def tendency_spec(plan: BuildPlan, files: Mapping[str, RunFile] | None = None) -> TendencySpec | None:
    """ComputeTendency's spec (None without stats.tendency, or an append that adds no pair)."""
    if plan.tendency is None or not len(plan.tendency.units):
        return None
    files = files or {}
    cut = dataclasses.replace(cut_spec(plan, files), positions_file=None)  # (positions: the samples', not read)
    return TendencySpec(
        cut, plan.tendency, plan.reference_split, plan.stats_per, files.get(TENDENCY_UNITS), files.get(TENDENCY_PAIRS)
    )


def finalize_spec(
    plan: BuildPlan, work_dir: str | None = None, files: Mapping[str, RunFile] | None = None
) -> FinalizeSpec:
    """Finalize's spec; with ``files`` (run_files) holding the grid's large coordinates, its schema refers to them."""
    grid_file = (files or {}).get(GRID)
    schema = split_grid(plan.schema)[0] if grid_file is not None else plan.schema
    return FinalizeSpec(
        output=plan.output,
        schema=schema,
        splits=plan.splits,
        variables=plan.variables,
        stacks=plan.stacks,
        stats=stats_spec(plan),
        reference_split=plan.reference_split,
        compression=plan.compression,
        run_id=plan.run_id,
        run_dir=run_dir(plan.output, plan.run_id),
        work_dir=work_dir,
        fill_value=plan.fill_value,
        generation=plan.generation,
        generation_record=plan.generation_record,
        tendency=plan.tendency is not None,
        over=plan.stats_over,
        concat_dim=plan.concat_dim,
        grid_file=grid_file,
    )


@dataclasses.dataclass(frozen=True, eq=False)
class StageSpecs:
    cut: CutSpec
    write: WriteSpec
    stats: StatsSpec
    finalize: FinalizeSpec
    units_file: RunFile | None = None  # where workers load the units from (None: the graph holds them)
    tendency: TendencySpec | None = None  # config stats.tendency (None: off)
    field: FieldSpec | None = None  # config stats.over: field (None: the samples')


def compile_specs(plan: BuildPlan, write: WritePlan, files: Mapping[str, RunFile] | None = None) -> StageSpecs:
    """Every stage's spec. ``write``: how records are written (planning.write_strategy);
    ``files``: the run's files for the workers (run_files), which the graph then leaves out."""
    return StageSpecs(
        cut_spec(plan, files),
        write_spec(plan, write, files),
        stats_spec(plan),
        finalize_spec(plan, write.work_dir, files),
        (files or {}).get(UNITS),
        tendency_spec(plan, files),
        field_spec(plan, files),
    )
