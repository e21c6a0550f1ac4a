"""GRIB files planned as an inventory: one hypercube of each file (input.grib), ordered along the concat dim.

Each file is opened through cfgrib (planning.formats.grib) for its metadata and coordinates,
and the files are joined as NetCDF files are: in coordinate order, without overlaps, on one grid.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from planning.formats.grib import open_grib
from planning.formats.sources import list_files
from planning.inputs.inventory import Inventory, _check_grid, _one_calendar, _one_unit, _order
from planning.inputs.metadata import FileInfo, dataset_info
from planning.inputs.time_decoding import AS_STATED, TimeDecoding
from schemas.errors import UserError


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


def take_grib_inventory(
    patterns: list[str],
    concat_dim: str,
    filter_by_keys: Mapping,
    decoding: TimeDecoding = AS_STATED,
    tolerance: str | float = "float32",
) -> Inventory:
    """The GRIB files' hypercube chosen by ``filter_by_keys`` (input.grib), as an inventory along ``concat_dim``."""
    listed = list_files(patterns)
    infos, messages = [], {}
    for listed_file in listed:
        # Each file's messages indexed once, here: workers fetch a unit's messages straight from their offsets.
        index: list = []
        with open_grib(listed_file.path, filter_by_keys, concat_dim, index=index) as ds:
            infos.append(dataset_info(listed_file.path, listed_file.nbytes, decoding.dataset(listed_file.path, ds)))
        messages[listed_file.path] = index[0]
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
