"""The build plan, made on the driver: files in order, variables, sample grid, units, schema, shards.

Everything here is checked before any worker starts, so bad input fails in seconds with a
message naming the file, variable or key, not hours later on a worker. The plan is plain data
(picklable, no open files) and travels to the workers inside the DoFns that need it.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import uuid
from importlib import metadata
from typing import Any

import numpy as np

from schemas.errors import UserError
from schemas.schema import Feature, Schema
from transforms.config import MAX_SHARD_MB, BuildConfig
from transforms.sampling import Axis, SampleGrid, Unit, plan_units
from transforms.sources import FileInfo, SourceFile, VariableInfo, expand_paths, inspect_file

logger = logging.getLogger(__name__)

#: Memory one unit may take on a worker (source slab plus its samples, encoded records and
#: buckets): large enough to amortise opening files, small enough for any worker.
UNIT_BUDGET_BYTES = 256e6
_TIME_UNITS = "seconds since 1970-01-01T00:00:00Z"


def package_version() -> str:
    try:
        return metadata.version("xarray-tfrecords")
    except metadata.PackageNotFoundError:
        return "unknown"


@dataclasses.dataclass(frozen=True)
class VariablePlan:
    """A selected data variable: its dims in the files and the feature it becomes."""

    name: str
    dims: tuple[str, ...]
    dtype: str  # after CF decoding, as read
    feature: Feature


@dataclasses.dataclass(frozen=True)
class BuildPlan:
    """Everything the workers need to cut, encode and write, decided once on the driver."""

    config: BuildConfig
    files: tuple[SourceFile, ...]
    concat_dim: str
    grid: SampleGrid
    variables: tuple[VariablePlan, ...]
    #: record-ready coordinate values (int64 or float32) along each grid dim that has them
    coords: dict[str, np.ndarray]
    units: tuple[Unit, ...]
    num_shards: int
    schema: Schema
    run_id: str
    #: per position along the concat dim, False where the sample would cross a gap (input.gaps: skip)
    valid_positions: np.ndarray | None = None

    @property
    def output(self) -> str:
        return self.config.output.path

    @property
    def seed(self) -> int:
        return self.config.shuffle.seed

    @property
    def num_samples(self) -> int:
        """Samples the build writes: every grid position, less those dropped at gaps."""
        return self.grid.num_samples - self.schema.counts.get("samples_dropped_at_gaps", 0)

    @property
    def record_bytes(self) -> int:
        """Approximate size of one framed record."""
        return _record_bytes(self.schema.features)


def _record_bytes(features: tuple[Feature, ...]) -> int:
    payload = sum(4 * f.size if f.dtype == "float32" else 5 * f.size for f in features)
    headers = sum(len(f.name) + 12 for f in features)
    return payload + headers + 16


def inspect_files(paths: list[str]) -> list[FileInfo]:
    """Metadata of every file, one after another: the netCDF and HDF5 C libraries are not thread-safe."""
    return [inspect_file(path) for path in paths]


def _order_files(infos: list[FileInfo], concat_dim: str) -> tuple[list[FileInfo], np.ndarray]:
    """Files in concat-coordinate order, and the virtual dataset's concat coordinate."""
    for info in infos:
        if concat_dim not in info.sizes:
            dims = ", ".join(info.sizes) or "none"
            raise UserError(
                f"{info.path}: has no dim {concat_dim!r} (its dims: {dims}); "
                "set input.concat_dim to the dim the files are split along"
            )
    if any(concat_dim not in info.coords for info in infos):
        if len(infos) > 1:
            missing = next(i.path for i in infos if concat_dim not in i.coords)
            raise UserError(
                f"{missing}: dim {concat_dim!r} has no coordinate variable, so the files cannot be put in order; "
                "add the coordinate or pass a single file"
            )
        return infos, np.arange(infos[0].sizes[concat_dim])
    for info in infos:
        values = info.coords[concat_dim]
        if len(values) > 1 and not np.all(values[1:] > values[:-1]):
            raise UserError(f"{info.path}: {concat_dim!r} is not strictly increasing inside the file")
    ordered = sorted(infos, key=lambda i: (i.coords[concat_dim][0] if len(i.coords[concat_dim]) else 0, i.path))
    ordered = [i for i in ordered if i.sizes[concat_dim] > 0]
    if not ordered:
        raise UserError(f"input: every file has an empty {concat_dim!r} dim; there is nothing to sample")
    for before, after in zip(ordered, ordered[1:]):
        if after.coords[concat_dim][0] <= before.coords[concat_dim][-1]:
            raise UserError(
                f"{after.path}: its {concat_dim} range overlaps {before.path} "
                f"(starts at {_format_coord(after.coords[concat_dim][0])}, "
                f"the other ends at {_format_coord(before.coords[concat_dim][-1])}); "
                "the same steps twice would duplicate samples: remove one of the files"
            )
    return ordered, np.concatenate([i.coords[concat_dim] for i in ordered])


def _is_numeric(dtype: str) -> bool:
    kind = np.dtype(dtype).kind
    return kind in "fiub"


def _select_variables(config: BuildConfig, reference: FileInfo, mentioned: set[str]) -> list[VariableInfo]:
    all_dims = {d for v in reference.variables.values() for d in v.dims} | set(reference.sizes)
    sample = config.sample
    for key, dims in (("window", sample.window), ("offsets", sample.offsets), ("keep", sample.keep)):
        for dim in dims:
            if dim not in all_dims:
                raise UserError(
                    f"sample.{key}.{dim}: no variable in {reference.path} has a dim {dim!r} "
                    f"(dims: {', '.join(sorted(all_dims))}); fix the dim name"
                )
    if config.variables is None:
        chosen = [v for v in reference.variables.values() if mentioned <= set(v.dims) and _is_numeric(v.dtype)]
        if not chosen:
            raise UserError(
                f"{reference.path}: no numeric data variable has all the sample dims ({', '.join(sorted(mentioned))}); "
                "list the variables under `variables:` or change the sample dims"
            )
    else:
        chosen = []
        for name in config.variables:
            if name not in reference.variables:
                have = ", ".join(reference.variables) or "none"
                raise UserError(f"variables: {name!r} is not a data variable of {reference.path} (it has: {have})")
            var = reference.variables[name]
            if not _is_numeric(var.dtype):
                raise UserError(
                    f"variables: {name!r} in {reference.path} has dtype {var.dtype}, which a tf.Example cannot hold "
                    "as numbers; remove it from `variables:`"
                )
            lacking = mentioned - set(var.dims)
            if lacking:
                raise UserError(
                    f"variables: {name!r} has dims ({', '.join(var.dims)}) and lacks sample dim(s) "
                    f"{', '.join(sorted(lacking))}; remove it or change the sample dims"
                )
            chosen.append(var)
    dim_sets = {frozenset(v.dims) for v in chosen}
    if len(dim_sets) > 1:
        described = "; ".join(f"{v.name} ({', '.join(v.dims)})" for v in chosen)
        raise UserError(
            f"variables have different dims: {described}; list under `variables:` ones that share their dims"
        )
    return chosen


def _check_files_agree(ordered: list[FileInfo], variables: list[VariableInfo], concat_dim: str) -> None:
    reference = ordered[0]
    for info in ordered[1:]:
        for var in variables:
            other = info.variables.get(var.name)
            if other is None:
                raise UserError(f"{info.path}: variable {var.name!r} is missing; every input file needs it")
            if other.dims != var.dims or other.dtype != var.dtype:
                raise UserError(
                    f"{info.path}: variable {var.name!r} is {other.dtype} ({', '.join(other.dims)}) but "
                    f"{var.dtype} ({', '.join(var.dims)}) in {reference.path}; all files must agree"
                )
        for dim in variables[0].dims:
            if dim == concat_dim:
                continue
            if info.sizes.get(dim) != reference.sizes.get(dim):
                raise UserError(
                    f"{info.path}: dim {dim!r} has size {info.sizes.get(dim)} but {reference.sizes.get(dim)} in "
                    f"{reference.path}; the files' grids must match"
                )
            if dim in reference.coords and not np.array_equal(info.coords.get(dim), reference.coords[dim]):
                raise UserError(
                    f"{info.path}: {dim!r} coordinate values differ from {reference.path}; "
                    "the files' grids must match (regrid them first)"
                )


def coord_record_values(values: np.ndarray, attrs: dict[str, Any]) -> tuple[np.ndarray, dict[str, Any]] | None:
    """Coordinate values as a record can hold them, and how to read them back; None if it cannot.

    Times become int64 seconds since 1970 (any calendar, the calendar recorded); integers
    int64; floats float32.
    """
    kind = values.dtype.kind
    if kind == "M":
        seconds = values.astype("datetime64[s]").astype(np.int64)
        return seconds, {"units": _TIME_UNITS, "calendar": "proleptic_gregorian"}
    if kind == "O" and len(values) and hasattr(values[0], "calendar"):
        import cftime

        calendar = values[0].calendar
        seconds = np.asarray(cftime.date2num(list(values), _TIME_UNITS.replace("Z", ""), calendar=calendar))
        return np.round(seconds).astype(np.int64), {"units": _TIME_UNITS, "calendar": calendar}
    if kind in "iub":
        return values.astype(np.int64), {k: attrs[k] for k in ("units",) if k in attrs}
    if kind == "f":
        return values.astype(np.float32), {k: attrs[k] for k in ("units",) if k in attrs}
    return None


def _json_values(values: np.ndarray) -> list:
    if values.dtype.kind == "M":
        return [str(v) for v in values.astype("datetime64[s]")]
    if values.dtype.kind == "O":
        return [str(v) for v in values]
    return values.tolist()


def _steps_in_seconds_or_units(values: np.ndarray) -> np.ndarray | None:
    if values.dtype.kind == "f":
        return values.astype(np.float64)
    converted = coord_record_values(values, {})
    return None if converted is None else converted[0].astype(np.float64)


def irregular_steps(values: np.ndarray) -> np.ndarray:
    """Per consecutive pair of concat steps, True where the step is not the typical one.

    Typical = the median step; a step over 1.5x (a gap) or under 0.5x of it is irregular.
    The tolerance lets calendar months (28 to 31 days) count as regular.
    """
    numeric = _steps_in_seconds_or_units(values)
    if numeric is None or len(numeric) < 2:
        return np.zeros(max(len(values) - 1, 0), dtype=bool)
    diffs = np.diff(numeric)
    typical = np.median(diffs)
    return (diffs > 1.5 * typical) | (diffs < 0.5 * typical)


def _format_coord(value) -> str:
    if isinstance(value, np.datetime64):
        return str(value.astype("datetime64[s]"))
    return str(value)


def _check_gaps(
    config: BuildConfig, grid: SampleGrid, concat_values: np.ndarray, files: list[SourceFile]
) -> np.ndarray | None:
    """Valid positions along the concat dim (None if all are); an error for a gap unless gaps: skip."""
    concat_dim = config.input.concat_dim
    axis = grid.axis(concat_dim)
    if axis.role not in ("window", "offsets") or axis.span < 2:
        return None
    irregular = irregular_steps(concat_values)
    if not irregular.any():
        return None
    crossings = np.concatenate(([0], np.cumsum(irregular)))
    starts = np.arange(axis.count) * axis.stride
    valid = crossings[starts + axis.span - 1] - crossings[starts] == 0
    if valid.all():
        return None
    if config.input.gaps == "error":
        step = int(np.flatnonzero(irregular)[0])
        before = next(f for f in files if f.start <= step < f.stop)
        after = next(f for f in files if f.start <= step + 1 < f.stop)
        where = f"inside {before.path}" if before is after else f"between {before.path} and {after.path}"
        raise UserError(
            f"input: {concat_dim} is not regular {where}: {_format_coord(concat_values[step])} is followed by "
            f"{_format_coord(concat_values[step + 1])}, so {int((~valid).sum())} sample(s) would join steps that are "
            "not consecutive; add the missing data, or set input.gaps: skip to drop those samples"
        )
    if not valid.any():
        raise UserError(f"input: every sample along {concat_dim} crosses a gap in the data; there is nothing to write")
    return valid


def _build_axes(config: BuildConfig, reference: VariableInfo, sizes: dict[str, int]) -> SampleGrid:
    sample = config.sample
    axes = []
    for dim in reference.dims:
        length = sizes[dim]
        if dim in sample.window:
            window = sample.window[dim]
            if window.size > length:
                raise UserError(
                    f"sample.window.{dim}.size: {window.size} is larger than dim {dim!r} ({length}); "
                    f"use at most {length}"
                )
            axes.append(Axis.window(dim, length, window.size, window.step))
        elif dim in sample.offsets:
            steps = sample.offsets[dim]
            if max(steps) - min(steps) + 1 > length:
                raise UserError(
                    f"sample.offsets.{dim}: {steps} spans {max(steps) - min(steps) + 1} steps "
                    f"but dim {dim!r} has {length}"
                )
            axes.append(Axis.offsets(dim, length, steps))
        elif dim in sample.keep:
            axes.append(Axis.keep(dim, length))
        else:
            axes.append(Axis.iterate(dim, length))
    return SampleGrid(tuple(axes))


def _features(
    grid: SampleGrid, variables: list[VariableInfo], coords: dict[str, tuple[np.ndarray, dict]]
) -> tuple[list[VariablePlan], list[Feature]]:
    plans = []
    for var in variables:
        shape, dims = grid.feature_shape(var.dims)
        dtype = "float32" if np.dtype(var.dtype).kind == "f" else "int64"
        source = {"variable": var.name, "dtype": var.dtype, "file_dtype": var.source_dtype, "attrs": var.attrs}
        if dtype == "float32" and np.dtype(var.dtype).itemsize > 4:
            source["stored_as"] = "float32 (tf.Example holds no float64)"
        feature = Feature(var.name, dtype, shape, dims, "variable", source)
        plans.append(VariablePlan(var.name, var.dims, var.dtype, feature))
    features = [p.feature for p in plans]
    for axis in grid.grid_axes:
        features.append(Feature(f"index/{axis.dim}", "int64", (), (), "index", {"dim": axis.dim}))
    for axis in grid.grid_axes:
        if axis.dim not in coords:
            continue
        values, info = coords[axis.dim]
        dtype = "int64" if values.dtype == np.int64 else "float32"
        shape, dims = ((), ()) if axis.role == "iterate" else ((len(axis.steps),), (axis.dim,))
        features.append(Feature(f"coord/{axis.dim}", dtype, shape, dims, "coord", {"dim": axis.dim, **info}))
    names = [f.name for f in features]
    clash = {n for n in names if names.count(n) > 1}
    if clash:
        raise UserError(f"variables: feature name(s) {sorted(clash)} clash with position features; rename the variable")
    return plans, features


def _num_shards(config: BuildConfig, total_bytes: float, records: int) -> int:
    """The configured shard count, or enough for target_shard_mb; never shards over MAX_SHARD_MB."""
    needed = math.ceil(total_bytes / (MAX_SHARD_MB * 1e6))
    wanted = config.output.num_shards or math.ceil(total_bytes / (config.output.target_shard_mb * 1e6))
    if wanted < needed:
        logger.warning(
            "output.num_shards: %d shards would hold about %.0f MB each; writing %d instead (at most %d MB each)",
            wanted,
            total_bytes / wanted / 1e6,
            needed,
            MAX_SHARD_MB,
        )
    return max(1, min(max(wanted, needed), records))


def make_plan(
    config: BuildConfig, run_id: str | None = None, unit_budget_bytes: float = UNIT_BUDGET_BYTES
) -> BuildPlan:
    """Inspect the input files and decide everything the workers will do."""
    concat_dim = config.input.concat_dim
    paths = expand_paths(config.input.paths)
    infos = inspect_files(paths)
    ordered, concat_values = _order_files(infos, concat_dim)
    reference = ordered[0]
    mentioned = set(config.sample.window) | set(config.sample.offsets) | set(config.sample.keep) | {concat_dim}
    variables = _select_variables(config, reference, mentioned)
    _check_files_agree(ordered, variables, concat_dim)

    sizes = dict(reference.sizes)
    sizes[concat_dim] = len(concat_values)
    grid = _build_axes(config, variables[0], sizes)
    if grid.num_samples == 0:
        raise UserError(
            "sample: this configuration yields no samples; a window or offset span is too large for its dim"
        )

    raw_coords = {concat_dim: (concat_values, reference.coord_attrs.get(concat_dim, {}))}
    raw_coords.update(
        {d: (v, reference.coord_attrs.get(d, {})) for d, v in reference.coords.items() if d != concat_dim}
    )
    coords = {}
    for axis in grid.grid_axes:
        if axis.dim in raw_coords:
            converted = coord_record_values(*raw_coords[axis.dim])
            if converted is not None:
                coords[axis.dim] = converted
    variable_plans, features = _features(grid, variables, coords)

    files, start = [], 0
    for info in ordered:
        files.append(SourceFile(info.path, start, start + info.sizes[concat_dim], info.nbytes))
        start += info.sizes[concat_dim]
    valid_positions = _check_gaps(config, grid, concat_values, files)
    dropped = 0
    if valid_positions is not None:
        dropped = int((~valid_positions).sum()) * grid.num_samples // grid.axis(concat_dim).count

    record_bytes = _record_bytes(tuple(features))
    to_write = grid.num_samples - dropped
    num_shards = _num_shards(config, to_write * record_bytes, to_write)

    units = _plan_units(grid, variables, sizes, files, concat_dim, record_bytes, unit_budget_bytes)
    kept = {
        a.dim: _json_values(reference.coords[a.dim])
        for a in grid.axes
        if a.role == "keep" and a.dim in reference.coords
    }
    schema = Schema(
        features=tuple(features),
        sample={
            "concat_dim": concat_dim,
            "axes": [a.to_json() for a in grid.axes],
            "grid_dims": [a.dim for a in grid.grid_axes],
            "grid_shape": list(grid.shape),
            "num_samples": to_write,
        },
        coords=kept,
        sources=[dataclasses.asdict(f) for f in files],
        counts={"grid_positions": grid.num_samples, "samples_dropped_at_gaps": dropped},
        seed=config.shuffle.seed,
        config=config.model_dump(mode="json"),
        created_by=f"xarray-tfrecords {package_version()}",
    )
    return BuildPlan(
        config=config,
        files=tuple(files),
        concat_dim=concat_dim,
        grid=grid,
        variables=tuple(variable_plans),
        coords={d: v for d, (v, _) in coords.items()},
        units=tuple(units),
        num_shards=num_shards,
        schema=schema,
        run_id=run_id or uuid.uuid4().hex[:12],
        valid_positions=valid_positions,
    )


def _plan_units(
    grid: SampleGrid,
    variables: list[VariableInfo],
    sizes: dict[str, int],
    files: list[SourceFile],
    concat_dim: str,
    record_bytes: int,
    budget_bytes: float,
) -> list[Unit]:
    grid_dims = [a.dim for a in grid.grid_axes]
    split_dim = concat_dim if concat_dim in grid_dims else max(grid.grid_axes, key=lambda a: a.count).dim
    axis = grid.axis(split_dim)
    # A source step along split_dim holds every other dim of every variable.
    step_bytes = sum(
        np.dtype(v.dtype).itemsize * math.prod(sizes[d] for d in v.dims if d != split_dim) for v in variables
    )
    samples_per_position = grid.num_samples // max(axis.count, 1)
    # Samples are held about three times over: cut, encoded, and in buckets.
    per_position = step_bytes * axis.stride + 3 * samples_per_position * record_bytes
    breaks = [-(-f.start // axis.stride) for f in files] if split_dim == concat_dim else []
    return plan_units(grid, split_dim, per_position, budget_bytes, breaks)
