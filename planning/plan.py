"""The build plan, made on the driver: files in order, variables, sample grid, splits, units, schema, shards.

Everything here is checked before any worker starts, so bad input fails in seconds with a
message naming the file, variable or key, not hours later on a worker. The plan stays on the
driver: each stage gets a small spec compiled from it (planning.specs) holding only what it uses.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Mapping

import numpy as np

from planning.aux_coords import coordinate_plans, scalar_coordinates
from planning.config import MAX_SHARD_BYTES, MAX_SHARD_MB, BuildConfig
from planning.derived import derived_plans, plan_preprocess, preprocess_inputs
from planning.describe import describe_build
from planning.features import (
    build_grid,
    record_features,
    select_variables,
    stack_plans,
    variable_plans,
)
from planning.formats.sources import SourceFile
from planning.formats.zarr_store import store_input
from planning.inputs.coords import record_values
from planning.inputs.inventory import Inventory, check_variables_agree, take_inventory, unstated_calendar
from planning.inputs.time_decoding import TimeDecoding
from planning.inputs.zarr_inventory import take_store_inventory
from planning.positions import Positions
from planning.preprocess import Preprocess
from planning.reads.selection import Selection
from planning.reads.source_index import SourceIndex
from planning.run.manifest import Manifest, build_manifest
from planning.run.names import new_run_id
from planning.run.variables import StackPlan, VariablePlan
from planning.sampling import SampleGrid, UnitCost, Units, plan_units
from planning.selected import SelectedDataset, select_dataset
from planning.splits import SplitPlan, gap_positions, position_labels, split_ranges
from schemas.errors import UserError
from schemas.example_codec import ExampleEncoder
from schemas.schema import Feature, Schema, shard_name
from schemas.tfrecord import FOOTER_BYTES, HEADER_BYTES

logger = logging.getLogger(__name__)

#: Shards receive uneven numbers of samples (each sample's key picks its shard): planning keeps
#: this many standard deviations above the mean within MAX_SHARD_MB.
_SHARD_SIGMAS = 6

#: Memory one unit may take on a worker (source slab plus its samples, encoded records and
#: buckets): large enough to amortise opening files, small enough for any worker.
UNIT_BUDGET_BYTES = 64e6


@dataclasses.dataclass(frozen=True)
class BuildPlan:
    """Everything decided on the driver before any worker starts: what is cut, how, and where it goes."""

    config: BuildConfig
    sources: SourceIndex  # the files along the concat dim
    positions: Positions  # the sample grid, each position's split and coordinate values
    variables: tuple[VariablePlan, ...]
    stacks: tuple[StackPlan, ...]
    units: Units  # the work units: per-dim spans, never one object per unit
    splits: tuple[SplitPlan, ...]
    schema: Schema  # without shards yet: Finalize adds them
    run_id: str
    probes: tuple = ()  # the input files' probes, to keep for the next run (planning.inputs.probe_cache)
    #: where the sample grid's positions are in the source along selected dims (config ``select``)
    selection: Selection = dataclasses.field(default_factory=Selection)
    zarr_store: str | None = None  # the input is this Zarr store (one source covering the concat dim)
    preprocess: Preprocess | None = None  # config input.preprocess: what workers apply to each slab
    #: the config's ``coords``, read and cut like variables into coord/<name> features (planning.aux_coords)
    coordinates: tuple[VariablePlan, ...] = ()
    #: input files whose times state no calendar: read as standard (CF's default), which the summary says
    unstated_calendar: tuple[str, ...] = ()
    #: bytes of the job graph the run submitted (pipelines.graph), once it is built
    job_graph_bytes: int | None = None

    @property
    def grid(self) -> SampleGrid:
        return self.positions.grid

    @property
    def concat_dim(self) -> str:
        return self.positions.concat_dim

    @property
    def output(self) -> str:
        return self.config.output.path

    @property
    def seed(self) -> int:
        return self.config.shuffle.seed

    @property
    def num_samples(self) -> int:
        """Samples the build cuts (before any nan_policy: drop)."""
        return sum(s.num_samples for s in self.splits)

    @property
    def num_shards(self) -> int:
        return sum(s.num_shards for s in self.splits)

    def manifest(self) -> Manifest:
        """What this build may write into its output (the only files a later --overwrite deletes)."""
        compression = self.config.output.compression
        names = [shard_name(s.name, i, s.num_shards, compression) for s in self.splits for i in range(s.num_shards)]
        return build_manifest(self.run_id, names)


def _record_bytes(features: tuple[Feature, ...]) -> int:
    """A typical sample's record size (int64 values at 5 bytes, masks at 1): what a unit holds per sample."""
    payload = sum(4 * f.size if f.dtype == "float32" else (1 if f.role == "mask" else 5) * f.size for f in features)
    headers = sum(len(f.name) + 12 for f in features)
    return payload + headers + 16


def _record_bytes_bound(features: tuple[Feature, ...], per_record: int) -> int:
    """The most bytes one framed record (of ``per_record`` samples) can take.

    Exact for float32 features and every header; int64 values at a varint's longest, 10 bytes.
    """
    record = Schema(features, examples_per_record=per_record).record_features()
    return ExampleEncoder(record).max_record_length() + HEADER_BYTES + FOOTER_BYTES


def _num_shards(config: BuildConfig, samples: int, record_bound: int) -> int:
    """The configured shard count, or enough for target_shard_mb; never enough samples for a shard over MAX_SHARD_MB."""
    per_record = config.output.examples_per_record
    records_per_shard = MAX_SHARD_BYTES // record_bound
    if records_per_shard < 1:
        what = "a sample's record" if per_record == 1 else f"a record of {per_record} samples"
        fix = "cut smaller samples or fewer variables" if per_record == 1 else "lower output.examples_per_record"
        raise UserError(
            f"output: {what} may take {record_bound / 1e6:,.0f} MB, more than a shard may hold "
            f"({MAX_SHARD_MB} MB); {fix}"
        )
    # A shard of c samples holds ceil(c / per_record) records, so up to `fits` samples fit in one.
    fits = per_record * records_per_shard
    # A sample's key picks its shard, so a shard's count is binomial about the mean, with a
    # standard deviation under sqrt(mean): keep mean + _SHARD_SIGMAS deviations within `fits`.
    most = ((math.sqrt(_SHARD_SIGMAS**2 + 4 * fits) - _SHARD_SIGMAS) / 2) ** 2
    needed = math.ceil(samples / most)
    total_bytes = samples / per_record * record_bound
    wanted = config.output.num_shards or math.ceil(total_bytes / (config.output.target_shard_mb * 1e6))
    if wanted < needed:
        logger.warning(
            "output.num_shards: %d shards could hold up to about %.0f MB each; writing %d instead (at most %d MB each)",
            wanted,
            total_bytes / wanted / 1e6,
            needed,
            MAX_SHARD_MB,
        )
    return max(1, min(max(wanted, needed), samples))


def _check_stats_config(config: BuildConfig, splits: list[SplitPlan]) -> None:
    for dim in config.stats.per:
        if dim not in config.sample.keep:
            raise UserError(
                f"stats.per: {dim!r} is not a kept dim (sample.keep: {config.sample.keep}); "
                "statistics per index need the whole dim in every sample"
            )
    names = [s.name for s in splits]
    if config.stats.reference_split is not None and config.stats.reference_split not in names:
        raise UserError(f"stats.reference_split: {config.stats.reference_split!r} is not a split ({', '.join(names)})")


def _coordinates(grid: SampleGrid, dataset: SelectedDataset) -> dict[str, tuple[np.ndarray, dict]]:
    coords = {}
    for axis in grid.grid_axes:
        found = dataset.coordinate(axis.dim)
        converted = record_values(*found) if found is not None else None
        if converted is not None:
            coords[axis.dim] = converted
    return coords


@dataclasses.dataclass(frozen=True)
class _SplitPositions:
    """Which grid positions make samples of which split, as Positions needs it and units are filtered by."""

    dim: str  # the split dim
    labels: np.ndarray | None  # per position along it: its split, or -1; None: every position, the one split
    across_gap: np.ndarray | None  # per position along the concat dim, when the splits run along another dim

    def making(self, concat_dim: str) -> dict[str, np.ndarray]:
        """Per dim, the positions along it that can make samples (a unit without one along any makes none)."""
        out = {} if self.labels is None else {self.dim: self.labels >= 0}
        if self.across_gap is not None:
            out[concat_dim] = ~self.across_gap
        return out


def _assign_splits(
    config: BuildConfig, grid: SampleGrid, dataset: SelectedDataset, files: list[SourceFile], record_bound: int
) -> tuple[list[SplitPlan], _SplitPositions, dict[str, int]]:
    """Splits with their sample and shard counts, which positions make samples of each, and the drop counts.

    ``files``: their ranges on the selected concat dim, where gaps are found.
    """
    concat_dim, split_dim = config.input.concat_dim, config.split_dim
    splits = split_ranges(config, *dataset.coordinate(split_dim))
    grid_dims = [a.dim for a in grid.grid_axes]
    if split_dim not in grid_dims and config.splits:
        raise UserError(f"splits: {split_dim!r} is kept whole in every sample, so it cannot be split")
    across_gap = None
    if concat_dim in grid_dims:
        across_gap = gap_positions(config, grid.axis(concat_dim), dataset.concat_values, files)
    gap_drops = 0 if across_gap is None else int(across_gap.sum()) * (grid.num_samples // grid.axis(concat_dim).count)
    if split_dim not in grid_dims:
        labels, counts = None, [grid.num_samples - gap_drops]
    else:
        labels = position_labels(grid.axis(split_dim), splits)
        per_position = grid.num_samples // grid.axis(split_dim).count
        if split_dim == concat_dim:
            labels[across_gap] = -1
            across_gap = None  # in the labels now
        elif across_gap is not None:
            # Per split-dim position, the samples at positions along the concat dim that cross no gap.
            per_position = per_position // grid.axis(concat_dim).count * int((~across_gap).sum())
        counts = [int((labels == i).sum()) * per_position for i in range(len(splits))]
    drops = {
        "grid_positions": grid.num_samples,
        "samples_dropped_at_gaps": gap_drops,
        "samples_outside_splits": grid.num_samples - gap_drops - sum(counts),
    }
    if sum(counts) == 0:
        reason = "crosses a gap in the data" if gap_drops else "lies outside every split"
        raise UserError(f"input: every sample along {split_dim} {reason}; there is nothing to write")
    planned, first = [], 0
    for split, count in zip(splits, counts):
        if count == 0:
            raise UserError(f"splits.{split.name}: no whole sample fits in its range; widen it")
        shards = _num_shards(config, count, record_bound)
        planned.append(dataclasses.replace(split, num_samples=count, num_shards=shards, first_shard=first))
        first += shards
    if labels is not None and not config.splits and (labels == 0).all():
        labels = None  # every position makes samples of the one split: nothing to look up
    if across_gap is not None and not across_gap.any():
        across_gap = None
    return planned, _SplitPositions(split_dim, labels, across_gap), drops


def _named_variables(config: BuildConfig) -> frozenset[str] | None:
    """The variables (and coordinates) the config names for workers to read; None where it names none.

    Probes record byte layouts for these only (planning.reads.direct_reads): each costs a probe about 0.08 ms.
    """
    names = config.input.preprocess_inputs if config.input.preprocess else config.variables
    return None if names is None else frozenset([*names, *config.coords])


def make_plan(
    config: BuildConfig,
    run_id: str | None = None,
    unit_budget_bytes: float = UNIT_BUDGET_BYTES,
    cached_probes: Mapping | None = None,
) -> BuildPlan:
    """Inspect the input files and decide everything the workers will do.

    ``cached_probes``: the files' probes kept from an earlier run (planning.inputs.probe_cache).
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
    if store is not None:
        inventory = take_store_inventory(store, config.input.concat_dim, decoding)
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
    features = record_features(grid, variables, stacks, coords, [c.feature for c in coordinates], config)
    files = dataset.files_on_grid()
    record_bytes = _record_bytes(tuple(features))
    record_bound = _record_bytes_bound(tuple(features), config.output.examples_per_record)
    splits, placed, drops = _assign_splits(config, grid, dataset, files, record_bound)
    _check_stats_config(config, splits)
    held = preprocess.held(tuple(a.dim for a in grid.axes)) if preprocess else ()
    making = placed.making(config.input.concat_dim)
    units = _plan_units(grid, [*chosen, *coordinates], inventory, files, record_bytes, unit_budget_bytes, making, held)
    # What workers read: the function's inputs, or the variables, and the coordinates of config `coords`.
    sources = dataset.source_index([*(preprocess.inputs if preprocess else variables), *coordinates])
    schema = describe_build(config, grid, dataset, sources, features, splits, drops, scalar_coordinates(inventory))
    coord_values = {d: v for d, (v, _) in coords.items()}
    positions = Positions(grid, config.input.concat_dim, placed.labels, coord_values, placed.dim, placed.across_gap)
    return BuildPlan(
        config=config,
        sources=sources,
        positions=positions,
        variables=tuple(variables),
        stacks=tuple(stacks),
        units=units,
        splits=tuple(splits),
        schema=schema,
        run_id=run_id or new_run_id(),
        probes=inventory.probes,
        selection=dataset.selection,
        zarr_store=store,
        preprocess=preprocess,
        coordinates=tuple(coordinates),
        unstated_calendar=unstated_calendar(inventory, decoding),
    )


def _plan_units(
    grid: SampleGrid,
    variables,
    inventory: Inventory,
    files: list[SourceFile],
    record_bytes: int,
    budget_bytes: float,
    making: dict[str, np.ndarray],
    held: tuple = (),
) -> Units:
    """Units of the grid; ``files``: their ranges on the selected concat dim (units prefer to end where files do).

    ``making``: per dim, the positions that can make samples (units without any are left out);
    ``held``: more arrays a unit holds, as UnitCost counts them (input.preprocess's inputs).
    """
    concat_dim = inventory.concat_dim
    grid_dims = [a.dim for a in grid.grid_axes]
    # Samples are held about three times over: cut, encoded, and in buckets.
    cost = UnitCost(tuple((tuple(v.dims), np.dtype(v.dtype).itemsize) for v in variables) + held, 3 * record_bytes)
    if concat_dim not in grid_dims:
        return _making_samples(plan_units(grid, cost, budget_bytes), grid_dims, making)
    stride = grid.axis(concat_dim).stride
    least = 1
    if inventory.zarr is not None:
        # A store is read by whole chunks: units start where chunks start and hold at least one
        # (narrowed along the other dims instead), so no chunk is fetched for a sliver of it.
        chunk = inventory.zarr.concat_chunk(((v.name, v.dims) for v in variables), concat_dim)
        starts = [-(-s // stride) for s in range(0, grid.axis(concat_dim).length, chunk)]
        least = max(1, chunk // stride)
    else:
        starts = [-(-f.start // stride) for f in files]  # the first position in each file
    return _making_samples(plan_units(grid, cost, budget_bytes, concat_dim, starts, least), grid_dims, making)


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
