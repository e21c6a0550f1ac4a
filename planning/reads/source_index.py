"""The input files along the concat dim as columns: found by bisection, saved once per run for the workers.

An archive can hold 100,000 files. Pickled into a DoFn as objects they would make the job graph
grow with the archive (Dataflow refuses graphs over 10 MB); as columns saved beside the output,
every worker loads them once, and a unit finds its files in O(log files).
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
from collections.abc import Iterator

import numpy as np

from planning.formats.grib_fields import GribMessages
from planning.formats.sources import SourceFile
from planning.inputs.variable_groups import group_of
from planning.reads.direct_reads import DirectReads
from schemas.npy_files import npz_arrays


@dataclasses.dataclass(frozen=True, eq=False)
class SourceIndex:
    """Files in concat order; file i covers [starts[i], stops[i]) of the virtual dataset's concat dim.

    With input.new_dim, the files of each member in turn: file i is of member ``members[i]``. Where variables
    come from separate files (planning.inputs.variable_groups), the files of each group in turn within a member:
    file i holds the variables ``group_names[groups[i]]``.
    """

    paths: tuple[str, ...]
    starts: np.ndarray  # int64
    stops: np.ndarray
    nbytes: np.ndarray
    versions: tuple[
        str, ...
    ] = ()  # as listed (planning.formats.sources: times and inode, or generation); workers check them
    members: np.ndarray | None = None  # int64, ascending; None: no new dim
    member_dim: str | None = None  # input.new_dim's name
    direct: DirectReads | None = None  # variables workers may read by offset, and where in each file
    classic: np.ndarray | None = None  # bool: each file's format as probed, classic NetCDF or not; None: not known
    groups: np.ndarray | None = None  # int64, ascending within a member; None: every file holds every variable
    group_names: tuple[tuple[str, ...], ...] = ()  # each group's variables
    #: GRIB files: (offset, length) of the messages workers read, file i's at rows grib_first[i]:grib_first[i + 1]
    grib_ranges: np.ndarray | None = None
    grib_first: np.ndarray | None = None
    #: and where cfgrib places each (planning.formats.grib_fields.GribMessages), one layout for every file; None:
    #: not known for every file (workers then read the files' messages through cfgrib)
    grib_cells: np.ndarray | None = None
    grib_checks: np.ndarray | None = None
    grib_layout: tuple[tuple[str, tuple[str, ...], tuple[int, ...]], ...] = ()

    @classmethod
    def of(
        cls,
        files: list[SourceFile],
        member_dim: str | None = None,
        direct: DirectReads | None = None,
        group_names: tuple[tuple[str, ...], ...] = (),
        grib: list[GribMessages] | None = None,
    ) -> SourceIndex:
        """``grib``: each GRIB file's messages (planning.formats.grib_fields)."""
        ranges = first = None
        cells, checks, layout = _grib_cells(grib or [])
        if grib is not None:
            ranges = np.concatenate(
                [np.asarray(m.ranges, dtype=np.int64).reshape(-1, 2) for m in grib] or [np.empty((0, 2))]
            )
            first = np.concatenate([[0], np.cumsum([len(m.ranges) for m in grib])]).astype(np.int64)
        return cls(
            tuple(f.path for f in files),
            np.array([f.start for f in files], dtype=np.int64),
            np.array([f.stop for f in files], dtype=np.int64),
            np.array([f.nbytes for f in files], dtype=np.int64),
            tuple(f.version for f in files),
            None if member_dim is None else np.array([f.member for f in files], dtype=np.int64),
            member_dim,
            direct,
            None if any(f.classic is None for f in files) else np.array([f.classic for f in files], dtype=bool),
            np.array([f.group for f in files], dtype=np.int64) if group_names else None,
            tuple(group_names),
            None if ranges is None else ranges.astype(np.int64),
            first,
            cells,
            checks,
            layout,
        )

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> SourceFile:
        version = self.versions[index] if self.versions else ""
        member = 0 if self.members is None else int(self.members[index])
        start, stop = int(self.starts[index]), int(self.stops[index])
        layouts = None
        if self.direct is not None:
            offsets, checks = self.direct.offsets[index].tolist(), self.direct.checks[index].tolist()
            layouts = {
                name: (offset, (stop - start, *shape[1:]), check)
                for name, shape, offset, check in zip(self.direct.names, self.direct.shapes, offsets, checks)
                if offset >= 0
            }
        classic = None if self.classic is None else bool(self.classic[index])
        group = 0 if self.groups is None else int(self.groups[index])
        return SourceFile(
            self.paths[index], start, stop, int(self.nbytes[index]), version, member, layouts, classic, group
        )

    def __iter__(self) -> Iterator[SourceFile]:
        return (self[i] for i in range(len(self)))

    @property
    def total_bytes(self) -> int:
        return int(self.nbytes.sum())

    def _grib_rows(self, source: SourceFile) -> slice | None:
        """The rows of GRIB file ``source``'s messages in the index; None without an index."""
        if self.grib_ranges is None or self.grib_first is None:
            return None
        found = int(np.searchsorted(self.starts, source.start, side="left"))
        while found < len(self) and self.paths[found] != source.path and self.starts[found] == source.start:
            found += 1
        if found >= len(self) or self.paths[found] != source.path:
            return None
        return slice(int(self.grib_first[found]), int(self.grib_first[found + 1]))

    def grib_messages(self, source: SourceFile) -> np.ndarray | None:
        """The (offset, length) of the messages of GRIB file ``source`` workers read; None without an index."""
        rows = self._grib_rows(source)
        return None if rows is None else self.grib_ranges[rows]

    def grib_fields(self, source: SourceFile) -> GribMessages | None:
        """GRIB file ``source``'s messages and where cfgrib places each; None where that is not known."""
        rows = self._grib_rows(source)
        if rows is None or self.grib_cells is None or self.grib_checks is None:
            return None
        return GribMessages(self.grib_ranges[rows], self.grib_cells[rows], self.grib_checks[rows], self.grib_layout)

    def group_of(self, variable: str) -> int:
        """The group of files that holds ``variable`` (0 for what every group holds, and without groups)."""
        return group_of(self.group_names, variable)

    def overlapping(self, begin: int, end: int, member: int = 0, group: int = 0) -> list[SourceFile]:
        """The files (of ``member``, with input.new_dim; of ``group``, with variables from separate files) holding
        any of positions [begin, end) of the concat dim."""
        low, high = 0, len(self)
        if self.members is not None:
            low, high = (int(np.searchsorted(self.members, member, side=side)) for side in ("left", "right"))
        if self.groups is not None:
            groups = self.groups[low:high]
            low, high = (low + int(np.searchsorted(groups, group, side=side)) for side in ("left", "right"))
        first = low + int(np.searchsorted(self.stops[low:high], begin, side="right"))
        last = low + int(np.searchsorted(self.starts[low:high], end, side="left"))
        return [self[i] for i in range(first, last)]

    def fingerprint(self) -> str:
        """Changes when any file, its size or its place along the concat dim (or the new dim) changes."""
        digest = hashlib.sha256("\n".join(self.paths).encode())
        for column in (self.starts, self.stops, self.nbytes):
            digest.update(column.tobytes())
        if self.members is not None:
            digest.update(self.members.tobytes())
        if self.groups is not None:
            digest.update(self.groups.tobytes())
            digest.update(json.dumps(self.group_names).encode())
        return digest.hexdigest()

    def to_bytes(self) -> bytes:
        buffer = io.BytesIO()
        paths, versions = np.array(self.paths, dtype=np.str_), np.array(self.versions, dtype=np.str_)
        columns = {"starts": self.starts, "stops": self.stops, "nbytes": self.nbytes}
        if self.members is not None:
            columns.update(members=self.members, member_dim=np.array(self.member_dim, dtype=np.str_))
        if self.direct is not None:
            shapes = json.dumps([list(shape) for shape in self.direct.shapes])
            columns.update(
                direct_names=np.array(self.direct.names, dtype=np.str_),
                direct_shapes=np.array(shapes, dtype=np.str_),
                direct_offsets=self.direct.offsets,
                direct_checks=self.direct.checks,
            )
        if self.classic is not None:
            columns.update(classic=self.classic)
        if self.groups is not None:
            columns.update(groups=self.groups, group_names=np.array(json.dumps(self.group_names), dtype=np.str_))
        if self.grib_ranges is not None:
            columns.update(grib_ranges=self.grib_ranges, grib_first=self.grib_first)
        if self.grib_cells is not None:
            layout = json.dumps([[name, list(dims), list(grid)] for name, dims, grid in self.grib_layout])
            columns.update(
                grib_cells=self.grib_cells, grib_checks=self.grib_checks, grib_layout=np.array(layout, dtype=np.str_)
            )
        np.savez_compressed(buffer, paths=paths, versions=versions, **columns)
        return buffer.getvalue()

    @classmethod
    def from_bytes(cls, data: bytes) -> SourceIndex:
        with npz_arrays(data) as columns:
            paths = tuple(str(p) for p in columns["paths"])
            versions = tuple(str(v) for v in columns["versions"])
            members, member_dim, direct = None, None, None
            if "members" in columns:
                members, member_dim = columns["members"], str(columns["member_dim"])
            if "direct_names" in columns:
                names = tuple(str(n) for n in columns["direct_names"])
                shapes = tuple(tuple(s) for s in json.loads(str(columns["direct_shapes"])))
                direct = DirectReads(names, shapes, columns["direct_offsets"], columns["direct_checks"])
            starts, stops, nbytes = columns["starts"], columns["stops"], columns["nbytes"]
            classic = columns["classic"].astype(bool) if "classic" in columns else None
            if classic is not None and classic.shape != (len(paths),):
                classic = None  # not this index's: each file's format is told from its bytes instead
            groups, group_names = None, ()
            if "groups" in columns:
                groups = columns["groups"]
                group_names = tuple(tuple(str(n) for n in names) for names in json.loads(str(columns["group_names"])))
            grib_ranges = grib_first = None
            if "grib_ranges" in columns:
                grib_ranges, grib_first = _grib_columns(columns["grib_ranges"], columns["grib_first"], len(paths))
            grib_cells = grib_checks = None
            grib_layout: tuple = ()
            if grib_ranges is not None and "grib_cells" in columns:
                grib_cells, grib_checks, grib_layout = _grib_placements(
                    columns["grib_cells"], columns["grib_checks"], str(columns["grib_layout"]), len(grib_ranges)
                )
            return cls(
                paths,
                starts,
                stops,
                nbytes,
                versions,
                members,
                member_dim,
                direct,
                classic,
                groups,
                group_names,
                grib_ranges,
                grib_first,
                grib_cells,
                grib_checks,
                grib_layout,
            )


def _grib_columns(ranges: np.ndarray, first: np.ndarray, files: int) -> tuple[np.ndarray | None, np.ndarray | None]:
    """A saved GRIB message index, checked before workers seek by it (read from disk: untrusted); None where it is
    not a sane index of these files (workers then scan each file whole, as without one)."""
    sane = (
        ranges.ndim == 2
        and ranges.shape[1:] == (2,)
        and ranges.dtype.kind == "i"
        and first.shape == (files + 1,)
        and first.dtype.kind == "i"
        and (first[:1] == 0).all()
        and (np.diff(first) >= 0).all()
        and first[-1] == len(ranges)
        and (ranges >= 0).all()
        and (ranges[:, 1] > 0).all()
    )
    return (ranges.astype(np.int64), first.astype(np.int64)) if sane else (None, None)


def _grib_cells(grib: list[GribMessages]) -> tuple[np.ndarray | None, np.ndarray | None, tuple]:
    """The files' cells and checks as columns, where every file's messages are placed on one layout (the variables'
    dims and grids agree across files, as planning requires); else none (workers then read through cfgrib)."""
    if not grib or not all(m.placed and m.layout == grib[0].layout for m in grib):
        return None, None, ()
    width = max(m.cells.shape[1] for m in grib)
    cells = np.full((sum(len(m.ranges) for m in grib), width), -1, dtype=np.int64)
    row = 0
    for messages in grib:
        cells[row : row + len(messages.cells), : messages.cells.shape[1]] = messages.cells
        row += len(messages.cells)
    return cells, np.concatenate([m.checks for m in grib]).astype(np.int64), grib[0].layout


def _grib_placements(
    cells: np.ndarray, checks: np.ndarray, layout_json: str, messages: int
) -> tuple[np.ndarray | None, np.ndarray | None, tuple]:
    """A saved GRIB placement, checked before workers place fields by it (read from disk: untrusted); none where it
    is not a sane placement of the index's messages (workers then read the messages through cfgrib)."""
    try:
        layout = tuple(
            (str(name), tuple(str(d) for d in dims), tuple(int(n) for n in grid))
            for name, dims, grid in json.loads(layout_json)
        )
    except (ValueError, TypeError):
        return None, None, ()
    sane = (
        cells.ndim == 2
        and cells.shape[0] == messages
        and cells.shape[1] >= 1
        and cells.dtype.kind == "i"
        and checks.shape == (messages,)
        and checks.dtype.kind == "i"
        and (cells >= -1).all()
        and (cells[:, 0] < len(layout)).all()
        and all(len(dims) - len(grid) < cells.shape[1] and all(n > 0 for n in grid) for _, dims, grid in layout)
    )
    return (cells.astype(np.int64), checks.astype(np.int64), layout) if sane else (None, None, ())
