"""Per-sample position features (split, index/<dim>, coord/<dim>, time features) from grid positions alone.

Cutting a unit and laying out the shards before any data is read both need them, so they are
one small spec with two functions of the positions.
"""

from __future__ import annotations

import dataclasses
import io

import numpy as np

from planning.run.contracts import coord_feature, index_feature
from planning.sampling import SampleGrid
from planning.time_features import TimeFeatures


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
    #: the arrays above were left out (``hollow``): a worker loads them from the run's file (``filled``)
    is_hollow: bool = False
    #: sample.time_features, computed from the concat dim's coordinate (None: none configured)
    time_features: TimeFeatures | None = None

    def to_bytes(self) -> bytes:
        """The per-position arrays (splits, gaps, coordinates): what grows with the grid, saved for the workers."""
        arrays = {f"coord_{i}": self.coords[a.dim] for i, a in enumerate(self.grid.grid_axes) if a.dim in self.coords}
        if self.split_of_position is not None:
            arrays["split_of_position"] = self.split_of_position
        if self.across_gap is not None:
            arrays["across_gap"] = self.across_gap
        buffer = io.BytesIO()
        np.savez(buffer, **arrays)
        return buffer.getvalue()

    def hollow(self) -> Positions:
        """These positions without their arrays: what the job graph carries when they are saved in a file."""
        return dataclasses.replace(self, split_of_position=None, coords={}, across_gap=None, is_hollow=True)

    def filled(self, data: bytes) -> Positions:
        """These (hollow) positions with the arrays ``to_bytes`` saved."""
        with np.load(io.BytesIO(data), allow_pickle=False) as arrays:
            coords = {a.dim: arrays[f"coord_{i}"] for i, a in enumerate(self.grid.grid_axes) if f"coord_{i}" in arrays}
            labels = arrays.get("split_of_position")
            gap = arrays.get("across_gap")
        return dataclasses.replace(self, split_of_position=labels, coords=coords, across_gap=gap, is_hollow=False)

    def _check_filled(self) -> None:
        if self.is_hollow:
            raise RuntimeError("positions used before their arrays were loaded from the run's file (Positions.filled)")

    def split_labels(self, positions: list[np.ndarray]) -> np.ndarray:
        """Each sample's split index, or -1 for samples that belong to none."""
        self._check_filled()
        dims = [a.dim for a in self.grid.grid_axes]
        labels = np.zeros(len(positions[0]) if positions else 1, dtype=np.int16)
        if self.split_of_position is not None:
            labels = self.split_of_position[positions[dims.index(self.split_dim or self.concat_dim)]]
        if self.across_gap is not None:
            labels = np.where(self.across_gap[positions[dims.index(self.concat_dim)]], np.int16(-1), labels)
        return labels

    def columns(self, positions: list[np.ndarray]) -> dict[str, tuple[tuple[str, ...], np.ndarray]]:
        """{feature name: (dims after the sample dim, values)} of the index/* and coord/* features."""
        self._check_filled()
        columns: dict[str, tuple[tuple[str, ...], np.ndarray]] = {}
        for axis, where in zip(self.grid.grid_axes, positions):
            columns[index_feature(axis.dim)] = ((), axis.first_index(where).astype(np.int64))
            if axis.dim in self.coords:
                values = self.coords[axis.dim]
                if axis.role == "iterate":
                    columns[coord_feature(axis.dim)] = ((), values[axis.first_index(where)])
                else:
                    columns[coord_feature(axis.dim)] = ((axis.dim,), values[axis.element_indices(where)])
        if self.time_features is not None:
            columns.update(self.time_features.columns(self.grid, positions, self.coords[self.concat_dim]))
        return columns
