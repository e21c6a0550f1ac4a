"""The config's ``select`` resolved on the virtual dataset's coordinates: the selected dataset planning cuts.

Values are matched as the files store them: numbers within a relative 1e-6 (float32 rounding
and decimal text), times at any precision ("1990" is every step in 1990), longitudes modulo
360. A longitude range whose max is below its min crosses the seam (on a global grid): its
west part comes first, so the selected grid runs on across the seam. Value lists keep the
files' order. Bad selections are one line naming the key.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
import xarray as xr

from planning.config.model import BuildConfig, CoordValue, SelectRange
from planning.formats.sources import SourceFile
from planning.inputs.coords import format_value, json_values
from planning.inputs.inventory import Inventory
from planning.inputs.metadata import VariableInfo
from planning.reads.direct_reads import plan_direct_reads
from planning.reads.selection import Selection, runs_of
from planning.reads.source_index import SourceIndex
from planning.run.variables import VariablePlan
from schemas.errors import UserError

#: How far a typed value may be from a stored one, relative to the coordinate's magnitude.
RELATIVE_SLACK = 1e-6

_LONGITUDE_UNITS = {"degrees_east", "degree_east", "degrees_e", "degree_e", "degreese", "degreee"}

#: Values a message lists when a wanted one is missing.
_SHOWN = 5


def is_longitude(dim: str, attrs: dict[str, Any]) -> bool:
    """Whether a coordinate is a longitude (CF units or standard_name; the name when it has no units)."""
    units = str(attrs.get("units", "")).lower().replace(" ", "")
    if attrs.get("standard_name") == "longitude" or units in _LONGITUDE_UNITS:
        return True
    return "units" not in attrs and dim.lower() in ("lon", "longitude")


@dataclasses.dataclass(frozen=True, eq=False)
class SelectedDataset:
    """The virtual dataset after ``select``: sizes and coordinates on the selected grid, and the files it reads."""

    inventory: Inventory
    selection: Selection = dataclasses.field(default_factory=Selection)

    @property
    def concat_dim(self) -> str:
        return self.inventory.concat_dim

    @property
    def sizes(self) -> dict[str, int]:
        return {dim: self.selection.length(dim, n) for dim, n in self.inventory.sizes.items()}

    @property
    def concat_values(self) -> np.ndarray:
        values = self.inventory.concat_values
        return values[self.selection.indices(self.concat_dim, len(values))]

    def coordinate(self, dim: str) -> tuple[np.ndarray, dict] | None:
        """Values and attributes of a dim's coordinate on the selected grid, if it has one."""
        found = self.inventory.coordinate(dim)
        if found is None:
            return None
        values, attrs = found
        return values[self.selection.indices(dim, len(values))], attrs

    def source_files(self) -> list[SourceFile]:
        """The files that hold selected steps, with their ranges along the concat dim of the source."""
        return [f for f, on_grid in self._files() if on_grid.stop > on_grid.start]

    def source_index(self, read: Sequence[VariablePlan] = ()) -> SourceIndex:
        """The files workers read, as the columns they load (planning.reads.source_index); with where in each file
        the variables ``read`` may be read by offset (planning.reads.direct_reads)."""
        members = self.inventory.members
        member_dim = None if members is None else members.dim
        probes = {probe.path: probe for _, probe in self.inventory.probes}
        # Each file's format as probed: workers read it through its format's reader, without telling it again.
        files = [
            dataclasses.replace(f, classic=probes[f.path].classic) if f.path in probes else f
            for f in self.source_files()
        ]
        direct = plan_direct_reads(files, probes, read, self.inventory.sizes, self.concat_dim, member_dim)
        groups = self.inventory.groups
        messages = self.inventory.grib_messages
        grib = None if messages is None else [messages[f.path] for f in files]
        return SourceIndex.of(files, member_dim, direct, () if groups is None else groups.names, grib)

    def files_on_grid(self) -> list[SourceFile]:
        """The same files with their ranges on the selected concat dim (where splits, gaps and units count)."""
        return [on_grid for _, on_grid in self._files() if on_grid.stop > on_grid.start]

    def _files(self) -> list[tuple[SourceFile, SourceFile]]:
        files = self.inventory.source_files()
        if self.concat_dim not in self.selection.runs:
            return [(f, f) for f in files]
        taken = self.selection.indices(self.concat_dim, len(self.inventory.concat_values))
        out = []
        for f in files:
            start, stop = (int(np.searchsorted(taken, bound)) for bound in (f.start, f.stop))
            out.append((f, dataclasses.replace(f, start=start, stop=stop)))
        return out

    def to_json(self) -> dict:
        """schema.json's record of the selection: per dim, the source index runs taken, in order, and the values."""
        out = {}
        for dim, runs in self.selection.runs.items():
            values, _ = self.coordinate(dim)
            first, last = json_values(values[[0, -1]])
            out[dim] = {
                "length": len(values),
                "first": first,
                "last": last,
                "source_index_runs": [list(r) for r in runs],
            }
        return out


def _dims(variables: Sequence[VariableInfo]) -> list[str]:
    return list(dict.fromkeys(d for v in variables for d in v.dims))


def select_dataset(config: BuildConfig, inventory: Inventory, variables: Sequence[VariableInfo]) -> SelectedDataset:
    """The dataset the build cuts samples from: the virtual dataset with ``select`` applied."""
    dims = _dims(variables)
    runs = {}
    for dim, wanted in config.select.items():
        if dim not in dims:
            raise UserError(
                f"select.{dim}: no selected variable has a dim {dim!r} (their dims: {', '.join(dims)}); "
                "fix the dim name"
            )
        found = inventory.coordinate(dim)
        if found is None:
            raise UserError(
                f"select.{dim}: dim {dim!r} has no coordinate variable in {inventory.reference.path}, "
                f"so there are no values to select by; remove select.{dim}"
            )
        runs[dim] = runs_of(resolve(dim, wanted, *found).tolist())
    return SelectedDataset(inventory, Selection(runs))


def resolve(dim: str, wanted: list[CoordValue] | SelectRange, values: np.ndarray, attrs: dict) -> np.ndarray:
    """The source indices ``wanted`` takes along a dim with coordinate ``values``, in the selected grid's order."""
    key = f"select.{dim}"
    times = _time_index(values)
    if isinstance(wanted, SelectRange):
        if times is not None:
            indices = _time_range(key, times, wanted.min, wanted.max)
        elif values.dtype.kind in "fiu":
            indices = _number_range(key, dim, values.astype(np.float64), attrs, wanted)
        else:
            raise UserError(f"{key}: {dim} values are not numbers or times, so a range cannot hold them; list them")
        if not len(indices):
            raise UserError(
                f"{key}: {_range_text(wanted)} holds no {dim} value of the input ({_extent(values)}); fix the range"
            )
        return indices
    taken: set[int] = set()
    for value in wanted:
        if times is not None:
            found = _time_range(key, times, value, value)
        elif values.dtype.kind in "fiu":
            found = _number_matches(key, dim, values.astype(np.float64), attrs, value)
        else:
            found = np.flatnonzero(values.astype(str) == str(value))
        if not len(found):
            raise UserError(f"{key}: {_missing(dim, value, values, times is not None)}")
        taken.update(found.tolist())
    return np.array(sorted(taken), dtype=np.int64)


def _time_index(values: np.ndarray) -> pd.Index | None:
    if values.dtype.kind == "M":
        return pd.DatetimeIndex(values)
    if values.dtype.kind == "O" and len(values) and hasattr(values[0], "calendar"):
        return xr.CFTimeIndex(values)
    return None


def _time_text(value: CoordValue | None) -> str | None:
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # YAML reads an unquoted year as a number
    return None if value is None else str(value)


def _time_range(key: str, times: pd.Index, low: CoordValue | None, high: CoordValue | None) -> np.ndarray:
    """Steps from ``low`` to ``high``, inclusive, each at its own precision ("1990": the whole year)."""
    low, high = _time_text(low), _time_text(high)
    try:
        span = times.slice_indexer(low, high)
    except (ValueError, TypeError, KeyError) as error:
        bounds = {"min": low, "max": high}
        shown = repr(low) if low == high else "{" + ", ".join(f"{k}: {v}" for k, v in bounds.items() if v) + "}"
        raise UserError(f"{key}: cannot read {shown} as times ({error}); write dates like 1990-01-31") from None
    return np.arange(len(times))[span]


def _number(key: str, dim: str, value: CoordValue) -> float:
    try:
        return float(value)
    except ValueError:
        raise UserError(f"{key}: {value!r} is not a number, but {dim} values are numbers") from None


def _slack(values: np.ndarray, *targets: float) -> float:
    return RELATIVE_SLACK * max([float(np.nanmax(np.abs(values), initial=0.0)), *(abs(t) for t in targets)])


def _number_matches(key: str, dim: str, values: np.ndarray, attrs: dict, value: CoordValue) -> np.ndarray:
    target = _number(key, dim, value)
    difference = values - target
    if is_longitude(dim, attrs):
        difference = (difference + 180) % 360 - 180  # -10 is 350
    return np.flatnonzero(np.abs(difference) <= _slack(values, target))


def _number_range(key: str, dim: str, values: np.ndarray, attrs: dict, wanted: SelectRange) -> np.ndarray:
    low = None if wanted.min is None else _number(key, dim, wanted.min)
    high = None if wanted.max is None else _number(key, dim, wanted.max)
    slack = _slack(values, *(b for b in (low, high) if b is not None))
    if low is not None and high is not None:
        if is_longitude(dim, attrs):
            return _longitude_range(key, dim, values, low, high, slack)
        if low > high:
            raise UserError(
                f"{key}: min {low:g} is above max {high:g}, so nothing lies between them (only a longitude range "
                "wraps across the seam); swap them"
            )
    mask = np.ones(len(values), dtype=bool)
    if low is not None:
        mask &= values >= low - slack
    if high is not None:
        mask &= values <= high + slack
    return np.flatnonzero(mask)


def _longitude_range(key: str, dim: str, values: np.ndarray, low: float, high: float, slack: float) -> np.ndarray:
    """Longitudes eastward from ``low`` to ``high``, modulo 360, in the grid's order across its seam."""
    if high - low >= 360 - slack:
        return np.arange(len(values))
    width = (high - low) % 360
    east = (values - low) % 360  # degrees east of low
    mask = (east <= width + slack) | (east >= 360 - slack)
    indices = np.flatnonzero(mask)
    if not len(indices) or mask.all() or not (mask[0] and mask[-1]):
        return indices
    # The range runs off one end of the grid and on at the other: that is the seam on a global
    # grid, so the selection starts after the last longitude left out and runs on across it.
    if not _whole_circle(values):
        raise UserError(
            f"{key}: {{min: {low:g}, max: {high:g}}} takes both ends of {dim} ({_extent(values)}), which is not a "
            "whole circle, so they do not join; select a range inside it"
        )
    start = int(np.flatnonzero(~mask)[-1]) + 1
    return np.concatenate([indices[indices >= start], indices[indices < start]])


def _whole_circle(values: np.ndarray) -> bool:
    """Whether a longitude grid goes round the globe: its last value is one step short of its first + 360."""
    if len(values) < 2:
        return False
    step = float(np.median(np.abs(np.diff(values))))
    return bool(np.isclose(360 - abs(float(values[-1] - values[0])), step, rtol=0.01))


def _range_text(wanted: SelectRange) -> str:
    bounds = {"min": wanted.min, "max": wanted.max}
    shown = {k: f"{v:g}" if isinstance(v, float) else v for k, v in bounds.items() if v is not None}
    return "{" + ", ".join(f"{k}: {v}" for k, v in shown.items()) + "}"


def _extent(values: np.ndarray) -> str:
    if values.dtype.kind in "fiu":
        return f"{format_value(np.nanmin(values))} to {format_value(np.nanmax(values))}"
    return f"{format_value(values[0])} to {format_value(values[-1])}"


def _missing(dim: str, value: CoordValue, values: np.ndarray, is_time: bool) -> str:
    """Why ``value`` selects nothing, with the values nearest it."""
    if is_time:
        return f"{value!r} matches no {dim} step of the input ({_extent(values)}); give a date it has, at any precision"
    if values.dtype.kind in "fiu":
        target = float(value)  # a number: _number_matches read it
        nearest = np.argsort(np.abs(values.astype(np.float64) - target), kind="stable")[:_SHOWN]
        shown = ", ".join(format_value(values[i]) for i in sorted(nearest))
        return f"{target:g} is not a {dim} value of the input; the nearest are {shown} (of {len(values)})"
    shown = ", ".join(format_value(v) for v in values[:_SHOWN])
    return f"{value!r} is not a {dim} value of the input ({shown}{', ...' if len(values) > _SHOWN else ''})"
