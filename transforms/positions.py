"""Per-sample position features (split, index/<dim>, coord/<dim>) computed from grid positions alone.

Cutting a unit and laying out the shards before any data is read both need them, so they are
one function of the plan and the positions.
"""

from __future__ import annotations

import numpy as np

from transforms.plan import BuildPlan


def split_labels(plan: BuildPlan, positions: list[np.ndarray]) -> np.ndarray:
    """Each sample's split index, or -1 for samples that belong to none."""
    if plan.position_split is None:
        return np.zeros(len(positions[0]) if positions else 1, dtype=np.int16)
    which = [a.dim for a in plan.grid.grid_axes].index(plan.concat_dim)
    return plan.position_split[positions[which]]


def position_columns(plan: BuildPlan, positions: list[np.ndarray]) -> dict[str, tuple[tuple[str, ...], np.ndarray]]:
    """{feature name: (dims after the sample dim, values)} of the index/* and coord/* features."""
    columns: dict[str, tuple[tuple[str, ...], np.ndarray]] = {}
    for axis, where in zip(plan.grid.grid_axes, positions):
        columns[f"index/{axis.dim}"] = ((), axis.first_index(where).astype(np.int64))
        if axis.dim in plan.coords:
            values = plan.coords[axis.dim]
            if axis.role == "iterate":
                columns[f"coord/{axis.dim}"] = ((), values[axis.first_index(where)])
            else:
                columns[f"coord/{axis.dim}"] = ((axis.dim,), values[axis.element_indices(where)])
    return columns
