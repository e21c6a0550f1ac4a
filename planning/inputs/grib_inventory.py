"""GRIB files planned as an inventory: one hypercube of each file (input.grib), ordered along the concat dim.

Each file is opened through cfgrib (planning.formats.grib) for its metadata and coordinates,
and the files are joined as NetCDF files are: in coordinate order, without overlaps, on one grid.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence

from planning.formats.grib import open_grib
from planning.formats.grib_fields import GribMessages
from planning.formats.sources import ListedFile, list_files
from planning.inputs.inventory import Inventory, _check_grid, _one_calendar, _one_unit, _order
from planning.inputs.metadata import FileInfo, dataset_info
from planning.inputs.probe_pool import map_in_pool, pool_processes
from planning.inputs.time_decoding import AS_STATED, TimeDecoding
from planning.run.cancellation import check_stopped
from schemas.errors import UserError

#: From this many files on, a pool of processes plans them: each costs cfgrib's index of its messages
#: (milliseconds a message: over a second for a file of a few hundred), far more than forking a process.
POOL_MIN_FILES = 3


def _check_scalars(infos: Sequence[FileInfo], concat_dim: str) -> None:
    """Every file's scalar coordinates (the level of a surface field, the step of analyses along time) are the
    first file's: schema.json records the first file's, for every sample."""
    first = infos[0]
    for info in infos[1:]:
        for name, value in first.scalar_values.items():
            if name in info.scalar_values and info.scalar_values[name] != value:
                raise UserError(
                    f"{info.path}: coordinate {name!r} is {info.scalar_values[name]!r} but {value!r} in {first.path}; "
                    f"files joined along {concat_dim!r} must agree on it: narrow input.paths or "
                    "input.grib.filter_by_keys to files that do"
                )


def _plan_file(
    concat_dim: str, filter_by_keys: Mapping, decoding: TimeDecoding, listed_file: ListedFile
) -> tuple[FileInfo, GribMessages]:
    """A file's hypercube and its messages, each placed in it: cfgrib's index of the file, built once, here
    (workers fetch a unit's messages straight from their offsets)."""
    check_stopped()  # a stopped build (Ctrl-C, SIGTERM) unwinds here, between two files
    index: list[GribMessages] = []
    with open_grib(listed_file.path, filter_by_keys, concat_dim, index=index) as ds:
        info = dataset_info(listed_file.path, listed_file.nbytes, decoding.dataset(listed_file.path, ds))
    return info, index[0]


def plan_grib_files(
    listed: Sequence[ListedFile],
    concat_dim: str,
    filter_by_keys: Mapping,
    decoding: TimeDecoding = AS_STATED,
    pool: bool | None = None,
) -> list[tuple[FileInfo, GribMessages]]:
    """Each file's hypercube and its messages, in the files' order; from POOL_MIN_FILES files on, in a pool of
    forked processes (planning.inputs.probe_pool, as the NetCDF files' probes).

    Args:
        listed: the files, as list_files gives them.
        concat_dim: input.concat_dim.
        filter_by_keys: input.grib.filter_by_keys.
        decoding: how times are decoded.
        pool: whether to plan them in a pool (None: where it pays off and the platform can fork).

    Raises:
        UserError: a file cfgrib cannot read as one hypercube of ``filter_by_keys``, the first in order.
    """
    plan = functools.partial(_plan_file, concat_dim, dict(filter_by_keys), decoding)
    processes = pool_processes()
    if pool is None:
        pool = len(listed) >= POOL_MIN_FILES and processes >= 2
    return list(map_in_pool(plan, listed, max(2, processes))) if pool else [plan(f) for f in listed]


def take_grib_inventory(
    patterns: list[str],
    concat_dim: str,
    filter_by_keys: Mapping,
    decoding: TimeDecoding = AS_STATED,
    tolerance: str | float = "float32",
) -> Inventory:
    """The GRIB files' hypercube chosen by ``filter_by_keys`` (input.grib), as an inventory along ``concat_dim``."""
    listed = list_files(patterns)
    planned = plan_grib_files(listed, concat_dim, filter_by_keys, decoding)
    infos = [info for info, _ in planned]
    messages = {info.path: placed for info, placed in planned}
    along = [info for info in infos if concat_dim in info.sizes]
    if len(along) < len(infos):
        missing = next(info for info in infos if concat_dim not in info.sizes)
        raise UserError(
            f"{missing.path}: its hypercube has no dim or coordinate {concat_dim!r} (its dims: "
            f"{', '.join(missing.sizes) or 'none'}); set input.concat_dim to the dim the files are split along "
            "(time or step for GRIB forecasts)"
        )
    along = _one_calendar(along, concat_dim) if decoding.enabled else _one_unit(along, concat_dim)
    ordered, values = _order(along, concat_dim)
    _check_scalars(ordered, concat_dim)
    reference = ordered[0]
    for info in ordered[1:]:
        _check_grid(info, reference, sorted(set(reference.sizes) - {concat_dim}), tolerance)
        if set(info.variables) != set(reference.variables):
            raise UserError(
                f"{info.path}: its hypercube holds {sorted(info.variables)} but {sorted(reference.variables)} in "
                f"{reference.path}; every file needs the same variables: narrow input.grib.filter_by_keys or "
                "input.paths"
            )
    versions = {f.path: f.version for f in listed}
    return Inventory(concat_dim, tuple(ordered), (), values, versions=versions, grib_messages=messages)
