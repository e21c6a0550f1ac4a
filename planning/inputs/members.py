"""input.new_dim: files otherwise alike (ensemble members) grouped by a value read from their names.

Each group (a member: one file, or a run of files along the concat dim) becomes one index of
a new dim. Members must cover the same concat steps and hold the same variables on the same
grid, so the virtual dataset is the members stacked along the new dim, which comes first in
every variable along the concat dim.
"""

from __future__ import annotations

import dataclasses
import posixpath
import re
from collections.abc import Sequence

import numpy as np
import regex

from planning.inputs.coords import format_value
from planning.inputs.input_config import NewDimConfig
from planning.inputs.metadata import FileInfo
from schemas.errors import UserError


@dataclasses.dataclass(frozen=True, eq=False)
class Members:
    """The new dim: its coordinate values in order, and each member's files in concat order."""

    dim: str
    pattern: str
    values: np.ndarray  # int64 where every name's match reads as an integer, else str
    files: tuple[tuple[FileInfo, ...], ...]

    def to_json(self) -> dict:
        """schema.json's record of where the dim came from."""
        return {"from": self.pattern, "values": self.values.tolist()}


#: A search in a file name takes microseconds; one that runs this long backtracks without end
#: (nested quantifiers such as (a|aa)+), which Python's re cannot interrupt: the regex module can.
SEARCH_SECONDS = 0.5


def _search(pattern: regex.Pattern, name: str, new_dim: NewDimConfig) -> regex.Match | None:
    try:
        return pattern.search(name, timeout=SEARCH_SECONDS)
    except TimeoutError:
        raise UserError(
            f"input.new_dim.from: {new_dim.pattern!r} takes over {SEARCH_SECONDS} s to search the file name "
            f"{name!r} (nested repeats such as (a|aa)+ backtrack without end); simplify the pattern, e.g. "
            r"'_r(\d+)_'"
        ) from None


def group_by_member(infos: Sequence[FileInfo], new_dim: NewDimConfig) -> list[tuple[object, list[FileInfo]]]:
    """The files grouped by the value ``new_dim.from`` reads from their names, in value order."""
    pattern = regex.compile(new_dim.pattern)
    found: dict[str, list[FileInfo]] = {}
    for info in infos:
        name = posixpath.basename(info.path.rstrip("/"))
        match = _search(pattern, name, new_dim)
        if match is None or match.group(1) is None:
            raise UserError(
                f"{info.path}: its name does not match input.new_dim.from ({new_dim.pattern!r}), so it belongs to "
                f"no {new_dim.name}; fix the pattern or leave the file out of input.paths"
            )
        found.setdefault(match.group(1), []).append(info)
    texts = list(found)
    if all(re.fullmatch(r"[+-]?\d+", t) for t in texts):
        by_number: dict[int, str] = {}
        for text in texts:
            number = int(text)
            if number in by_number:
                raise UserError(
                    f"input.new_dim: {found[by_number[number]][0].path} and {found[text][0].path} both read as "
                    f"{new_dim.name} {number} ({by_number[number]!r}, {text!r}); rename one of them"
                )
            by_number[number] = text
        return [(number, found[by_number[number]]) for number in sorted(by_number)]
    return [(text, found[text]) for text in sorted(texts)]


def check_same_steps(members: Sequence[tuple[object, list[FileInfo], np.ndarray]], concat_dim: str, dim: str) -> None:
    """Refuse members that cover different steps along the concat dim: a sample must mean one time for all."""
    first_value, first_files, first_steps = members[0]
    for value, files, steps in members[1:]:
        if len(steps) == len(first_steps) and bool(np.all(steps == first_steps)):
            continue
        extent = f"{len(steps)} steps, {format_value(steps[0])} to {format_value(steps[-1])}"
        reference = f"{len(first_steps)} steps, {format_value(first_steps[0])} to {format_value(first_steps[-1])}"
        if len(steps) == len(first_steps):
            at = int(np.flatnonzero(steps != first_steps)[0])
            extent += f"; step {at} is {format_value(steps[at])}"
            reference += f"; step {at} is {format_value(first_steps[at])}"
        raise UserError(
            f"input.new_dim: {dim} {value} ({files[0].path}) covers {concat_dim} {extent}, but {dim} {first_value} "
            f"({first_files[0].path}) {reference}; every {dim} needs the same {concat_dim} steps: "
            f"add the missing files, or narrow input.paths"
        )


def make_members(dim: str, pattern: str, ordered: Sequence[tuple[object, list[FileInfo], np.ndarray]]) -> Members:
    values = [value for value, _, _ in ordered]
    array = np.array(values, dtype=np.int64 if isinstance(values[0], int) else np.str_)
    return Members(dim, pattern, array, tuple(tuple(files) for _, files, _ in ordered))
