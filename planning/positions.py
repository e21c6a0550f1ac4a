"""Per-sample position features (split, index/<dim>, coord/<dim>) computed from grid positions alone.

Cutting a unit and laying out the shards before any data is read both need them, so they are
one small spec with two functions of the positions.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from planning.run.contracts import coord_feature, index_feature
from planning.sampling import SampleGrid


@dataclasses.dataclass(frozen=True, eq=False)
class Positions:
    """The sample grid and what each grid position means: its split, its coordinate values."""

    grid: SampleGrid
    concat_dim: str
    #: per position along the split dim, the index of its split, or -1: no sample there;
    #: None when every position makes samples of the one split
    split_of_position: np.ndarray | None
    #: record-ready coordinate values (int64 or float32) along each grid dim that has them
    coords: dict[str, np.ndarray]
    split_dim: str | None = None  # the dim splits range along (None: the concat dim)
    #: when the splits range along another dim (input.new_dim): per position along the concat
    #: dim, whether its samples would join steps across a gap (they make none); None: none do
    across_gap: np.ndarray | None = None

    def split_labels(self, positions: list[np.ndarray]) -> np.ndarray:
        """Each sample's split index, or -1 for samples that belong to none."""
        dims = [a.dim for a in self.grid.grid_axes]
        labels = np.zeros(len(positions[0]) if positions else 1, dtype=np.int16)
        if self.split_of_position is not None:
            labels = self.split_of_position[positions[dims.index(self.split_dim or self.concat_dim)]]
        if self.across_gap is not None:
            labels = np.where(self.across_gap[positions[dims.index(self.concat_dim)]], np.int16(-1), labels)
        return labels

    def columns(self, positions: list[np.ndarray]) -> dict[str, tuple[tuple[str, ...], np.ndarray]]:
        """{feature name: (dims after the sample dim, values)} of the index/* and coord/* features."""
        columns: dict[str, tuple[tuple[str, ...], np.ndarray]] = {}
        for axis, where in zip(self.grid.grid_axes, positions):
            columns[index_feature(axis.dim)] = ((), axis.first_index(where).astype(np.int64))
            if axis.dim in self.coords:
                values = self.coords[axis.dim]
                if axis.role == "iterate":
                    columns[coord_feature(axis.dim)] = ((), values[axis.first_index(where)])
                else:
                    columns[coord_feature(axis.dim)] = ((axis.dim,), values[axis.element_indices(where)])
        return columns
