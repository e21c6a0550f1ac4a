"""A selected variable and a stack of them as readers get them: small enough to import without the plan."""

from __future__ import annotations

import dataclasses

from schemas.schema import Feature


@dataclasses.dataclass(frozen=True)
class VariablePlan:
    """A selected data variable: its dims in the files, the feature it becomes, where it is read."""

    name: str
    dims: tuple[str, ...]
    dtype: str  # after CF decoding, as read
    feature: Feature  # its own feature (also when it is written inside a stack)
    static_path: str | None = None  # variables without the concat dim are read from this file


@dataclasses.dataclass(frozen=True)
class StackPlan:
    """Variables written together as one feature with a channel axis."""

    feature: Feature
    variables: tuple[str, ...]
    axis: int  # 0 (channels first) or -1 (channels last)
