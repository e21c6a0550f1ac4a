"""The config's ``coords``: coordinates that are not dim coordinates, cut like data into coord/<name> features.

A curvilinear grid's 2-D ``lat(y, x)`` and ``lon(y, x)``, a 1-D auxiliary coordinate, one
that varies along the concat dim: each is read over the unit's box like a variable
(planning.reads.slabs, static ones from the first file that has them) and cut with the same window,
so every record carries the coordinates of its own points. Unlike variables they are not
counted in statistics, normalised, or subject to nan_policy. Scalar coordinates (a height of
2 m, a pressure level of 500 hPa) are recorded in schema.json whether listed or not.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence

import numpy as np

from planning.config.model import BuildConfig
from planning.formats.sources import netcdf_engine
from planning.inputs.inventory import Inventory
from planning.inputs.metadata import FileInfo, VariableInfo
from planning.positions import OtherCoordinate
from planning.run.contracts import SAMPLE_DIM
from planning.run.variables import VariablePlan
from planning.sampling import SampleGrid, Unit
from schemas.errors import UserError
from schemas.grid import describe_coordinate
from schemas.schema import Feature, Schema
from schemas.urls import is_remote

#: The role of these features in schema.json (``coord`` features are a dim's own coordinate).
ROLE = "aux_coord"

#: Coordinates a message names when a wanted one is missing.
_SHOWN = 8


def coordinate_feature(name: str) -> str:
    """The feature (and block coordinate) holding a coordinate's values over the sample's points."""
    return f"coord/{name}"


def _find(inventory: Inventory, name: str) -> tuple[VariableInfo, FileInfo] | None:
    """A coordinate and the file describing it; a data variable too, for files that do not mark their coordinates."""
    files = (inventory.reference, *inventory.static_files)
    for table in ("coordinates", "variables"):
        for info in files:
            found = getattr(info, table).get(name)
            if found is not None:
                return found, info
    return None


def _not_found(inventory: Inventory, name: str, grid_dims: Sequence[str]) -> UserError:
    reference = inventory.reference
    if name in grid_dims:
        return UserError(
            f"coords: {name!r} is the coordinate of dim {name!r}, which records already carry (coord/{name}, or "
            "schema.json's coords for a kept dim); remove it from `coords:`"
        )
    if any(name in info.coords for info in (reference, *inventory.static_files)):
        return UserError(
            f"coords: {name!r} is the coordinate of dim {name!r}, which none of the sample's dims "
            f"({', '.join(grid_dims)}) is; leave it out"
        )
    names = list(dict.fromkeys(n for info in (reference, *inventory.static_files) for n in info.coordinates))
    shown = ", ".join(names[:_SHOWN]) + (", ..." if len(names) > _SHOWN else "")
    have = f"its coordinates besides the dims': {shown}" if names else "it has no coordinates besides the dims'"
    return UserError(f"coords: {name!r} is not a coordinate of {reference.path} ({have}); fix the name")


def coordinate_plans(
    config: BuildConfig, inventory: Inventory, grid: SampleGrid, variables: Sequence[VariableInfo]
) -> list[VariablePlan]:
    """The coordinates the config lists, each read and cut like a variable into its coord/<name> feature."""
    chosen = {v.name for v in variables}
    grid_dims = [a.dim for a in grid.axes]
    concat_dim = inventory.concat_dim
    plans = []
    for name in config.coords:
        found = _find(inventory, name)
        if found is None:
            raise _not_found(inventory, name, grid_dims)
        var, info = found
        if name in chosen:
            raise UserError(
                f"coords: {name!r} is also a selected variable (listed under `variables:`, or taken by default); "
                "list it in one of the two"
            )
        outside = [d for d in var.dims if d not in grid_dims]
        if outside:
            raise UserError(
                f"coords: {name!r} is on ({', '.join(var.dims)}) but samples are cut over ({', '.join(grid_dims)}): "
                f"{outside[0]!r} is none of them; a coordinate's dims must be among the sample's, so leave it out"
            )
        kind = np.dtype(var.dtype).kind
        if kind not in "fiub":
            raise UserError(
                f"coords: {name!r} in {info.path} holds {var.dtype} values, and records carry coordinates as "
                "numbers only; leave it out"
            )
        along = concat_dim in var.dims
        if along:
            _check_in_every_file(inventory, name)
        shape, dims = grid.feature_shape(var.dims)
        dtype = "float32" if kind == "f" else "int64"
        source = {"coordinate": name, "dtype": var.dtype, "file_dtype": var.source_dtype, "attrs": var.attrs}
        source["dims"] = list(var.dims)
        if dtype == "float32" and np.dtype(var.dtype).itemsize > 4:
            source["stored_as"] = "float32 (tf.Example holds no float64)"
        if not along:
            source["static"] = True  # read from one file: the first that has it
        feature = Feature(coordinate_feature(name), dtype, shape, dims, ROLE, source)
        plans.append(VariablePlan(name, var.dims, var.dtype, feature, None if along else info.path))
    return plans


def _check_in_every_file(inventory: Inventory, name: str) -> None:
    for info in inventory.files:
        if name not in info.coordinates and name not in info.variables:
            raise UserError(f"{info.path}: coordinate {name!r} is missing; every input file needs it (coords:)")


def scalar_coordinates(inventory: Inventory) -> tuple[dict, ...]:
    """schema.json's ``scalar_coords``: each scalar coordinate's name, value (from the first file holding it), attrs."""
    out: dict[str, dict] = {}
    for info in (inventory.reference, *inventory.static_files):
        for name, value in info.scalar_values.items():
            if name not in out:
                var = info.coordinates[name]
                out[name] = {"name": name, "value": value, "dtype": var.dtype, "attrs": var.attrs}
    return tuple(out.values())


def other_coordinates(inventory: Inventory, dataset, named: Sequence[str] = ()) -> list[OtherCoordinate]:
    """The files' coordinates that are not a dim's own (planning.positions.OtherCoordinate), each loaded on the
    selected grid only when asked: where time features find a scalar or curvilinear grid's longitude. ``named``:
    config ``coords``, which may name plain variables of a grid file."""
    out, seen = [], set()
    found = [
        (name, var, info)
        for info in (inventory.reference, *inventory.static_files)
        for name, var in info.coordinates.items()
    ]
    found += [(name, *hit) for name in named if (hit := _find(inventory, name)) is not None]
    for name, var, info in found:
        if name in seen:
            continue
        seen.add(name)
        load = functools.partial(_load_coordinate, inventory, info, var, dataset)
        out.append(OtherCoordinate(name, tuple(var.dims), dict(var.attrs), load))
    return out


def _load_coordinate(inventory: Inventory, info: FileInfo, var: VariableInfo, dataset) -> np.ndarray:
    """A static coordinate's values on the selected grid, read whole from the file (or store) describing it."""
    if not var.dims:
        return np.asarray(info.scalar_values.get(var.name))  # (text or a time: not numeric, so not taken)
    if inventory.zarr is not None:
        from planning.formats.zarr_store import open_store, open_store_dataset

        with open_store_dataset(info.path, open_store(info.path), decode_times=False, indexes=False) as ds:
            values = np.asarray(ds[var.name].values)
    else:
        from planning.reads.slabs import FileReader

        shape, dims = tuple(info.sizes[d] for d in var.dims), tuple(var.dims)
        feature = Feature(coordinate_feature(var.name), "float32", shape, dims, ROLE)
        plan = VariablePlan(var.name, dims, var.dtype, feature, info.path)
        box = {d: (0, info.sizes[d]) for d in dims}
        values = FileReader(info.path, info.nbytes).read([plan], box).values[var.name]
    taken = [dataset.selection.indices(d, n) for d, n in zip(var.dims, values.shape)]
    return values[np.ix_(*taken)]


def _record_dtype(values: np.ndarray, plan: VariablePlan) -> np.ndarray:
    if plan.feature.dtype == "int64":
        return values.astype(np.int64)
    with np.errstate(over="ignore"):
        cast = values.astype(np.float32)
    if (np.isinf(cast) & ~np.isinf(values)).any():
        raise UserError(
            f"coords: {plan.name!r} has values beyond float32's range, which a record cannot hold; leave it out"
        )
    return cast


def cut_coordinates(
    grid: SampleGrid, plans: Sequence[VariablePlan], unit: Unit, values: dict[str, np.ndarray], chosen: np.ndarray
) -> dict[str, tuple[tuple[str, ...], np.ndarray]]:
    """Block coordinates {coord/<name>: (dims, values)} of the unit's ``chosen`` samples; ``values`` (consumed):
    each coordinate's values over the unit's box, as planning.reads.slabs read them."""
    out = {}
    for plan in plans:
        samples = grid.cut(values.pop(plan.name), plan.dims, unit)[chosen]
        out[plan.feature.name] = ((SAMPLE_DIM, *plan.feature.dims), _record_dtype(samples, plan))
    return out


def _open_static(path: str, grib: Mapping | None, concat_dim: str):
    """The file of a static coordinate, as the build reads it: GRIB files through the config's hypercube (and no
    index file written beside them), others as NetCDF."""
    if grib is not None:
        from planning.formats.grib import open_grib  # here: cfgrib loads only for a GRIB build

        return open_grib(path, grib, concat_dim)
    import xarray as xr

    return xr.open_dataset(path, engine=netcdf_engine(path), decode_times=False)


def with_static_coordinates(
    schema: Schema, plans: Sequence[VariablePlan], dataset, grib: Mapping | None = None, concat_dim: str = ""
) -> Schema:
    """The schema with each static coordinate of config ``coords`` (a curvilinear grid's 2-D lat/lon) in its grid,
    exactly, on the selected grid: reassembly puts them back where no sample carries them, in their own dtype.

    Read once here from a local file (a grid is small); a remote one is left out (reassembly then takes the
    float32 values the records carry). ``grib``: input.grib's filter_by_keys, for GRIB files.
    """
    grid = dict(schema.grid)
    for plan in plans:
        if plan.static_path is None or is_remote(plan.static_path):
            continue
        with _open_static(plan.static_path, grib, concat_dim) as ds:
            variable = ds[plan.name]
            taken = {d: dataset.selection.indices(d, variable.sizes[d]) for d in plan.dims}
            values = variable.isel(taken).values
        entry = describe_coordinate(values.reshape(-1), plan.feature.source.get("attrs", {}))
        grid[plan.feature.name] = {**entry, "dims": list(plan.dims), "shape": list(values.shape)}
    return dataclasses.replace(schema, grid=grid)
