"""The build plan, made on the driver: files in order, variables, sample grid, splits, units, schema, shards.

Everything here is checked before any worker starts, so bad input fails in seconds with a
message naming the file, variable or key, not hours later on a worker. The plan stays on the
driver: each stage gets a small spec compiled from it (planning.specs) holding only what it uses.
"""

from __future__ import annotations

import dataclasses
import io
from collections.abc import Mapping, Sequence

import numpy as np

from planning import sizing
from planning.aux_coords import coordinate_plans, other_coordinates, scalar_coordinates, with_static_coordinates
from planning.config.model import BuildConfig
from planning.derived import derived_plans, plan_preprocess, preprocess_inputs
from planning.describe import describe_build
from planning.features import (
    build_grid,
    record_features,
    select_variables,
    stack_plans,
    variable_plans,
)
from planning.formats.grib import is_grib_input
from planning.formats.hdf5_reads import chunk_shapes
from planning.formats.sources import SourceFile
from planning.formats.zarr_paths import is_icechunk, store_input
from planning.inputs.coords import format_value, irregular_steps, json_values, record_values
from planning.inputs.inventory import Inventory, check_variables_agree, take_inventory, unstated_calendar
from planning.inputs.time_decoding import TimeDecoding
from planning.positions import Positions, plan_time_features
from planning.preprocess import Preprocess
from planning.reads.selection import Selection
from planning.reads.source_index import SourceIndex
from planning.run.generations import Held, HeldFile, HeldRange, generation_entry, held_range
from planning.run.manifest import Manifest, build_manifest
from planning.run.names import new_run_id
from planning.run.variables import StackPlan, VariablePlan
from planning.sampling import Axis, SampleGrid, UnitCost, Units, chunk_breaks, piece_positions, plan_units
from planning.selected import SelectedDataset, select_dataset
from planning.splits import DEFAULT_SPLIT, SplitPlan, assign_splits
from planning.unit_runs import UnitRuns, plan_unit_runs
from schemas.errors import UserError
from schemas.npy_files import npz_arrays
from schemas.schema import Schema, default_split, shard_name
from schemas.shard_index import index_name

#: Memory one unit may take on a worker (source slab plus its samples, encoded records and
#: buckets): large enough to amortise opening files, small enough for any worker.
UNIT_BUDGET_BYTES = 64e6


@dataclasses.dataclass(frozen=True)
class BuildPlan:
    """Everything decided on the driver before any worker starts: what is cut, how, and where it goes.

    It holds facts compiled from the config, not the config: what the stages, the write strategy
    and the summary read is decided here, once.
    """

    sources: SourceIndex  # the files along the concat dim
    positions: Positions  # the sample grid, each position's split and coordinate values
    variables: tuple[VariablePlan, ...]
    stacks: tuple[StackPlan, ...]
    units: Units  # the work units: per-dim spans, never one object per unit
    splits: tuple[SplitPlan, ...]
    schema: Schema  # without shards yet: Finalize adds them
    run_id: str
    output: str  # the output directory (local path or URL)
    seed: int  # the shuffle's
    compression: str | None  # of the shards: None or "gzip"
    examples_per_record: int  # samples packed into one record
    in_place: bool  # config output.in_place: records may be written at their offsets (planning.write_strategy)
    allow_float32_overflow: bool  # float64 values beyond float32's range become +-inf instead of failing
    nan_policy: str  # samples holding NaN: "keep", "drop" or "fill"
    fill_value: float | None  # what NaN becomes with nan_policy "fill"
    missing_chunks: str  # config input.missing_chunks: an absent Zarr chunk is an error, or fill values
    stats_per: tuple[str, ...]  # kept dims statistics are kept per index of
    reference_split: str  # the split whose statistics normalise
    probes: tuple = ()  # the input files' probes, to keep for the next run (planning.inputs.probe_cache)
    #: where the sample grid's positions are in the source along selected dims (config ``select``)
    selection: Selection = dataclasses.field(default_factory=Selection)
    zarr_store: str | None = None  # the input is this Zarr store (one source covering the concat dim)
    zarr_snapshot: str | None = None  # the store is an Icechunk repository: the snapshot planned and read
    #: the input is GRIB files: the hypercube read of each (config input.grib.filter_by_keys, as sorted pairs)
    grib: tuple[tuple[str, str | int | float], ...] | None = None
    preprocess: Preprocess | None = None  # config input.preprocess: what workers apply to each slab
    #: the config's ``coords``, read and cut like variables into coord/<name> features (planning.aux_coords)
    coordinates: tuple[VariablePlan, ...] = ()
    #: input files whose times state no calendar: read as standard (CF's default), which the summary says
    unstated_calendar: tuple[str, ...] = ()
    #: positions per piece along each grid dim: units over the budget (a Zarr store's whole chunks) are cut in
    #: pieces of this size on their worker (planning.sampling.unit_pieces); empty: every unit is one piece
    pieces: tuple[int, ...] = ()
    #: bytes of the job graph the run submitted (pipelines.graph), once it is built, and its stages in a line
    job_graph_bytes: int | None = None
    job_graph_outline: str = ""
    #: the generation this run writes: 0 (a build) or an append's (its shards, and only the samples it adds)
    generation: int = 0
    #: generations.json's record of it (planning.run.generations): what the output holds once it is committed
    generation_record: dict = dataclasses.field(default_factory=dict)
    #: config stats.tendency: the pairs of steps whose differences are summarised, and the units reading them
    tendency: TendencyPlan | None = None
    #: config stats.over: field: the steps and cells each split's statistics count, and the units reading them
    field: FieldPlan | None = None
    #: config stats.over: what the statistics count ("samples": the records' values; "field": the source's)
    stats_over: str = "samples"
    #: config shuffle.mode: "write" (samples shuffled into the shards) or "read" (shards of consecutive units,
    #: ``unit_runs``; readers shuffle through the indexes)
    shuffle_mode: str = "write"
    unit_runs: UnitRuns | None = None

    @property
    def grid(self) -> SampleGrid:
        return self.positions.grid

    @property
    def concat_dim(self) -> str:
        return self.positions.concat_dim

    @property
    def num_samples(self) -> int:
        """Samples the build cuts (before any nan_policy: drop)."""
        return sum(s.num_samples for s in self.splits)

    @property
    def num_shards(self) -> int:
        return sum(s.num_shards for s in self.splits)

    def manifest(self) -> Manifest:
        """What this build may write into its output (the only files a later --overwrite deletes)."""
        compression = self.compression
        names = [
            shard_name(s.name, i, s.num_shards, compression, s.generation)
            for s in self.splits
            for i in range(s.num_shards)
        ]
        indexes = [] if compression else [index_name(name) for name in names]  # no index for a gzip shard
        return build_manifest(self.run_id, names + indexes)

    @property
    def shard_names(self) -> list[str]:
        """The files this run's shards take (with their indexes): a failed append removes these alone."""
        return sorted(self.manifest().files - build_manifest(self.run_id, []).files)


@dataclasses.dataclass(frozen=True, eq=False)
class TendencyPlan:
    """stats.tendency: which consecutive steps of the selected grid pair up, and the units that read them.

    Its grid has the concat dim as windows of 2 steps (a position is a pair, by its first step),
    ``stats.per`` dims kept whole and every other dim iterated, so a unit's box is every cell of
    its pairs, the step after its last included (a halo of one), and each (cell, pair) lies in one
    unit alone: the source's pairs, not the samples', whatever their windows and strides.
    """

    grid: SampleGrid
    units: Units
    #: per pair start t (along the concat dim): whether (t, t + 1) is summarised: both in the reference split,
    #: a regular step apart (no gap), and (an append) not both held by earlier generations
    pairs: np.ndarray
    #: per position along the split dim when it is not the concat dim (input.new_dim): whether it is in the
    #: reference split (None: every position)
    members: np.ndarray | None = None
    split_dim: str | None = None

    def pairs_to_bytes(self) -> bytes:
        """``pairs`` as an .npz file's bytes (a run file: the job graph leaves them out)."""
        buffer = io.BytesIO()
        np.savez(buffer, pairs=self.pairs)
        return buffer.getvalue()

    def with_pairs(self, data: bytes) -> TendencyPlan:
        """This plan with the ``pairs`` that ``pairs_to_bytes`` saved."""
        with npz_arrays(data) as arrays:
            pairs = arrays["pairs"]
        return dataclasses.replace(self, pairs=pairs)

    def unit_pairs(self, unit) -> tuple[int, int]:
        """[start, stop) of the pair starts ``unit`` owns."""
        dims = [a.dim for a in self.grid.grid_axes]
        return unit.ranges[dims.index(self.concat_dim)]

    @property
    def concat_dim(self) -> str:
        return next(a.dim for a in self.grid.axes if a.role == "window")


def source_pass_grid(grid: SampleGrid, concat_dim: str, per: Sequence[str], steps_per_position: int) -> SampleGrid:
    """The grid of a statistics pass over the source field rather than the samples: windows of
    ``steps_per_position`` steps along the concat dim, one step apart (1: each step; 2: each pair of steps),
    ``stats.per`` dims kept whole, every other dim iterated, so each cell lies in one unit alone."""
    axes = []
    for axis in grid.axes:
        if axis.dim == concat_dim:
            axes.append(Axis.window(concat_dim, axis.length, steps_per_position, 1))
        elif axis.dim in per:
            axes.append(Axis.keep(axis.dim, axis.length))
        else:
            axes.append(Axis.iterate(axis.dim, axis.length))
    return SampleGrid(tuple(axes))


def plan_tendency(
    config: BuildConfig,
    grid: SampleGrid,
    dataset: SelectedDataset,
    splits: list[SplitPlan],
    reference: str,
    plan_units_of,
    kept: HeldRange | None = None,
) -> TendencyPlan | None:
    """The tendency's pairs and units (None without stats.tendency); UserError where it has nothing to summarise.

    ``plan_units_of(grid, bytes_per_position, making)``: the units of a grid (as the build plans its own);
    ``kept``: an append's held steps (their pairs are in the earlier generations' statistics).
    """
    if not config.stats.tendency:
        return None
    concat_dim = config.input.concat_dim
    steps = grid.axis(concat_dim).length
    if steps < 2:
        raise UserError(
            f"stats.tendency: {concat_dim!r} holds {steps} step(s) after `select`, so there is no x(t+1) - x(t); "
            "remove stats.tendency, or select more steps"
        )
    chosen = next((s for s in splits if s.name == reference), None) or SplitPlan(DEFAULT_SPLIT, 0, steps)
    pairs = ~irregular_steps(*dataset.coordinate(concat_dim))
    starts = np.arange(steps - 1)
    members = None
    if config.split_dim == concat_dim:
        pairs &= (starts >= chosen.start) & (starts + 1 < chosen.stop)
    elif config.splits:
        members = np.zeros(grid.axis(config.split_dim).length, dtype=bool)
        members[chosen.start : chosen.stop] = True
    if kept is not None:  # (pairs within the held steps are in earlier generations' stats; those across its ends not)
        pairs &= ~((starts >= kept.start) & (starts + 1 < kept.stop))
    if not pairs.any() and kept is None:
        raise UserError(
            f"stats.tendency: split {reference!r} holds no two consecutive {concat_dim} steps a regular step apart, "
            "so there is no x(t+1) - x(t) to summarise; widen the split, or remove stats.tendency"
        )
    pair_grid = source_pass_grid(grid, concat_dim, config.stats.per, steps_per_position=2)
    # Per pair and cell: its float64 difference and what Moments makes of it.
    units = plan_units_of(pair_grid, 8, {concat_dim: pairs})
    return TendencyPlan(pair_grid, units, pairs, members, config.split_dim if members is not None else None)


@dataclasses.dataclass(frozen=True, eq=False)
class FieldPlan:
    """stats.over: field: every step and cell of each split's selected region, each once, and the units reading them.

    Its grid has the concat dim as windows of one step (a position is a step), ``stats.per`` dims
    kept whole and every other dim iterated, so each (cell, step) lies in one unit alone, whatever
    the samples' windows, strides, offsets and roles. It holds ranges, not arrays over the steps:
    the job graph carries it, the same few bytes for a month as for 85 years.
    """

    grid: SampleGrid
    units: Units
    #: per split, in label order: its positions [start, stop) along the split dim
    splits: tuple[tuple[int, int], ...]
    split_dim: str
    #: an append's steps [start, stop) along the concat dim held by earlier generations (counted there); None: none
    held: tuple[int, int] | None = None
    #: per grid dim, where its first unit starts: a variable without the dim is counted by the units starting there
    firsts: dict[str, int] = dataclasses.field(default_factory=dict)

    @property
    def concat_dim(self) -> str:
        return next(a.dim for a in self.grid.axes if a.role == "window")

    @property
    def counts_static(self) -> bool:
        """Whether variables without the concat dim are counted: by the first generation alone (they do not grow)."""
        return self.held is None

    def labels(self, start: int, stop: int) -> np.ndarray:
        """Per position in [start, stop) along the split dim: the index of the split holding it, -1 for none."""
        return _split_labels(self.splits, start, stop)

    def counted(self, start: int, stop: int) -> np.ndarray:
        """Per step in [start, stop) along the concat dim: whether this run counts it (not held)."""
        return _not_held(self.held, start, stop)


def _split_labels(splits: Sequence[tuple[int, int]], start: int, stop: int) -> np.ndarray:
    labels = np.full(stop - start, -1, dtype=np.int64)
    for index, (low, high) in enumerate(splits):
        labels[max(low, start) - start : max(min(high, stop), start) - start] = index
    return labels


def _not_held(held: tuple[int, int] | None, start: int, stop: int) -> np.ndarray:
    counted = np.ones(stop - start, dtype=bool)
    if held is not None:
        low, high = held
        counted[max(low, start) - start : max(min(high, stop), start) - start] = False
    return counted


def plan_field(
    config: BuildConfig, grid: SampleGrid, splits: list[SplitPlan], plan_units_of, kept: HeldRange | None = None
) -> FieldPlan | None:
    """stats.over: field's grid and units (None with the default, over the samples).

    ``plan_units_of(grid, bytes_per_position, making)``: the units of a grid (as the build plans its own);
    ``kept``: an append's held steps (counted in the earlier generations' statistics).
    """
    if config.stats.over != "field":
        return None
    concat_dim, split_dim = config.input.concat_dim, config.split_dim
    steps = grid.axis(concat_dim).length
    field_grid = source_pass_grid(grid, concat_dim, config.stats.per, steps_per_position=1)
    ranges = tuple((s.start, s.stop) for s in splits)
    held = None if kept is None else (kept.start, kept.stop)
    in_split = _split_labels(ranges, 0, grid.axis(split_dim).length) >= 0
    counted = _not_held(held, 0, steps)
    making = {concat_dim: counted & in_split} if split_dim == concat_dim else {concat_dim: counted, split_dim: in_split}
    # Per cell: its float64 copy, and what Moments makes of it.
    units = plan_units_of(field_grid, 8, making)
    firsts = {a.dim: int(spans[:, 0].min()) for a, spans in zip(field_grid.grid_axes, units.spans) if len(spans)}
    return FieldPlan(field_grid, units, ranges, split_dim, held, firsts)


def _check_stats_config(config: BuildConfig, splits: list[SplitPlan], appending: bool) -> None:
    for dim in config.stats.per:
        if dim not in config.sample.keep:
            raise UserError(
                f"stats.per: {dim!r} is not a kept dim (sample.keep: {config.sample.keep}); "
                "statistics per index need the whole dim in every sample"
            )
    names = [s.name for s in splits]
    if config.stats.reference_split is not None and config.stats.reference_split not in names:
        raise UserError(f"stats.reference_split: {config.stats.reference_split!r} is not a split ({', '.join(names)})")
    reference = next(s for s in splits if s.name == (config.stats.reference_split or default_split(names)))
    if reference.awaiting is not None and not appending:
        others = [s.name for s in splits if s.num_samples]
        raise UserError(
            f"stats.reference_split: {reference.name!r} holds no sample yet ({reference.awaiting}), and its "
            f"statistics normalise every split; set stats.reference_split to a split with data "
            f"({', '.join(others)}), or build once its steps are in the input"
        )


def _coordinates(grid: SampleGrid, dataset: SelectedDataset) -> dict[str, tuple[np.ndarray, dict]]:
    coords = {}
    for axis in grid.grid_axes:
        found = dataset.coordinate(axis.dim)
        converted = record_values(*found) if found is not None else None
        if converted is not None:
            coords[axis.dim] = converted
    return coords


def _named_variables(config: BuildConfig) -> frozenset[str] | None:
    """The variables (and coordinates) the config names for workers to read; None where it names none.

    Probes record byte layouts for these only (planning.reads.direct_reads): each costs a probe about 0.08 ms.
    """
    names = config.input.preprocess_inputs if config.input.preprocess else config.variables
    return None if names is None else frozenset([*names, *config.coords])


def _grib_filter(config: BuildConfig, store: str | None) -> tuple[tuple[str, str | int | float], ...] | None:
    """input.grib's filter_by_keys as sorted pairs where the input is GRIB files (None otherwise); GRIB with what
    only NetCDF files or a Zarr store have refused."""
    if not is_grib_input(config.input.paths, config.input.grib):
        return None
    if store is not None:
        raise UserError(f"input.grib: {store} is a Zarr store, not GRIB files; drop input.grib or list GRIB files")
    for key, what in (("preprocess", "derived variables"), ("new_dim", "a dim from the files' names")):
        if getattr(config.input, key):
            raise UserError(
                f"input.{key}: {what} are not available with GRIB input yet; convert the files to NetCDF or Zarr "
                "first (xr.open_dataset(path, engine='cfgrib').to_netcdf(...)), or drop input.{key}"
            )
    grib = config.input.grib
    return tuple(sorted((grib.filter_by_keys if grib else {}).items()))


def make_plan(
    config: BuildConfig,
    run_id: str | None = None,
    unit_budget_bytes: float = UNIT_BUDGET_BYTES,
    cached_probes: Mapping | None = None,
    held: Held | None = None,
) -> BuildPlan:
    """Inspect the input files and decide everything the workers will do.

    ``cached_probes``: the files' probes kept from an earlier run (planning.inputs.probe_cache).
    ``held``: what an output's committed generations hold (an append plans only the samples they do not).
    """
    decoding = TimeDecoding.of(config.input)
    tolerance = config.input.coord_tolerance
    store = store_input(config.input.paths)
    if store is not None and config.input.preprocess:
        raise UserError(
            f"input.preprocess: not available with a Zarr store yet ({store}); derive the variables "
            "in the store, or build from NetCDF files"
        )
    if store is not None and config.input.new_dim:
        raise UserError(
            f"input.new_dim: joins files by their names, but the input is one Zarr store ({store}); "
            "give the store the dim itself, or build from NetCDF files"
        )
    if config.input.icechunk is not None and (store is None or not is_icechunk(store)):
        raise UserError(
            f"input.icechunk: {config.input.paths[0]} is not an Icechunk repository (no refs/ and snapshots/ in "
            "it); list the repository's directory in input.paths, or drop input.icechunk"
        )
    grib = _grib_filter(config, store)
    if grib is not None:
        # Imported here: cfgrib (and ecCodes) load only for a GRIB build.
        from planning.inputs.grib_inventory import take_grib_inventory

        inventory = take_grib_inventory(config.input.paths, config.input.concat_dim, dict(grib), decoding, tolerance)
    elif store is not None:
        # Imported here: zarr (and numcodecs) load only for a store's build.
        from planning.inputs.zarr_inventory import take_store_inventory

        version = config.input.icechunk.version() if config.input.icechunk else None
        inventory = take_store_inventory(store, config.input.concat_dim, decoding, version)
    else:
        inventory = take_inventory(
            config.input.paths,
            config.input.concat_dim,
            cached_probes,
            decoding,
            tolerance,
            config.input.new_dim,
            _named_variables(config),
        )
    preprocess = None
    chosen = preprocess_inputs(config, inventory) if config.input.preprocess else select_variables(config, inventory)
    check_variables_agree(inventory, chosen, tolerance)
    # From here on, everything is counted on the selected grid; only the workers' reads map back.
    dataset = select_dataset(config, inventory, chosen)
    if config.input.preprocess:
        # The variables cut are the function's outputs: learnt by running it on a tiny slab.
        preprocess, chosen = plan_preprocess(config, inventory, dataset, chosen)
    grid = build_grid(config, chosen, dataset.sizes)
    coords = _coordinates(grid, dataset)
    if preprocess is None:
        variables = variable_plans(grid, chosen, inventory)
    else:
        variables = derived_plans(grid, chosen, preprocess)
    coordinates = coordinate_plans(config, inventory, grid, chosen)
    stacks = stack_plans(config, variables)
    time_features = plan_time_features(
        config.sample.time_features,
        grid,
        config.input.concat_dim,
        coords,
        dataset.coordinate,
        other_coordinates(inventory, dataset, config.coords),
    )
    extra = [c.feature for c in coordinates] + (time_features.features(grid) if time_features else [])
    features = record_features(grid, variables, stacks, coords, extra, config)
    if config.sample.roles:
        stacks = []  # (stacked within each role: the roles' features say how, planning.features.stack_roles)
    files = dataset.files_on_grid()
    record_bytes = sizing.record_bytes(tuple(features))
    record_bound = sizing.record_bytes_bound(tuple(features), config.output.examples_per_record)
    values = _JsonValues(dataset.concat_values)
    held_files = [HeldFile(f.path, f.start, f.stop, f.nbytes, f.version) for f in files]
    if held is not None and config.input.new_dim:
        raise UserError(
            f"input.new_dim: --append adds steps along {config.input.concat_dim} to one run, not to members "
            f"({config.input.new_dim}); rebuild with --overwrite"
        )
    known = cached_probes.keys() if cached_probes else ()  # (the last run's files: name one that changed since)
    kept = None
    if held is not None:
        kept = held_range(held, config.input.concat_dim, values, None if store else held_files, known)
    if kept is not None and kept.start:
        _check_backfill(config, grid, dataset, kept)
    generation = 0 if held is None else held.generation
    origin = 0 if kept is None else kept.origin
    splits, placed, drops = assign_splits(config, grid, dataset, files, record_bound, kept, generation)
    _check_stats_config(config, splits, held is not None)
    held = preprocess.held(tuple(a.dim for a in grid.axes)) if preprocess else ()
    making = placed.making(config.input.concat_dim)
    units, pieces = _plan_units(
        grid,
        [*chosen, *coordinates],
        inventory,
        files,
        record_bytes,
        unit_budget_bytes,
        making,
        held,
        dataset.selection,
    )
    reference = config.stats.reference_split or default_split([s.name for s in splits])

    def tendency_units(pair_grid: SampleGrid, position_bytes: int, can: dict) -> Units:
        units, _ = _plan_units(
            pair_grid, chosen, inventory, files, position_bytes, unit_budget_bytes, can, held, dataset.selection
        )
        return units

    tendency = plan_tendency(config, grid, dataset, splits, reference, tendency_units, kept)
    field = plan_field(config, grid, splits, tendency_units, kept)
    # What workers read: the function's inputs, or the variables, and the coordinates of config `coords`.
    sources = dataset.source_index([*(preprocess.inputs if preprocess else variables), *coordinates])
    schema = describe_build(
        config, grid, dataset, sources, features, splits, drops, scalar_coordinates(inventory), origin
    )
    schema = with_static_coordinates(
        schema, coordinates, dataset, None if grib is None else dict(grib), config.input.concat_dim
    )
    coord_values = {d: v for d, (v, _) in coords.items()}
    run_id = run_id or new_run_id()
    positions = Positions(
        grid,
        config.input.concat_dim,
        placed.labels,
        coord_values,
        placed.dim,
        placed.across_gap,
        False,
        time_features,
        origin,
    )
    unit_runs = None
    if config.shuffle.mode == "read":  # (each split's shards, as sizing counted them, made runs of its samples)
        unit_runs = plan_unit_runs(positions, units, [s.num_samples for s in splits], [s.num_shards for s in splits])
    return BuildPlan(
        sources=sources,
        positions=positions,
        variables=tuple(variables),
        stacks=tuple(stacks),
        units=units,
        pieces=pieces,
        splits=tuple(splits),
        schema=schema,
        run_id=run_id,
        output=config.output.path,
        seed=config.shuffle.seed,
        compression=config.output.compression,
        examples_per_record=config.output.examples_per_record,
        in_place=config.output.in_place,
        allow_float32_overflow=config.output.allow_float32_overflow,
        nan_policy=config.nan_policy,
        fill_value=config.fill_value,
        missing_chunks=config.input.missing_chunks,
        stats_per=tuple(config.stats.per),
        stats_over=config.stats.over,
        reference_split=reference,
        probes=inventory.probes,
        selection=dataset.selection,
        zarr_store=store,
        zarr_snapshot=None if inventory.zarr is None else inventory.zarr.snapshot,
        grib=grib,
        preprocess=preprocess,
        coordinates=tuple(coordinates),
        unstated_calendar=unstated_calendar(inventory, decoding),
        generation=generation,
        generation_record=generation_entry(
            generation, len(values), values[0], values[len(values) - 1], held_files, store is not None, origin
        )
        # An Icechunk repository's snapshot: what this generation read (an append reads a later one).
        | ({"icechunk_snapshot": inventory.zarr.snapshot} if inventory.zarr and inventory.zarr.snapshot else {}),
        tendency=tendency,
        field=field,
        shuffle_mode=config.shuffle.mode,
        unit_runs=unit_runs,
    )


def _check_backfill(config: BuildConfig, grid: SampleGrid, dataset: SelectedDataset, kept: HeldRange) -> None:
    """Steps added before the held ones must join them without a gap and keep the samples' stride."""
    dim = config.input.concat_dim
    values, attrs = dataset.coordinate(dim)
    if irregular_steps(values, attrs)[kept.start - 1]:  # (the typical step is the whole input's)
        raise UserError(
            f"input: its {dim} steps before the output's first ({format_value(values[kept.start])}) end at "
            f"{format_value(values[kept.start - 1])}, not one step before it; --append adds earlier steps only "
            "contiguous with the output's: add the missing files, or rebuild with --overwrite"
        )
    stride = grid.axis(dim).stride if dim in [a.dim for a in grid.grid_axes] else 1
    if kept.start % stride:
        raise UserError(
            f"input: {kept.start:,} {dim} steps come before the output's first, not a multiple of "
            f"sample.stride {stride} along {dim}, so the new samples would not fall on the held ones' grid; add "
            "or leave out files to make it one, or rebuild with --overwrite"
        )


class _JsonValues:
    """The concat coordinate's values as schema.json writes them, each made when asked for (a long archive has many)."""

    def __init__(self, values: np.ndarray):
        self._values = values

    def __len__(self) -> int:
        return len(self._values)

    def __getitem__(self, index: int):
        return json_values(self._values[index : index + 1])[0]


def _plan_units(
    grid: SampleGrid,
    variables,
    inventory: Inventory,
    files: list[SourceFile],
    record_bytes: int,
    budget_bytes: float,
    making: dict[str, np.ndarray],
    held: tuple = (),
    selection: Selection | None = None,
) -> tuple[Units, tuple[int, ...]]:
    """Units of the grid, and the positions per piece workers cut them in (none: each unit is one piece).

    ``files``: their ranges on the selected concat dim (units prefer to end where files do);
    ``making``: per dim, the positions that can make samples (units without any are left out);
    ``held``: more arrays a unit holds, as UnitCost counts them (input.preprocess's inputs);
    ``selection``: where the grid's positions are in the source (config ``select``).
    """
    concat_dim = inventory.concat_dim
    grid_dims = [a.dim for a in grid.grid_axes]
    # Samples are held about three times over: cut, encoded, and in buckets.
    cost = UnitCost(tuple((tuple(v.dims), np.dtype(v.dtype).itemsize) for v in variables) + held, 3 * record_bytes)
    if inventory.zarr is not None:
        # Units hold whole chunks, which may be over the budget: workers cut them in pieces that fit.
        chunked = _chunk_breaks(grid, variables, inventory.zarr.chunks, inventory.sizes, selection)
        units = plan_units(grid, cost, budget_bytes, concat_dim, chunked=chunked)
        return _making_samples(units, grid_dims, making), piece_positions(grid, cost, budget_bytes, concat_dim)
    # NetCDF-4 variables stored in chunks: units hold whole chunks along the other dims too (files along
    # the concat dim: units already end where files do), cut in pieces on workers where over the budget.
    chunks = {} if held else _netcdf4_chunks(inventory, variables)  # (input.preprocess: its slabs stay whole)
    chunked = _chunk_breaks(grid, variables, chunks, inventory.sizes, selection, skip=concat_dim) if chunks else {}
    pieces = piece_positions(grid, cost, budget_bytes, concat_dim) if chunked else ()
    if concat_dim not in grid_dims:
        units = plan_units(grid, cost, budget_bytes, chunked=chunked)
        return _making_samples(units, grid_dims, making), pieces
    stride = grid.axis(concat_dim).stride
    starts = [-(-f.start // stride) for f in files]  # the first position in each file
    if chunks and not (selection and concat_dim in selection.runs):
        chunked.update(_concat_chunk_breaks(grid, variables, chunks, concat_dim, files))
    units = plan_units(grid, cost, budget_bytes, concat_dim, starts, chunked=chunked)
    return _making_samples(units, grid_dims, making), pieces


def _netcdf4_chunks(inventory: Inventory, variables) -> dict[str, tuple[int, ...]]:
    """The chunk shapes of the variables the reference file (a NetCDF-4 file) stores in chunks; the other
    files are taken to be chunked alike (where they are not, units only read more than they would)."""
    path = inventory.reference.path  # (remote: its metadata fetched, a few blocks)
    names = [v.name for v in variables if getattr(v, "static_path", None) is None]
    return chunk_shapes(path, names)


def _chunk_breaks(
    grid: SampleGrid, variables, chunks: Mapping, sizes: Mapping[str, int], selection: Selection | None, skip: str = ""
) -> dict[str, list[int]]:
    """Per grid dim (but ``skip``), the positions where a chunk of every chunked variable read starts (``chunks``:
    their chunk shapes by name; a chunk is read whole: units hold whole chunks, so each chunk is fetched and
    decoded by one unit, halos aside)."""
    out, selection = {}, selection or Selection()
    for axis in grid.grid_axes:
        if axis.dim == skip:
            continue
        # Each position's first source index, through the selection.
        starts = selection.indices(axis.dim, sizes[axis.dim])[:: axis.stride][: axis.count]
        common = None
        for variable in variables:
            shape = chunks.get(variable.name)
            if shape is None or axis.dim not in variable.dims or len(shape) != len(variable.dims):
                continue
            found = set(chunk_breaks(starts, shape[variable.dims.index(axis.dim)]))
            common = found if common is None else common & found
        if common is not None:
            out[axis.dim] = sorted(common)
    return out


def _concat_chunk_breaks(
    grid: SampleGrid, variables, chunks: Mapping, concat_dim: str, files: list[SourceFile]
) -> dict[str, list[int]]:
    """Along the concat dim, the positions where a chunk of every chunked variable starts: each file's chunks
    count from its own first step (a chunk never spans files). Nothing where every chunk is one step long."""
    sizes = {
        shape[v.dims.index(concat_dim)]
        for v in variables
        if (shape := chunks.get(v.name)) is not None and concat_dim in v.dims and len(shape) == len(v.dims)
    }
    sizes = {size for size in sizes if size > 1}
    if not sizes:
        return {}
    axis = grid.axis(concat_dim)
    first = np.arange(axis.count, dtype=np.int64) * axis.stride  # each position's first index along the dim
    begins = np.array([f.start for f in files], dtype=np.int64)
    within = np.searchsorted(begins, first, side="right") - 1
    common = None
    for size in sizes:
        ids = np.column_stack([within, (first - begins[within]) // size])
        found = set((np.flatnonzero((ids[1:] != ids[:-1]).any(axis=1)) + 1).tolist())
        common = found if common is None else common & found
    return {concat_dim: sorted(common)}


def _making_samples(units: Units, grid_dims: list[str], making: dict[str, np.ndarray]) -> Units:
    """The units that make samples, numbered anew: each holds a position that can along every dim of ``making``.

    Whether a unit does depends on its span along each dim alone, so the spans are filtered, not the units.
    """
    for dim, can in making.items():
        which = grid_dims.index(dim)
        # Positions that can, counted up to each position: a span has some if the count grows.
        made = np.concatenate([[0], np.cumsum(can)])
        spans = units.spans[which]
        units = units.keep(which, made[spans[:, 1]] > made[spans[:, 0]])
    return units
