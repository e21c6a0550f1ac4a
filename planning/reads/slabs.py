"""Reading a unit's slab on a worker: each variable's values over a box of the virtual dataset.

One protocol, Reader: ``read(variables, box) -> Slabs``. FileReader reads one file, through the
reader of its format, chosen once for every variable it reads; FilesReader the files along the
concat dim that overlap the box (each group's own, where variables come from separate files);
MembersReader each member's files (input.new_dim), stacked;
SelectionReader a box of the selected grid (config ``select``), through the reader it wraps.
A Zarr store's reader is planning.reads.zarr_reads.StoreReader.

Only the box is read. Classic NetCDF files are read by the byte ranges their header locates
(planning.formats.classic_reads); NetCDF-4 files by the offsets their probe found where the values are
plainly stored (planning.reads.direct_reads), else through h5py, in place when local, the box's bytes
prefetched when remote (planning.formats.hdf5_reads); what those leave (unusual files) through xarray.
Every value is decoded by xarray's CF rules, so each route gives the values
``xr.open_dataset`` gives.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Sequence
from typing import Protocol

import numpy as np
import xarray as xr

from planning.formats.classic_reads import read_box
from planning.formats.hdf5_chunks import UNIT_CHUNKS, keeping_chunks
from planning.formats.hdf5_reads import open_with_xarray, prefetched
from planning.formats.hdf5_reads import read_box as read_hdf5_box
from planning.formats.remote_files import RemoteFile
from planning.formats.sources import NETCDF_LOCK, SourceFile, is_hdf5, open_netcdf, size_and_version
from planning.reads.direct_reads import read_direct
from planning.reads.selection import Selection
from planning.reads.source_index import SourceIndex
from planning.run.variables import VariablePlan
from schemas.errors import UserError
from schemas.urls import is_remote

Box = dict[str, tuple[int, int]]


@dataclasses.dataclass
class Slabs:
    """Each variable's values over the box, and what was fetched from remote files (or a Zarr store): bytes,
    requests, round trips; and of a store's or NetCDF-4 files' chunks, the stored bytes fetched and those of the
    chunks the read owns (zarr_reads, planning.formats.hdf5_chunks)."""

    values: dict[str, np.ndarray]
    bytes_read: int = 0
    requests: int = 0
    round_trips: int = 0
    chunk_bytes: int = 0
    chunks_fetched: int = 0


class Reader(Protocol):
    """Reads each of some variables' values over a box: index ranges per dim (dims not named: whole)."""

    def read(self, variables: Sequence[VariablePlan], box: Box) -> Slabs: ...


def _failed(path: str, name: str, error: Exception) -> UserError:
    reason = str(error).splitlines()[0][:200] if str(error) else type(error).__name__
    return UserError(f"{path}: reading {name!r} failed ({reason}); the file may be truncated or corrupt")


def _missing(path: str, name: str) -> UserError:
    return UserError(f"{path}: variable {name!r} is missing; every input file needs it")


def _values(path: str, ds: xr.Dataset, name: str, box: Box) -> np.ndarray:
    if name not in ds.variables:
        raise _missing(path, name)
    var = ds[name]
    try:
        return var.isel({d: slice(*r) for d, r in box.items() if d in var.dims}).values
    except Exception as error:
        raise _failed(path, name, error) from None


def _read_hdf5(remote: RemoteFile, variables: Sequence[VariablePlan], box: Box) -> dict[str, np.ndarray]:
    local = not is_remote(remote.path)
    target = remote.path if local else prefetched(remote, variables, box)
    values = read_hdf5_box(target, variables, box, remote.path)
    if values is not None:
        return values
    opened = open_netcdf(remote.path, decode_times=False) if local else open_with_xarray(target, remote.path)
    with opened as ds:
        return {v.name: _values(remote.path, ds, v.name, box) for v in variables}


def _read_classic(remote: RemoteFile, header, variables: Sequence[VariablePlan], box: Box) -> dict[str, np.ndarray]:
    out = {}
    for name in (v.name for v in variables):
        variable = header.variables.get(name)
        if variable is None:
            raise _missing(remote.path, name)
        ranges = [box.get(d, (0, n)) for d, n in zip(variable.dims, variable.shape)]
        try:
            out[name] = read_box(remote.fetch, variable, header.record_size, ranges)
        except (EOFError, ValueError) as error:
            raise _failed(remote.path, name, error) from None
    return out


@dataclasses.dataclass(frozen=True)
class FileReader:
    """One file of ``size`` bytes (if known), by ``path``: a classic NetCDF file by the byte ranges its header
    locates, anything else through HDF5 (or xarray where HDF5 declines). Ranges within the file; remote reads
    counted in the Slabs."""

    path: str
    size: int | None = None
    classic: bool | None = None  # the format its probe found (SourceFile.classic); None: told from its bytes

    def read(self, variables: Sequence[VariablePlan], box: Box) -> Slabs:
        remote = RemoteFile(self.path, self.size)
        try:
            # The format, chosen once for every variable: as probed, where planning says; else a local HDF5
            # file by its signature, anything else by whether a classic header parses. (A file planned as
            # classic is still read by its header: HDF5 takes it where no header parses.)
            if self.classic is None:
                sniffed = not is_remote(self.path) and is_hdf5(self.path)
                header = None if sniffed else remote.classic_header()
            else:
                header = remote.classic_header() if self.classic else None
            if header is None:
                values = _read_hdf5(remote, variables, box)
            else:
                values = _read_classic(remote, header, variables, box)
        except FileNotFoundError:
            raise UserError(f"{self.path}: file not found (was it moved or deleted during the build?)") from None
        slabs = Slabs(values)
        if is_remote(self.path):
            slabs.bytes_read, slabs.requests, slabs.round_trips = remote.bytes_read, remote.requests, remote.round_trips
        return slabs


def _read_file(
    slabs: Slabs,
    path: str,
    variables: Sequence[VariablePlan],
    box: Box,
    size: int | None = None,
    classic: bool | None = None,
) -> dict[str, np.ndarray]:
    """Values of ``variables`` over ``box`` in one file of ``size`` bytes (if known) and format ``classic`` (if
    probed); counts remote reads in slabs."""
    part = FileReader(path, size, classic).read(variables, box)
    _add_counts(slabs, part)
    return part.values


def _checked(path: str, variable: VariablePlan, values: np.ndarray, box: Box) -> np.ndarray:
    """The values read from one file, refused if the file's variable is not like the reference file's.

    Planning probes only the files' coordinates (planning.inputs.local_probe); this is where each
    file's variables are held to the reference's dims and decoded dtype.
    """
    expected = tuple(box[d][1] - box[d][0] for d in variable.dims)
    if values.shape != expected:
        raise UserError(
            f"{path}: variable {variable.name!r} has shape {values.shape} where the plan needs {expected} "
            f"({', '.join(variable.dims)}); every file's variables must have the first file's dims and sizes"
        )
    if values.dtype != np.dtype(variable.dtype):
        raise UserError(
            f"{path}: variable {variable.name!r} decodes to {values.dtype} but to {variable.dtype} in the first file "
            "(its dtype, scale_factor, add_offset or _FillValue differ); all files must agree"
        )
    return values


def _check_unchanged(source: SourceFile) -> None:
    try:
        size, version = size_and_version(source.path)
    except FileNotFoundError:
        raise UserError(f"{source.path}: file not found (was it moved or deleted during the build?)") from None
    if size != source.nbytes or (source.version and _comparable(version) != _comparable(source.version)):
        change = (
            f"size ({size} bytes, {source.nbytes} then)" if size != source.nbytes else _changed(source.version, version)
        )
        raise UserError(
            f"{source.path}: changed since the build was planned (its {change}); "
            "do not modify input files during a build: run it again"
        )


def _comparable(version: str) -> str:
    """A version without its inode: a worker may see the planner's file through another mount, which numbers
    inodes its own way (gcsfuse on each node of a cluster); the times and, for reads by offset, the probe's
    content check still tell a replaced file."""
    return ";".join(part for part in version.split(";") if not part.startswith("ino="))


#: The parts of a version (planning.formats.sources._version) by what a user knows them as.
_VERSION_PARTS = {"mtime_ns": "modification time", "ctime_ns": "change time", "ino": "inode"}


def _changed(then: str, now: str) -> str:
    """Which parts of a file's version differ, named for a user."""
    if "=" not in then or "=" not in now:  # a store's modification time alone
        return "modification time"
    before, after = (dict(part.partition("=")[::2] for part in v.split(";")) for v in (then, now))
    changed = [key for key in {**before, **after} if before.get(key) != after.get(key)]
    return " and ".join(dict.fromkeys(_VERSION_PARTS.get(key, key) for key in changed)) or "version"


def read_slabs(files: Sequence[SourceFile], concat_dim: str, variables: Sequence[VariablePlan], box: Box) -> Slabs:
    """Each variable's values over ``box`` (source index ranges on the virtual dataset).

    Static variables (no concat dim) are read from their file, the others along the concat dim,
    whose range may span several files: each overlapping file is read once for all of them, then
    the parts joined.
    """
    slabs = Slabs({})
    static = [v for v in variables if v.static_path is not None]
    for path in dict.fromkeys(v.static_path for v in static):
        slabs.values.update(_read_file(slabs, path, [v for v in static if v.static_path == path], box))
    along = [v for v in variables if v.static_path is None]
    begin, end = box[concat_dim]
    parts: dict[str, list[np.ndarray]] = {v.name: [] for v in along}
    files = [f for f in files if along and f.stop > begin and f.start < end]
    boxes = [
        {**box, concat_dim: (max(begin, source.start) - source.start, min(end, source.stop) - source.start)}
        for source in files
    ]
    ledger = UNIT_CHUNKS.get()
    read: list[dict[str, np.ndarray] | None] = []
    for source, local in zip(files, boxes):  # by offset first, without the lock: plain reads, any thread at once
        if ledger is not None:
            ledger.file_starts_at(source.path, source.start)
        _check_unchanged(source)  # also what makes an offset planned for it still right
        read.append(read_direct(source, along, local, concat_dim))
    # Local files left to HDF5 are read holding the lock for all of the unit's: HDF5 works one call at a time
    # per process anyway, and two threads handing the lock (and the GIL, which h5py keeps while it works)
    # back and forth at every small file read slower than one thread. Remote files let go of it while their
    # bytes arrive.
    left = [i for i, values in enumerate(read) if values is None]
    with contextlib.nullcontext() if not left or any(is_remote(f.path) for f in files) else NETCDF_LOCK:
        for i in left:
            read[i] = _read_file(slabs, files[i].path, along, boxes[i], files[i].nbytes, files[i].classic)
    for source, local, values in zip(files, boxes, read):
        for variable in along:
            parts[variable.name].append(_checked(source.path, variable, values[variable.name], local))
    return join_pieces(slabs, along, parts, concat_dim, begin, end)


def join_pieces(slabs, along, parts, concat_dim: str, begin: int, end: int):
    """Each variable's pieces, file after file, joined along the concat dim into ``slabs`` (returned)."""
    for variable in along:
        pieces = parts[variable.name]
        if not pieces:
            raise ValueError(f"no input file covers {concat_dim} range {begin}:{end}")
        axis = variable.dims.index(concat_dim)
        slabs.values[variable.name] = pieces[0] if len(pieces) == 1 else np.concatenate(pieces, axis=axis)
    return slabs


def _add_counts(slabs: Slabs, part: Slabs) -> None:
    slabs.bytes_read += part.bytes_read
    slabs.requests += part.requests
    slabs.round_trips += part.round_trips
    slabs.chunk_bytes += part.chunk_bytes
    slabs.chunks_fetched += part.chunks_fetched


@dataclasses.dataclass(frozen=True, eq=False)
class FilesReader:
    """The files along the concat dim (of ``member``, with input.new_dim) that overlap the box: read_slabs."""

    sources: SourceIndex
    concat_dim: str
    member: int = 0

    def read(self, variables: Sequence[VariablePlan], box: Box) -> Slabs:
        if not self.sources.group_names:
            files = self.sources.overlapping(*box[self.concat_dim], self.member)
            return read_slabs(files, self.concat_dim, variables, box)
        # Variables from separate files: each group's read from its own files.
        by_group: dict[int, list[VariablePlan]] = {}
        for variable in variables:
            by_group.setdefault(self.sources.group_of(variable.name), []).append(variable)
        slabs = Slabs({})
        for group, some in by_group.items():
            files = self.sources.overlapping(*box[self.concat_dim], self.member, group)
            part = read_slabs(files, self.concat_dim, some, box)
            _add_counts(slabs, part)
            slabs.values.update(part.values)
        return slabs


@dataclasses.dataclass(frozen=True, eq=False)
class MembersReader:
    """input.new_dim: every member in the box read from its own files, and stacked along the new dim (the first
    dim of every variable along the concat dim)."""

    sources: SourceIndex
    concat_dim: str

    def read(self, variables: Sequence[VariablePlan], box: Box) -> Slabs:
        dim = self.sources.member_dim
        per_member = [v for v in variables if v.dims[:1] == (dim,)]
        shared = [v for v in variables if v.dims[:1] != (dim,)]
        # Static variables, and coordinates along the concat dim alone, are the same for every
        # member: read from the first member's files.
        slabs = FilesReader(self.sources, self.concat_dim).read(shared, box)
        inner = [dataclasses.replace(v, dims=v.dims[1:]) for v in per_member]
        parts: dict[str, list[np.ndarray]] = {v.name: [] for v in inner}
        for member in range(*box[dim]) if inner else ():
            part = FilesReader(self.sources, self.concat_dim, member).read(inner, box)
            _add_counts(slabs, part)
            for name, values in part.values.items():
                parts[name].append(values)
        slabs.values.update({name: np.stack(pieces) for name, pieces in parts.items()})
        return slabs


def files_reader(sources: SourceIndex, concat_dim: str) -> Reader:
    """The reader of the input files: each member's files with input.new_dim, else the files along the concat dim."""
    return FilesReader(sources, concat_dim) if sources.member_dim is None else MembersReader(sources, concat_dim)


@dataclasses.dataclass(frozen=True, eq=False)
class SelectionReader:
    """A box of the selected grid (planning.reads.selection), read through ``inner`` as pieces of the source.

    The box maps to one piece of the source per combination of the selected runs it spans
    (a seam-crossing longitude range: two); each piece is read and put in its place, so only
    selected elements are read. Variables are read in groups by the selected dims they have,
    so a field without a selected dim is read once, not once per piece.
    """

    inner: Reader
    selection: Selection

    def read(self, variables: Sequence[VariablePlan], box: Box) -> Slabs:
        selection = self.selection
        if not selection:
            return self.inner.read(variables, box)
        slabs = Slabs({})
        groups: dict[tuple[str, ...], list[VariablePlan]] = {}
        for variable in variables:
            groups.setdefault(tuple(d for d in variable.dims if d in selection.runs), []).append(variable)
        for dims, group in groups.items():
            pieces = selection.pieces(box, dims)
            # Pieces (selected levels, say) may lie in the same NetCDF-4 chunks: each is decoded once, kept for them.
            with keeping_chunks(len(pieces) > 1):
                for piece, place in pieces:
                    self._place(slabs, group, box, self.inner.read(group, piece), place, len(pieces) == 1)
        return slabs

    @staticmethod
    def _place(slabs: Slabs, group: Sequence[VariablePlan], box: Box, part: Slabs, place: Box, whole: bool) -> None:
        """One piece's values put in their place in the box (``whole``: the piece is the box)."""
        _add_counts(slabs, part)
        for variable in group:
            values = part.values[variable.name]
            if whole:
                slabs.values[variable.name] = values
                continue
            if variable.name not in slabs.values:
                shape = tuple(box[d][1] - box[d][0] for d in variable.dims)
                slabs.values[variable.name] = np.empty(shape, values.dtype)
            where = tuple(slice(*place[d]) if d in place else slice(None) for d in variable.dims)
            slabs.values[variable.name][where] = values


def read_members(sources: SourceIndex, concat_dim: str, variables: Sequence[VariablePlan], box: Box) -> Slabs:
    """Each variable's values over ``box`` with input.new_dim (MembersReader)."""
    return MembersReader(sources, concat_dim).read(variables, box)


def read_selected(
    sources: SourceIndex,
    concat_dim: str,
    variables: Sequence[VariablePlan],
    box: Box,
    selection: Selection,
    reader: Reader | None = None,
) -> Slabs:
    """Each variable's values over ``box``, index ranges on the selected grid (SelectionReader), read through
    ``reader`` (default: the files of ``sources``)."""
    return SelectionReader(reader or files_reader(sources, concat_dim), selection).read(variables, box)
