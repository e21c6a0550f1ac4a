"""Reading a unit's box from GRIB files on a worker: each file the box overlaps opened through cfgrib at the
hypercube planning chose (input.grib), its values decoded as ``xr.open_dataset(path, engine="cfgrib")`` decodes them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np

from planning.formats.grib import open_grib
from planning.reads.slabs import Box, Slabs, _check_unchanged, _checked, join_pieces
from planning.reads.source_index import SourceIndex
from planning.run.variables import VariablePlan
from schemas.errors import UserError


def _read_file(
    path: str, filter_by_keys: Mapping, concat_dim: str, variables, box: Box, ranges: np.ndarray | None = None
) -> dict[str, np.ndarray]:
    """``ranges``: the file's messages as planning indexed them, the only bytes fetched (None: the whole file)."""
    out = {}
    with open_grib(path, filter_by_keys, concat_dim, ranges=ranges) as ds:
        for variable in variables:
            if variable.name not in ds.variables:
                raise UserError(f"{path}: variable {variable.name!r} is missing; every input file needs it")
            where = {d: slice(*box[d]) for d in variable.dims if d in box}
            try:
                out[variable.name] = ds[variable.name].isel(where).values
            except Exception as error:
                reason = str(error).splitlines()[0][:200] if str(error) else type(error).__name__
                raise UserError(
                    f"{path}: reading {variable.name!r} failed ({reason}); the file may be truncated or corrupt"
                ) from None
    return out


@dataclasses.dataclass(frozen=True, eq=False)
class GribReader:
    """GRIB files' Reader (planning.reads.slabs.Reader): the files along the concat dim that overlap the box, each
    read once for every variable; variables without the concat dim from the first file."""

    sources: SourceIndex
    concat_dim: str
    filter_by_keys: tuple[tuple[str, str | int | float], ...]

    def read(self, variables: Sequence[VariablePlan], box: Box) -> Slabs:
        keys = dict(self.filter_by_keys)
        slabs = Slabs({})
        static = [v for v in variables if v.static_path is not None]
        for path in dict.fromkeys(v.static_path for v in static):
            slabs.values.update(
                _read_file(path, keys, self.concat_dim, [v for v in static if v.static_path == path], box)
            )
        along = [v for v in variables if v.static_path is None]
        begin, end = box[self.concat_dim]
        files = self.sources.overlapping(begin, end)
        parts: dict[str, list[np.ndarray]] = {v.name: [] for v in along}
        for source in files if along else ():
            _check_unchanged(source)
            local = {
                **box,
                self.concat_dim: (max(begin, source.start) - source.start, min(end, source.stop) - source.start),
            }
            values = _read_file(source.path, keys, self.concat_dim, along, local, self.sources.grib_messages(source))
            for variable in along:
                parts[variable.name].append(_checked(source.path, variable, values[variable.name], local))
        return join_pieces(slabs, along, parts, self.concat_dim, begin, end)
