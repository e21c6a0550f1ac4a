"""Reading a unit's box from GRIB files on a worker: the messages the box needs, fetched alone and decoded with
ecCodes where planning placed them (planning.formats.grib_fields); anything else through cfgrib, at the hypercube
planning chose (input.grib). Either way the values are those ``xr.open_dataset(path, engine="cfgrib")`` gives.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence

import numpy as np

from planning.formats.byte_ranges import merge_ranges
from planning.formats.grib import open_grib
from planning.formats.grib_fields import MISSING, VALUES_DTYPE, GribMessages, checked_message, decode_field
from planning.formats.remote_files import RemoteFile
from planning.formats.sources import SourceFile
from planning.reads.slabs import Box, Slabs, _add_counts, _check_unchanged, _checked, _failed, join_pieces
from planning.reads.source_index import SourceIndex
from planning.run.variables import VariablePlan
from schemas.errors import UserError
from schemas.urls import is_remote


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
                raise _failed(path, variable.name, error) from None
    return out


def _placements(fields: GribMessages, variables: Sequence[VariablePlan], box: Box) -> dict | None:
    """Each variable's rows of ``fields`` that fall in ``box``, with their cells and its grid; None unless every
    variable is placed as the plan reads it (its dims, cfgrib's float32) and the box names each of its dims."""
    numbers = {name: (number, dims, grid) for number, (name, dims, grid) in enumerate(fields.layout)}
    found = {}
    for variable in variables:
        number, dims, grid = numbers.get(variable.name, (-1, (), ()))
        if number < 0 or dims != tuple(variable.dims) or np.dtype(variable.dtype) != VALUES_DTYPE:
            return None
        header = dims[: len(dims) - len(grid)]
        if any(d not in box for d in dims):
            return None
        inside = fields.cells[:, 0] == number
        for column, dim in enumerate(header, start=1):
            begin, end = box[dim]
            inside &= (fields.cells[:, column] >= begin) & (fields.cells[:, column] < end)
        found[variable.name] = (np.flatnonzero(inside), header, grid)
    return found


def _fetch(path: str, ranges: np.ndarray, rows: np.ndarray, slabs: Slabs) -> dict[int, memoryview]:
    """The bytes of each message of ``rows`` (fetched in as few ranges as merge_ranges makes), by row."""
    rows = rows[np.argsort(ranges[rows, 0], kind="stable")]
    starts, lengths = ranges[rows, 0], ranges[rows, 1]
    merged = merge_ranges(starts, starts + lengths)
    if is_remote(path):
        remote = RemoteFile(path)
        pieces = remote.fetch([(start, stop) for start, stop, _, _ in merged])
        _add_counts(slabs, Slabs({}, remote.bytes_read, remote.requests, remote.round_trips))
    else:
        try:
            with open(path, "rb") as stream:
                pieces = [os.pread(stream.fileno(), stop - start, start) for start, stop, _, _ in merged]
        except FileNotFoundError:
            raise UserError(f"{path}: file not found (was it moved or deleted during the build?)") from None
    out = {}
    for (start, _, first, end), piece in zip(merged, pieces):
        view = memoryview(piece)
        for row, offset, length in zip(rows[first:end].tolist(), starts[first:end].tolist(), lengths[first:end]):
            out[row] = view[offset - start : offset - start + int(length)]
    return out


def _read_placed(
    path: str, fields: GribMessages, variables: Sequence[VariablePlan], box: Box, slabs: Slabs
) -> dict[str, np.ndarray] | None:
    """The variables over ``box`` from the messages it needs alone, each decoded as cfgrib decodes it (NaN where
    no message is, as cfgrib's array); None where planning's placement does not cover them (read through cfgrib)."""
    placements = _placements(fields, variables, box)
    if placements is None:
        return None
    needed = np.unique(np.concatenate([rows for rows, _, _ in placements.values()] or [np.zeros(0, np.int64)]))
    messages = _fetch(path, fields.ranges, needed, slabs)
    out = {}
    for variable in variables:
        rows, header, grid = placements[variable.name]
        corner = [box[d][0] for d in header]
        window = tuple(slice(*box[d]) for d in variable.dims[len(header) :])
        values = np.full(tuple(box[d][1] - box[d][0] for d in variable.dims), np.nan, dtype=VALUES_DTYPE)
        for row in rows.tolist():
            offset = int(fields.ranges[row, 0])
            cell = fields.cells[row]
            message = checked_message(path, messages[row], offset, int(fields.checks[row]), cell)
            try:
                field = decode_field(message, grid)
            except Exception as error:  # ecCodes' own types: the bytes are the ones planned, yet do not decode
                raise _failed(path, variable.name, error) from None
            where = tuple(int(i) - c for i, c in zip(cell[1 : 1 + len(header)], corner))
            values[where] = field[window]
        values[values == MISSING] = np.nan
        out[variable.name] = values
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
            values = self._read_source(source, along, local, slabs)
            for variable in along:
                parts[variable.name].append(_checked(source.path, variable, values[variable.name], local))
        return join_pieces(slabs, along, parts, self.concat_dim, begin, end)

    def _read_source(
        self, source: SourceFile, variables: Sequence[VariablePlan], box: Box, slabs: Slabs
    ) -> dict[str, np.ndarray]:
        """One file's variables over ``box``: the data variables planning placed by their messages, the rest (its
        coordinates, or every variable where nothing is placed) through cfgrib."""
        fields = self.sources.grib_fields(source)
        names = {name for name, _, _ in fields.layout} if fields is not None else set()
        placed = [v for v in variables if v.name in names]
        values = _read_placed(source.path, fields, placed, box, slabs) if placed else None
        if values is None:
            values, placed = {}, []
        rest = [v for v in variables if v not in placed]
        if rest:
            messages = self.sources.grib_messages(source)
            values.update(_read_file(source.path, dict(self.filter_by_keys), self.concat_dim, rest, box, messages))
        return values
