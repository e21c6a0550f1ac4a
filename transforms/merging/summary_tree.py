"""The statistics' merge as a fixed tree (units, groups of units, branches of groups), each node folded once whole.

Float additions depend on their order, so the summaries of the units are merged in one fixed
order whatever order a runner delivers them in: a group's parts in (unit, piece) order, a
branch's groups in group order, then the branches in order. In a build, Beam's GroupByKeys
gather each group and then each branch (transforms.stats.MergeBranches), so no step holds more
than 256 parts or groups, and the final combine holds one summary a branch (``add_branch``): at
ARCO-ERA5's 49.2M units, ~750 branches instead of 192k groups (1.6 GB with per-level
statistics) or 49.2M unit summaries (30-41 GB). A tree fed parts (``add_part``) folds each node
once whole, in the same order: the reference the merge is tested against. Up to UNITS_PER_GROUP
* GROUPS_PER_BRANCH units there is one branch, and the result is the fold of the groups in order.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from typing import Any

#: Units whose summaries are merged together, in unit (and piece) order.
UNITS_PER_GROUP = 256
#: Groups whose merged summaries are merged together, in group order, before the branches are.
GROUPS_PER_BRANCH = 256

Summary = Any  # what ``merge`` folds: {split: SplitSummary} dicts


@dataclasses.dataclass
class _Group:
    """A group's parts so far ({(unit, piece): summary}), and each unit's number of pieces as its parts say."""

    parts: dict[tuple[int, int], Summary] = dataclasses.field(default_factory=dict)
    pieces: dict[int, int] = dataclasses.field(default_factory=dict)
    expected: int = 0  # parts the units seen so far have in all

    def add(self, unit: int, piece: int, pieces: int, summary: Summary) -> None:
        if unit not in self.pieces:
            self.pieces[unit] = pieces
            self.expected += pieces
        self.parts[(unit, piece)] = summary

    def whole(self, units: int) -> bool:
        return len(self.pieces) == units and len(self.parts) == self.expected


@dataclasses.dataclass
class SummaryTree:
    """Summaries merged in the fixed tree, holding a bounded number at once when ``units`` (their count) is known.

    ``merge``: folds a list of summaries, in the order given (transforms.stats.merge_by_name).
    ``units``: how many units the build has (0: unknown: every node is folded at the end, the same way).
    """

    merge: Callable[[Iterable[Summary]], Summary]
    units: int = 0
    groups: dict[int, _Group] = dataclasses.field(default_factory=dict)
    branches: dict[int, dict[int, Summary]] = dataclasses.field(default_factory=dict)
    folded: dict[int, Summary] = dataclasses.field(default_factory=dict)

    def add_part(self, group: int, unit: int, piece: int, pieces: int, summary: Summary) -> None:
        """One block's summary: the ``piece``-th of its unit's ``pieces``."""
        held = self.groups.setdefault(group, _Group())
        held.add(unit, piece, pieces, summary)
        if self.units and held.whole(self._units_in(group)):
            del self.groups[group]
            self.add_group(group, self._fold_group(held))

    def add_group(self, group: int, summary: Summary) -> None:
        """A group's summary, its parts already merged in order."""
        branch = group // GROUPS_PER_BRANCH
        held = self.branches.setdefault(branch, {})
        held[group] = summary
        if self.units and len(held) == self._groups_in(branch):
            del self.branches[branch]
            self.folded[branch] = self._fold_branch(held)

    def add_branch(self, branch: int, summary: Summary) -> None:
        """A branch's summary, its groups already merged in order."""
        self.folded[branch] = summary

    def absorb(self, other: SummaryTree) -> None:
        """Another tree's summaries (of other parts) added to this one's."""
        for group, held in other.groups.items():
            for (unit, piece), summary in held.parts.items():
                self.add_part(group, unit, piece, held.pieces[unit], summary)
        for held in other.branches.values():
            for group, summary in held.items():
                self.add_group(group, summary)
        self.folded.update(other.folded)

    def result(self) -> Summary:
        """Every summary merged in the tree's order (the same whatever was folded before)."""
        for group in sorted(self.groups):
            branch = self.branches.setdefault(group // GROUPS_PER_BRANCH, {})
            branch[group] = self._fold_group(self.groups[group])
        folded = dict(self.folded)
        for branch, held in self.branches.items():
            folded[branch] = self._fold_branch(held)
        return self.merge(folded[branch] for branch in sorted(folded))

    @property
    def held(self) -> int:
        """Summaries held: parts, groups and folded branches."""
        return (
            sum(len(g.parts) for g in self.groups.values()) + sum(map(len, self.branches.values())) + len(self.folded)
        )

    def _fold_group(self, held: _Group) -> Summary:
        return self.merge(held.parts[key] for key in sorted(held.parts))

    def _fold_branch(self, held: Mapping[int, Summary]) -> Summary:
        return self.merge(held[group] for group in sorted(held))

    def _units_in(self, group: int) -> int:
        return min(UNITS_PER_GROUP, self.units - group * UNITS_PER_GROUP)

    def _groups_in(self, branch: int) -> int:
        groups = -(-self.units // UNITS_PER_GROUP)
        return min(GROUPS_PER_BRANCH, groups - branch * GROUPS_PER_BRANCH)
