"""Files that hold different variables over the same steps (one variable per file, as CMIP), joined by variable.

An archive in the CMIP and CORDEX layout stores each variable in its own files
(``tas_<table>_<model>_<experiment>_<member>_<period>.nc``, ``uas_...``), each variable split in
periods. Files are grouped by the data variables they hold along the concat dim (CF bounds
variables such as ``time_bnds`` are not data: every group may hold them); each group is a run of
files along the concat dim, and every group must cover the same steps, so the virtual dataset is
the groups merged by variable (xarray's merge). Files that share some variables but not all are
not a join but a file missing (or adding) a variable: they stay one run, as without groups.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from planning.inputs.coords import format_value
from planning.inputs.metadata import FileInfo
from schemas.errors import UserError


@dataclasses.dataclass(frozen=True, eq=False)
class VariableGroups:
    """The groups: each one's data variables along the concat dim, and its files per member, in concat order."""

    names: tuple[tuple[str, ...], ...]
    files: tuple[tuple[tuple[FileInfo, ...], ...], ...]  # [member][group]: that group's files of that member

    def group_of(self, variable: str) -> int:
        return group_of(self.names, variable)

    @property
    def references(self) -> tuple[FileInfo, ...]:
        """Each group's first file (of the first member): where its variables are described."""
        return tuple(files[0] for files in self.files[0])

    def to_json(self) -> list[dict]:
        """schema.json's record of the join: each group's variables and how many files it has."""
        return [
            {"variables": list(names), "files": sum(len(member[i]) for member in self.files)}
            for i, names in enumerate(self.names)
        ]


def group_of(names: Sequence[Sequence[str]], variable: str) -> int:
    """The group whose files hold ``variable`` (0 for what every group holds: bounds, coordinates; and without
    groups)."""
    return next((i for i, group in enumerate(names) if variable in group), 0)


def bounds_variables(info: FileInfo) -> set[str]:
    """The CF bounds variables a file holds: named by a coordinate's ``bounds`` attribute (``time_bnds``)."""
    named = {str(attrs["bounds"]) for attrs in info.coord_attrs.values() if isinstance(attrs.get("bounds"), str)}
    for var in info.coordinates.values():
        if isinstance(var.attrs.get("bounds"), str):
            named.add(var.attrs["bounds"])
    return named & set(info.variables)


def data_along(info: FileInfo, concat_dim: str) -> tuple[str, ...]:
    """The file's data variables along the concat dim, bounds aside, sorted: what groups it."""
    bounds = bounds_variables(info)
    return tuple(sorted(n for n, v in info.variables.items() if concat_dim in v.dims and n not in bounds))


def group_by_variables(infos: Sequence[FileInfo], concat_dim: str) -> list[tuple[tuple[str, ...], list[FileInfo]]]:
    """The files grouped by the data variables they hold along the concat dim, groups in order of their names.

    Only groups of disjoint variables join by variable: where two share one, a file lacks (or has
    an extra) variable, and the files stay one run along the concat dim, checked variable by
    variable for those the config takes (planning.inputs.inventory.check_variables_agree).
    """
    found: dict[tuple[str, ...], list[FileInfo]] = {}
    for info in infos:
        found.setdefault(data_along(info, concat_dim), []).append(info)
    groups = sorted(found.items())
    seen: set[str] = set()
    for names, _ in groups:
        if seen & set(names):
            return [((), list(infos))]
        seen |= set(names)
    return groups


def check_same_steps_of_groups(
    groups: Sequence[tuple[tuple[str, ...], list[FileInfo], np.ndarray]], concat_dim: str
) -> None:
    """Refuse groups that cover different steps: a sample must find every variable at its steps."""
    first_names, first_files, first_steps = groups[0]
    for names, files, steps in groups[1:]:
        if len(steps) == len(first_steps) and bool(np.all(steps == first_steps)):
            continue
        if len(steps) != len(first_steps):
            difference = f"{len(steps)} steps where {_label(first_names)} has {len(first_steps)}"
        else:
            at = int(np.flatnonzero(steps != first_steps)[0])
            difference = f"step {at} at {format_value(steps[at])} where {_label(first_names)} has it at "
            difference += format_value(first_steps[at])
        raise UserError(
            f"{files[0].path}: the files of {_label(names)} cover {concat_dim} {format_value(steps[0])} to "
            f"{format_value(steps[-1])}, {difference} ({first_files[0].path}); variables joined from separate files "
            "need the same steps: add the missing files, or narrow input.paths"
        )


def _label(names: tuple[str, ...]) -> str:
    return ", ".join(repr(n) for n in names) if names else "no data variable"
