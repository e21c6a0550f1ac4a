"""sample.time_features: each step's progress through its year and day, as sin and cos features (GraphCast's).

``year_progress = (seconds since 1970-01-01 / (365.24219 * 86400)) mod 1`` and ``day_progress =
(seconds since 1970-01-01 mod 86400) / 86400``, the latter per longitude of the sample (``+ lon /
360``, mod 1: local solar time) where the sample holds a range of longitudes (a window of them, or
all). Seconds count in the concat dim's own calendar (a noleap year has 365 days of them), from the
record-ready times planning already makes (planning.inputs.coords.record_values). Each progress is
written as ``time_features/<name>_sin`` and ``_cos`` (of 2 pi times it), float32, so a model sees a
continuous cycle.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np

from planning.inputs.coords import TIME_UNITS
from planning.sampling import SampleGrid
from schemas.errors import UserError
from schemas.schema import Feature

SECONDS_PER_DAY = 86400
DAYS_PER_YEAR = 365.24219  # the tropical year, as GraphCast divides by
NAMES = ("year_progress", "day_progress")
ROLE = "time_feature"
#: What a dim must be called (or its coordinate's units or standard name) to be taken as longitude.
_LONGITUDE_NAMES = ("lon", "longitude", "x_lon", "nav_lon")


def feature_name(progress: str, function: str) -> str:
    return f"time_features/{progress}_{function}"


@dataclasses.dataclass(frozen=True, eq=False)
class TimeFeatures:
    """The configured progresses, the concat dim they are of, and the sample's longitudes for day_progress."""

    names: tuple[str, ...]
    concat_dim: str
    lon_dim: str | None = None  # a dim of the sample holding a range of longitudes (window or keep)
    lon_values: np.ndarray | None = None  # float64 degrees along lon_dim (on the selected grid), whole

    def features(self, grid: SampleGrid) -> list[Feature]:
        concat = grid.axis(self.concat_dim)
        steps = ((), ()) if concat.role == "iterate" else ((len(concat.steps),), (self.concat_dim,))
        out = []
        for name in self.names:
            (shape, dims), source = steps, {"progress": name, "dim": self.concat_dim}
            if name == "day_progress" and self.lon_dim is not None:
                shape, dims = (*shape, len(grid.axis(self.lon_dim).steps)), (*dims, self.lon_dim)
                source["longitude"] = self.lon_dim  # local solar time: + lon / 360
            out.extend(Feature(feature_name(name, f), "float32", shape, dims, ROLE, source) for f in ("sin", "cos"))
        return out

    def columns(
        self, grid: SampleGrid, positions: Sequence[np.ndarray], seconds: np.ndarray
    ) -> dict[str, tuple[tuple[str, ...], np.ndarray]]:
        """{feature name: (dims after the sample dim, values)}; ``seconds``: int64 seconds since 1970 of every
        step of the concat dim (on the selected grid), ``positions``: the samples' grid positions."""
        dims = [a.dim for a in grid.grid_axes]
        concat = grid.axis(self.concat_dim)
        where = positions[dims.index(self.concat_dim)]
        if concat.role == "iterate":
            steps, step_dims = seconds[concat.first_index(where)], ()
        else:
            steps, step_dims = seconds[concat.element_indices(where)], (self.concat_dim,)
        steps = steps.astype(np.float64)
        out = {}
        for name in self.names:
            out_dims: tuple[str, ...] = step_dims
            if name == "year_progress":
                progress = np.mod(steps / (DAYS_PER_YEAR * SECONDS_PER_DAY), 1.0)
            else:
                progress = np.mod(steps, SECONDS_PER_DAY) / SECONDS_PER_DAY
                if self.lon_dim is not None:
                    lon = self._longitudes(grid, positions, dims)
                    # (samples, [steps,] lon): each step at each of the sample's longitudes
                    lon = lon.reshape(len(lon), *([1] * (progress.ndim - 1)), lon.shape[-1])
                    progress = np.mod(progress[..., None] + lon / 360.0, 1.0)
                    out_dims = (*step_dims, self.lon_dim)
            angle = 2 * np.pi * progress
            out[feature_name(name, "sin")] = (out_dims, np.sin(angle).astype(np.float32))
            out[feature_name(name, "cos")] = (out_dims, np.cos(angle).astype(np.float32))
        return out

    def _longitudes(self, grid: SampleGrid, positions: Sequence[np.ndarray], dims: list[str]) -> np.ndarray:
        """Each sample's longitudes, (samples, lon)."""
        axis = grid.axis(self.lon_dim)
        count = len(positions[0]) if positions else 1
        if axis.role == "keep":
            return np.broadcast_to(self.lon_values, (count, len(self.lon_values)))
        return self.lon_values[axis.element_indices(positions[dims.index(self.lon_dim)])]


def plan_time_features(
    names: Sequence[str],
    grid: SampleGrid,
    concat_dim: str,
    coords: Mapping[str, tuple[np.ndarray, dict]],
    coordinate,
) -> TimeFeatures | None:
    """The time features ``names`` (sample.time_features) asks for, checked against the grid; None for none.

    ``coords``: the grid dims' record-ready coordinates and their info; ``coordinate(dim)``: a dim's
    values and attributes on the selected grid (SelectedDataset.coordinate).
    """
    if not names:
        return None
    grid_dims = [a.dim for a in grid.grid_axes]
    if concat_dim not in grid_dims:
        raise UserError(
            f"sample.time_features: the samples keep {concat_dim!r} whole, so a sample has no steps of its own; "
            f"iterate {concat_dim!r}, or cut it in windows or offsets"
        )
    found = coords.get(concat_dim)
    if found is None or found[1].get("units") != TIME_UNITS:
        raise UserError(
            f"sample.time_features: {concat_dim!r} does not hold decoded times (no coordinate, or "
            "input.decode_times: false, or units that are not a time); time features need dates"
        )
    lon_dim = _longitude_dim(grid, coordinate)
    lon_values = None
    if lon_dim is not None:
        lon_values = np.asarray(coordinate(lon_dim)[0], dtype=np.float64)
    return TimeFeatures(tuple(names), concat_dim, lon_dim, lon_values)


def _longitude_dim(grid: SampleGrid, coordinate) -> str | None:
    """The sample's longitude dim, if it holds a range of them (window or keep) and has a numeric coordinate."""
    for axis in grid.axes:
        if axis.role not in ("window", "keep"):
            continue
        found = coordinate(axis.dim)
        if found is None or np.asarray(found[0]).dtype.kind not in "iuf":
            continue
        attrs = found[1]
        if (
            axis.dim.lower() in _LONGITUDE_NAMES
            or attrs.get("standard_name") == "longitude"
            or str(attrs.get("units", "")).lower() in ("degrees_east", "degree_east", "degrees_e", "degree_e")
        ):
            return axis.dim
    return None
