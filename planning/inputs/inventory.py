"""The input files as one virtual dataset: ordered along the concat dim, checked to agree.

Files that have the concat dim are joined along it in coordinate order; files without it
(e.g. invariants such as orography or a land-sea mask) hold static variables.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

import fsspec
import numpy as np

from planning.formats.calendars import GREGORIAN, as_cftime, calendar_of
from planning.formats.grib_fields import GribMessages
from planning.formats.sources import NETCDF_LOCK, ListedFile, SourceFile, check_not_truncated, list_files
from planning.formats.zarr_paths import StoreLayout
from planning.inputs.coords import format_value
from planning.inputs.input_config import NewDimConfig
from planning.inputs.local_probe import probe_local_files
from planning.inputs.members import Members, check_same_steps, group_by_member, make_members
from planning.inputs.metadata import FileInfo, VariableInfo, inspect_file
from planning.inputs.probe import FileProbe, decode_concat_values, probe_remote
from planning.inputs.probe_cache import reuse_or_probe
from planning.inputs.time_decoding import AS_STATED, TimeDecoding, check_no_missing, is_time
from planning.inputs.tolerance import coordinate_mismatch, describe_tolerance
from planning.inputs.variable_groups import VariableGroups, check_same_steps_of_groups, group_by_variables
from schemas.errors import UserError
from schemas.urls import is_remote


@dataclasses.dataclass(frozen=True)
class Inventory:
    concat_dim: str
    files: tuple[FileInfo, ...]  # files along the concat dim, in coordinate order
    static_files: tuple[FileInfo, ...]  # files without the concat dim
    concat_values: np.ndarray  # the virtual dataset's concat coordinate
    #: every probed file's probe, as listed: what planning.inputs.probe_cache keeps for the next run
    probes: tuple[tuple[ListedFile, FileProbe], ...] = ()
    #: each file's version as listed (planning.formats.sources: times and inode, or generation): workers check
    #: it is unchanged
    versions: Mapping[str, str] = dataclasses.field(default_factory=dict)
    #: a Zarr store's chunking, when the input is one store (planning.inputs.zarr_inventory) rather than files
    zarr: StoreLayout | None = None
    #: input.new_dim: the members and their files (``files`` are the first member's; with ``groups``, of its first
    #: group)
    members: Members | None = None
    #: files holding different variables over the same steps (one variable per file, as CMIP): the groups
    #: (``files`` are the first group's)
    groups: VariableGroups | None = None
    #: GRIB files: per file, the messages of the hypercube read and where each lies in it
    #: (planning.formats.grib_fields)
    grib_messages: Mapping[str, GribMessages] | None = None

    @property
    def reference(self) -> FileInfo:
        return self.files[0]

    @property
    def references(self) -> tuple[FileInfo, ...]:
        """Where the variables along the concat dim are described: the first file, or each group's first file."""
        return (self.reference,) if self.groups is None else self.groups.references

    @property
    def all_files(self) -> tuple[FileInfo, ...]:
        """Every file along the concat dim: of every member, member by member (group by group within one)."""
        return tuple(info for lane in self.lanes() for info in lane)

    def lanes(self) -> tuple[tuple[FileInfo, ...], ...]:
        """The runs of files along the concat dim: per member, per group of variables."""
        if self.groups is not None:
            return tuple(files for member in self.groups.files for files in member)
        return (self.files,) if self.members is None else self.members.files

    @property
    def sizes(self) -> dict[str, int]:
        """Dim sizes of the virtual dataset."""
        sizes = {d: n for info in self.static_files for d, n in info.sizes.items()}
        sizes.update(self.reference.sizes)
        sizes[self.concat_dim] = len(self.concat_values)
        if self.members is not None:
            sizes[self.members.dim] = len(self.members.values)
        return sizes

    @property
    def variables(self) -> dict[str, VariableInfo]:
        """Every data variable: along the concat dim (from the first file; the new dim first, if any) or static."""
        found = {name: var for info in self.static_files for name, var in info.variables.items()}
        for reference in self.references:
            found.update({name: var for name, var in reference.variables.items() if name not in found})
        if self.members is not None:
            member_dim = (self.members.dim,)
            found = {
                name: dataclasses.replace(var, dims=member_dim + var.dims) if self.concat_dim in var.dims else var
                for name, var in found.items()
            }
        return found

    def coordinate(self, dim: str) -> tuple[np.ndarray, dict] | None:
        """Values and attributes of a dim's coordinate on the virtual dataset, if it has one."""
        if dim == self.concat_dim:
            return self.concat_values, self.reference.coord_attrs.get(dim, {})
        if self.members is not None and dim == self.members.dim:
            return self.members.values, {}
        for info in (self.reference, *self.static_files):
            if dim in info.coords:
                return info.coords[dim], info.coord_attrs.get(dim, {})
        return None

    def static_file_of(self, variable: str) -> str | None:
        """The file a static variable is read from (None for variables along the concat dim)."""
        for reference in self.references:
            if variable in reference.variables:
                return None if self.concat_dim in reference.variables[variable].dims else reference.path
        return next(info.path for info in self.static_files if variable in info.variables)

    def source_files(self) -> list[SourceFile]:
        """The files along the concat dim with their ranges on it, member by member (input.new_dim), group by group
        within a member (variables from separate files)."""
        count = 1 if self.groups is None else len(self.groups.names)
        files = []
        for lane, infos in enumerate(self.lanes()):
            start = 0
            for info in infos:
                stop = start + info.sizes[self.concat_dim]
                version = self.versions.get(info.path, "")
                member, group = divmod(lane, count)
                files.append(SourceFile(info.path, start, stop, info.nbytes, version, member, group=group))
                start = stop
        return files


def take_inventory(
    patterns: list[str],
    concat_dim: str,
    cached: Mapping | None = None,
    decoding: TimeDecoding = AS_STATED,
    tolerance: str | float = "float32",
    new_dim: NewDimConfig | None = None,
    wanted: frozenset[str] | None = None,
) -> Inventory:
    """List, inspect and order the files; ``cached``: probes kept from an earlier run (planning.inputs.probe_cache).

    ``decoding``: how times are decoded (input.decode_times, input.calendar); ``tolerance``:
    input.coord_tolerance, how far static files' grids may differ from the first file's;
    ``new_dim``: input.new_dim, the files grouped into members by their names; ``wanted``: the
    variables whose byte layouts probes record (planning.reads.direct_reads; None: every one).
    """
    listed = list_files(patterns)
    probes = reuse_or_probe(listed, cached or {}, lambda missing: probe_files(missing, concat_dim, wanted))
    infos = inspect_files(listed, concat_dim, probes, decoding)
    along = [i for i in infos if concat_dim in i.sizes]
    static = tuple(i for i in infos if concat_dim not in i.sizes)
    if not along:
        raise _no_concat_dim(infos[0], concat_dim)
    along = _one_calendar(along, concat_dim) if decoding.enabled else _one_unit(along, concat_dim)
    members = groups = None
    if new_dim is None:
        lanes = _join_by_variable(along, concat_dim)
        ordered, values = lanes[0][1], lanes[0][2]
    else:
        _check_new_dim_name(along, new_dim)
        per_member = [
            (value, _join_by_variable(files, concat_dim, _same_member(value, new_dim)))
            for value, files in group_by_member(along, new_dim)
        ]
        _check_same_groups(per_member, new_dim.name)
        firsts = [(value, lanes[0][1], lanes[0][2]) for value, lanes in per_member]
        check_same_steps(firsts, concat_dim, new_dim.name)
        members = make_members(new_dim.name, new_dim.pattern, firsts)
        _, ordered, values = firsts[0]
        lanes = per_member[0][1]
    if len(lanes) > 1:
        names = tuple(names for names, _, _ in lanes)
        by_member = [lanes] if new_dim is None else [lanes for _, lanes in per_member]
        groups = VariableGroups(names, tuple(tuple(tuple(files) for _, files, _ in lanes) for lanes in by_member))
    kept = tuple((f, probe) for f, probe in zip(listed, probes) if probe is not None)
    versions = {f.path: f.version for f in listed}
    inventory = Inventory(concat_dim, tuple(ordered), static, values, kept, versions, members=members, groups=groups)
    _check_groups_grid(inventory, tolerance)
    _check_static_files(inventory, tolerance)
    return inventory


def probe_files(
    files: list[ListedFile], concat_dim: str, wanted: frozenset[str] | None = None
) -> list[FileProbe | None]:
    """A quick look at each file, or None where only the full look will do (unusual or unreadable files).

    ``wanted``: the variables whose byte layouts local probes record (None: every one).
    """
    probes: dict[str, FileProbe | None] = {}
    remote = [f for f in files if is_remote(f.path)]
    for protocol in dict.fromkeys(f.path.split("://", 1)[0] for f in remote):
        group = [f for f in remote if f.path.startswith(f"{protocol}://")]
        probes.update(zip((f.path for f in group), probe_remote(group, concat_dim)))
    local = [(f.path, f.nbytes) for f in files if not is_remote(f.path)]
    probes.update(zip((path for path, _ in local), probe_local_files(local, concat_dim, wanted)))
    return [probes[f.path] for f in files]


def _like(
    reference: FileInfo, probe: FileProbe, concat_dim: str, values: np.ndarray | None, shared: dict | None = None
) -> FileInfo:
    """A probed file's info: the reference's variables and grid, its own size and concat coordinate.

    ``shared``: coordinate attributes made for earlier files, reused where equal (thousands of files
    have a few kinds; nothing modifies them).
    """
    coords, coord_attrs = dict(reference.coords), dict(reference.coord_attrs)
    if values is not None:
        coords[concat_dim] = values
        # Its own units and calendar: files of one structure may count time differently.
        own = {k: probe.concat_attrs[k] for k in _TIME_ATTRS if k in probe.concat_attrs}
        shared = {} if shared is None else shared
        key = (id(reference), repr(sorted(own.items())))
        if key not in shared:
            attrs = {k: v for k, v in coord_attrs.get(concat_dim, {}).items() if k not in _TIME_ATTRS}
            shared[key] = coord_attrs | {concat_dim: attrs | own}
        coord_attrs = shared[key]
    return dataclasses.replace(
        reference, path=probe.path, nbytes=probe.nbytes, sizes=probe.sizes, coords=coords, coord_attrs=coord_attrs
    )


_TIME_ATTRS = ("units", "calendar")


def inspect_files(
    files: list[ListedFile], concat_dim: str, probes: list | None = None, decoding: TimeDecoding = AS_STATED
) -> list[FileInfo]:
    """Every file's info: in full (through xarray) for the first file of each structure, probed for the rest.

    ``probes``: the files' probes if already made (probe_files). The netCDF and HDF5 C libraries
    are not thread-safe, so local files are read one after another.
    """
    if probes is None:
        probes = probe_files(files, concat_dim)
    full: dict[str, FileInfo] = {}  # by fingerprint
    infos: list[FileInfo | None] = []
    probed: list[tuple[int, FileProbe]] = []
    for listed, probe in zip(files, probes):
        path = listed.path
        if probe is None or probe.fingerprint not in full:
            info = inspect_file(path, decoding)
            if probe is not None:
                full[probe.fingerprint] = info
            infos.append(info)
            continue
        if probe.classic and not is_remote(path):  # a remote classic probe checked it from the header
            check_not_truncated(path)
        probed.append((len(infos), probe))
        infos.append(None)
    values = decode_concat_values([probe for _, probe in probed], concat_dim, decoding)
    shared: dict = {}
    for (index, probe), decoded in zip(probed, values):
        infos[index] = _like(full[probe.fingerprint], probe, concat_dim, decoded, shared)
    return infos


def _check_new_dim_name(infos: list[FileInfo], new_dim: NewDimConfig) -> None:
    """Refuse a new dim named as a dim or variable the files already have: the two would be taken for one."""
    for info in infos:
        if new_dim.name in info.sizes:
            what = "a dim"
        elif new_dim.name in info.variables or new_dim.name in info.coordinates:
            what = "a variable"
        else:
            continue
        raise UserError(
            f"input.new_dim.name: {new_dim.name!r} is already {what} of {info.path}; give the new dim another name "
            "(e.g. member)"
        )


def _same_member(value, new_dim: NewDimConfig) -> str:
    """The fix when two files of one member overlap: the pattern reads both as that member."""
    return (
        f"both read as {new_dim.name} {value!r} by input.new_dim.from ({new_dim.pattern!r}): make its group capture "
        "the part of the names that tells members apart, or remove one of the files"
    )


#: The fix when two files overlap along the concat dim without input.new_dim.
_OVERLAP_FIX = (
    "the same steps twice would duplicate samples: remove one of the files (or, for ensemble members "
    "one per file, join them along a new dim with input.new_dim)"
)


def _order(
    infos: list[FileInfo], concat_dim: str, overlap_fix: str = _OVERLAP_FIX
) -> tuple[list[FileInfo], np.ndarray]:
    if any(concat_dim not in info.coords for info in infos):
        if len(infos) > 1:
            missing = next(i.path for i in infos if concat_dim not in i.coords)
            raise UserError(
                f"{missing}: dim {concat_dim!r} has no coordinate variable, so the files cannot be put in order; "
                "add the coordinate or pass a single file"
            )
        return infos, np.arange(infos[0].sizes[concat_dim])
    for info in infos:
        _check_increasing(info, concat_dim)
    ordered = sorted((i for i in infos if i.sizes[concat_dim] > 0), key=lambda i: (i.coords[concat_dim][0], i.path))
    if not ordered:
        raise UserError(f"input: every file has an empty {concat_dim!r} dim; there is nothing to sample")
    for before, after in zip(ordered, ordered[1:]):
        if after.coords[concat_dim][0] <= before.coords[concat_dim][-1]:
            raise UserError(
                f"{after.path}: its {concat_dim} range overlaps {before.path} "
                f"(starts at {format_value(after.coords[concat_dim][0])}, "
                f"the other ends at {format_value(before.coords[concat_dim][-1])}); {overlap_fix}"
            )
    return ordered, np.concatenate([i.coords[concat_dim] for i in ordered])


def _join_by_variable(
    infos: list[FileInfo], concat_dim: str, overlap_fix: str = _OVERLAP_FIX
) -> list[tuple[tuple[str, ...], list[FileInfo], np.ndarray]]:
    """The files grouped by the variables they hold (planning.inputs.variable_groups), each group in concat order
    with its steps; the groups checked to cover the same steps."""
    lanes = [(names, *_order(files, concat_dim, overlap_fix)) for names, files in group_by_variables(infos, concat_dim)]
    check_same_steps_of_groups(lanes, concat_dim)
    return lanes


def _check_same_groups(per_member: list, dim: str) -> None:
    """Refuse members whose files hold the variables in other groups: each member needs every variable's files."""
    (first_value, first_lanes), names = per_member[0], [lane[0] for lane in per_member[0][1]]
    for value, lanes in per_member[1:]:
        if [lane[0] for lane in lanes] != names:
            theirs = sorted({n for lane in lanes for n in lane[0]})
            ours = sorted(n for group in names for n in group)
            raise UserError(
                f"input.new_dim: {dim} {value} ({lanes[0][1][0].path}) has files of {theirs} but {dim} {first_value} "
                f"({first_lanes[0][1][0].path}) of {ours}, grouped otherwise; every {dim} needs the same variables "
                "in the same files: add the missing files, or narrow input.paths"
            )


def _check_groups_grid(inventory: Inventory, tolerance: str | float) -> None:
    """Each group's grid is the first group's: its variables are joined to the others' cell by cell."""
    if inventory.groups is None:
        return
    reference = inventory.reference
    for info in inventory.groups.references[1:]:
        _check_grid(
            info, reference, sorted((set(info.sizes) & set(reference.sizes)) - {inventory.concat_dim}), tolerance
        )


def _one_calendar(infos: list[FileInfo], concat_dim: str) -> list[FileInfo]:
    """Refuse files whose times are in different calendars: their dates do not compare, nor do their steps.

    Files of the Gregorian calendars that xarray decoded some to numpy datetimes and some to
    cftime dates (those before 1582, or beyond numpy's range) are all given as cftime dates.
    """
    found = {}  # calendar -> the first file in it
    for info in infos:
        values = info.coords.get(concat_dim)
        calendar = None if values is None or not len(values) else calendar_of(values)
        if calendar is not None:
            found.setdefault(calendar, info)
    if len(found) < 2:
        return infos
    dated = [c for c in found if c != "datetime64"]
    if len(found) == 2 and len(dated) == 1 and dated[0] in GREGORIAN:
        return [_as_cftime(info, concat_dim, dated[0]) for info in infos]
    (a, first), (b, second) = list(found.items())[:2]
    raise UserError(
        f"input: {first.path} uses calendar {_stated(first, concat_dim, a)!r} but {second.path} uses "
        f"{_stated(second, concat_dim, b)!r}; dates of two calendars do not compare: convert the files to one "
        "calendar (cdo setcalendar, or xarray's convert_calendar), or set input.calendar if their attribute is wrong"
    )


def _stated(info: FileInfo, concat_dim: str, calendar: str) -> str:
    """A file's calendar as cftime names it; for numpy datetimes, as the file states it."""
    if calendar != "datetime64":
        return calendar
    return str(info.coord_attrs.get(concat_dim, {}).get("calendar", "standard"))


def _as_cftime(info: FileInfo, concat_dim: str, calendar: str) -> FileInfo:
    values = info.coords.get(concat_dim)
    if values is None or values.dtype.kind != "M":
        return info
    return dataclasses.replace(info, coords={**info.coords, concat_dim: as_cftime(values, calendar)})


def unstated_calendar(inventory: Inventory, decoding: TimeDecoding) -> tuple[str, ...]:
    """The files whose times along the concat dim state no calendar, so are read in CF's default, standard.

    None when input.calendar names one for every file, or times are not decoded.
    """
    if not decoding.enabled or decoding.calendar is not None:
        return ()
    attrs = [(info.path, info.coord_attrs.get(inventory.concat_dim, {})) for info in inventory.all_files]
    return tuple(path for path, a in attrs if is_time(a) and "calendar" not in a)


def _one_unit(infos: list[FileInfo], concat_dim: str) -> list[FileInfo]:
    """Refuse files whose undecoded times count in different units: their numbers do not compare."""
    units = {}
    for info in infos:
        if concat_dim in info.coords:
            units.setdefault(str(info.coord_attrs.get(concat_dim, {}).get("units", "")), info)
    if len(units) > 1 and any(is_time({"units": u}) for u in units):
        (a, first), (b, second) = list(units.items())[:2]
        raise UserError(
            f"input: {first.path} counts {concat_dim} in {a!r} but {second.path} in {b!r}, and with "
            "input.decode_times: false the stored numbers are compared as they are; convert the files to one "
            "unit, or decode times"
        )
    return infos


def _no_concat_dim(info: FileInfo, concat_dim: str) -> UserError:
    """Why a file has no concat dim, and the fix: a grouped file, a plain HDF5 file, or another dim's name."""
    groups = _groups(info.path)
    if groups:
        return UserError(
            f"{info.path}: its variables are in groups ({', '.join(groups[:5])}), and only the root group is read; "
            "write the group you need to a file of its own (xr.open_dataset(path, group=...).to_netcdf(...))"
        )
    dims = list(info.sizes)
    if dims and all(d.startswith("phony_dim_") for d in dims):
        return UserError(
            f"{info.path}: a plain HDF5 file, not NetCDF: its datasets have no named dims (read as "
            f"{', '.join(dims[:3])}); write it as NetCDF with named dims (xarray: to_netcdf) first"
        )
    return UserError(
        f"{info.path}: has no dim {concat_dim!r} (its dims: {', '.join(dims) or 'none'}); "
        "set input.concat_dim to the dim the files are split along"
    )


def _groups(path: str) -> list[str]:
    """The groups of a NetCDF-4 file ("/forecast", ...), if it has any; [] for anything else."""
    try:
        import h5py

        with NETCDF_LOCK, fsspec.open(path, "rb") as stream, h5py.File(stream, "r") as file:
            found: list[str] = []
            file.visit(lambda name: found.append(f"/{name}") if isinstance(file[name], h5py.Group) else None)
            return found
    except Exception:  # not HDF5, unreadable: no groups to name
        return []


def _check_increasing(info: FileInfo, concat_dim: str) -> None:
    """Refuse a concat coordinate that misses a value, decreases or repeats inside a file, naming where and the fix."""
    values = info.coords[concat_dim]
    check_no_missing(info.path, concat_dim, values)  # with decode_times: false, or NaT from a fill value
    if len(values) < 2:
        return
    steps = values[1:] > values[:-1]
    if steps.all():
        return
    at = int(np.flatnonzero(~steps)[0]) + 1
    here, before = format_value(values[at]), format_value(values[at - 1])
    if values[at] == values[at - 1]:
        raise UserError(
            f"{info.path}: {concat_dim!r} repeats {here} at index {at}; drop the duplicate steps first "
            f"(xarray: ds.drop_duplicates({concat_dim!r}))"
        )
    raise UserError(
        f"{info.path}: {concat_dim!r} decreases at index {at} ({here} after {before}); the steps must increase: "
        f"sort them first (xarray: ds.sortby({concat_dim!r}))"
    )


def _check_static_files(inventory: Inventory, tolerance: str | float) -> None:
    seen = {name: info.path for info in reversed(inventory.references) for name in info.variables}
    for info in inventory.static_files:
        for name in info.variables:
            if name in seen:
                raise UserError(
                    f"{info.path}: variable {name!r} is also in {seen[name]}; a static variable must come from one file"
                )
            seen[name] = info.path
        _check_grid(info, inventory.reference, set(info.sizes) & set(inventory.reference.sizes), tolerance)


def _check_grid(info: FileInfo, reference: FileInfo, dims: Iterable[str], tolerance: str | float) -> None:
    """The file's grid is the reference's: same sizes, coordinates equal within ``tolerance``.

    Where they differ within it, the reference's values are the ones recorded and sampled by.
    """
    for dim in dims:
        if info.sizes.get(dim) != reference.sizes.get(dim):
            raise UserError(
                f"{info.path}: dim {dim!r} has size {info.sizes.get(dim)} but {reference.sizes.get(dim)} in "
                f"{reference.path}; the files' grids must match"
            )
        both = dim in reference.coords and dim in info.coords
        found = coordinate_mismatch(info.coords[dim], reference.coords[dim], tolerance) if both else None
        if found is None:
            continue
        values = f"{format_value(found.value)} vs {format_value(found.reference)}"
        if found.difference is None:
            raise UserError(
                f"{info.path}: {dim!r} coordinate values differ from {reference.path} (at index {found.index}: "
                f"{values}); the files' grids must match (regrid them first)"
            )
        raise UserError(
            f"{info.path}: {dim!r} differs from {reference.path} by up to {found.difference:.2g} (at index "
            f"{found.index}: {values}); files join when coordinates agree within input.coord_tolerance "
            f"(now {describe_tolerance(tolerance, found.allowed)}): raise it or regrid"
        )


#: CF's other names of one calendar.
_CALENDAR_ALIASES = {"gregorian": "standard", "365_day": "noleap", "366_day": "all_leap"}


def _meaning(variable: VariableInfo) -> dict[str, Any]:
    """The attributes that say what a variable's decoded values mean, normalised: for numbers their ``units``; for
    times decoded to dates their ``calendar`` (their units differ harmlessly: each file's decode with its own)."""
    kind = np.dtype(variable.dtype).kind
    if kind in "Mm":  # numpy dates and durations: a Gregorian calendar, units decoded away
        return {}
    calendar = variable.attrs.get("calendar")
    if kind == "O" and calendar is not None:  # cftime dates
        name = str(calendar).strip().lower()
        return {"calendar": _CALENDAR_ALIASES.get(name, name)}
    units = variable.attrs.get("units")
    return {"units": units.strip() if isinstance(units, str) else units}


def _check_same_meaning(variable: VariableInfo, path: str, other: VariableInfo, other_path: str) -> None:
    """UserError where one variable's values mean another thing in two files (K and degC): joined, they would be
    wrong numbers under one name. ``scale_factor`` and ``add_offset`` may differ: decoding applies each file's."""
    mine, theirs = _meaning(variable), _meaning(other)
    for key in sorted(set(mine) | set(theirs)):
        if mine.get(key) != theirs.get(key):
            raise UserError(
                f"{other_path}: variable {variable.name!r} has {key} {_shown(theirs.get(key))} but "
                f"{_shown(mine.get(key))} in {path}; its values would join under one name with two meanings: "
                "convert the files to one (e.g. with cdo or xarray), or leave one out of input.paths"
            )


def _shown(value: Any) -> str:
    return "none" if value is None else repr(value)


def check_variables_agree(
    inventory: Inventory, variables: list[VariableInfo], tolerance: str | float = "float32"
) -> None:
    """Every variable along the concat dim is in every file with the same dims, dtype and units (calendar, for
    dates); grids match (coordinates within ``tolerance``, input.coord_tolerance)."""
    reference, groups = inventory.reference, inventory.groups
    count = 1 if groups is None else len(groups.names)
    dims = {d for v in variables for d in v.dims} - {inventory.concat_dim}
    for lane, infos in enumerate(inventory.lanes()):
        group_reference = inventory.references[lane % count]
        along = [
            group_reference.variables[v.name]
            for v in variables
            if inventory.concat_dim in v.dims and (groups is None or groups.group_of(v.name) == lane % count)
        ]
        for info in infos:
            if info is reference:
                continue
            for var in along:
                other = info.variables.get(var.name)
                if other is None:
                    raise UserError(f"{info.path}: variable {var.name!r} is missing; every input file needs it")
                if other.dims != var.dims or other.dtype != var.dtype:
                    raise UserError(
                        f"{info.path}: variable {var.name!r} is {other.dtype} ({', '.join(other.dims)}) but "
                        f"{var.dtype} ({', '.join(var.dims)}) in {group_reference.path}; all files must agree"
                    )
                if other is not var:  # (files probed alike share their reference's variables)
                    _check_same_meaning(var, group_reference.path, other, info.path)
            _check_grid(info, reference, sorted(dims & set(reference.sizes)), tolerance)
