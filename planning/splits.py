"""Splits: which positions along the split dim make samples of which split, and which none.

Splits range along the concat dim, or along input.new_dim (ensemble members). A sample
belongs to a split when every step it takes along that dim lies inside the split's range, so
no window or pair straddles a boundary (nothing leaks from test into train). A sample that
would join steps across a gap in the data belongs to no split either, unless the config
makes gaps an error.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from planning.config import BuildConfig
from planning.formats.calendars import calendar_of, date_index
from planning.formats.sources import SourceFile
from planning.inputs.coords import format_value, irregular_steps
from planning.sampling import Axis
from schemas.errors import UserError

DEFAULT_SPLIT = "data"


@dataclasses.dataclass(frozen=True)
class SplitPlan:
    name: str
    start: int  # source index range [start, stop) along the split dim
    stop: int
    num_samples: int = 0
    num_shards: int = 1
    first_shard: int = 0  # shards are numbered across splits: this split's are first_shard, first_shard + 1, ...


def _bound(value, dates: bool):
    if value is None or not dates:
        return value
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # YAML reads an unquoted year as a number
    return str(value)


def _span(values: np.ndarray, low, high) -> slice:
    """The index range of the values in [low, high]: dates at any precision, read in the values' calendar."""
    index = date_index(values)
    if index is not None:
        return index.slice_indexer(low, high)
    if values.dtype.kind not in "US":
        low, high = (None if bound is None else float(bound) for bound in (low, high))
    return slice(
        0 if low is None else int(np.searchsorted(values, low, side="left")),
        len(values) if high is None else int(np.searchsorted(values, high, side="right")),
    )


def _what_to_give(config: BuildConfig, values: np.ndarray, attrs: dict) -> str:
    """What a split bound along the split dim must be, for its error message."""
    if values.dtype.kind in "US":
        return "the coordinate holds names: give names"
    calendar = calendar_of(values[:1])
    if calendar is not None:
        calendar = "standard" if calendar == "datetime64" else calendar
        return f'give dates such as "1890", "1890-06" or "1890-06-15T12:00" (calendar {calendar})'
    units = f" in {attrs['units']!r}" if "units" in attrs else ""
    undecoded = " (input.decode_times: false keeps times as stored)" if not config.input.decode_times else ""
    return f"the coordinate holds numbers{units}{undecoded}: give numbers"


def split_ranges(config: BuildConfig, values: np.ndarray, attrs: dict | None = None) -> list[SplitPlan]:
    """Each configured split's index range along the split dim (inclusive coordinate bounds).

    ``values``, ``attrs``: the split dim's coordinate (its units say what numeric bounds count).
    """
    if not config.splits:
        return [SplitPlan(DEFAULT_SPLIT, 0, len(values))]
    dim = config.split_dim
    dates = date_index(values[:1]) is not None
    splits = []
    for name, ranges in config.splits.items():
        low, high = (_bound(v, dates) for v in ranges[dim])
        try:
            span = _span(values, low, high)
        except (ValueError, TypeError, KeyError) as error:
            raise UserError(
                f"splits.{name}.{dim}: cannot read [{low}, {high}] as {dim} values ({error}); "
                f"{_what_to_give(config, values, attrs or {})}"
            ) from None
        start, stop = int(span.start or 0), len(values) if span.stop is None else int(span.stop)
        if stop <= start:
            raise UserError(
                f"splits.{name}.{dim}: [{low}, {high}] holds no {dim} step of the input "
                f"({format_value(values[0])} to {format_value(values[-1])}); fix the range"
            )
        splits.append(SplitPlan(name, start, stop))
    ordered = sorted(splits, key=lambda s: s.start)
    for before, after in zip(ordered, ordered[1:]):
        if after.start < before.stop:
            raise UserError(
                f"splits: {before.name} and {after.name} overlap at {dim} {format_value(values[after.start])}; "
                "a sample must not belong to two splits"
            )
    return ordered  # in coordinate order, whatever the order in the config


def position_labels(axis: Axis, splits: list[SplitPlan]) -> np.ndarray:
    """Per position along the split dim: the index of the split all its steps lie in, or -1."""
    starts = np.arange(axis.count) * axis.stride
    ends = starts + axis.span  # exclusive
    label = np.full(axis.count, -1, dtype=np.int16)
    for index, split in enumerate(splits):
        label[(starts >= split.start) & (ends <= split.stop)] = index
    return label


def gap_positions(config: BuildConfig, axis: Axis, values: np.ndarray, files: list[SourceFile]) -> np.ndarray:
    """Per position along the concat dim: whether its samples would join steps across a gap in the data."""
    if axis.span == 1:
        return np.zeros(axis.count, dtype=bool)
    starts = np.arange(axis.count) * axis.stride
    irregular = irregular_steps(values)
    crossings = np.concatenate(([0], np.cumsum(irregular)))
    across_gap = crossings[starts + axis.span - 1] - crossings[starts] > 0
    if across_gap.any() and config.input.gaps == "error":
        _raise_gap(config, values, irregular, files, int(across_gap.sum()))
    return across_gap


def _raise_gap(config: BuildConfig, values: np.ndarray, irregular: np.ndarray, files: list[SourceFile], count: int):
    dim = config.input.concat_dim
    step = int(np.flatnonzero(irregular)[0])
    before = next(f for f in files if f.start <= step < f.stop)
    after = next(f for f in files if f.start <= step + 1 < f.stop)
    where = f"inside {before.path}" if before is after else f"between {before.path} and {after.path}"
    raise UserError(
        f"input: {dim} is not regular {where}: {format_value(values[step])} is followed by "
        f"{format_value(values[step + 1])}, so {count} sample(s) would join steps that are "
        "not consecutive; add the missing data, or set input.gaps: skip to drop those samples"
    )
