"""Splits: which positions along the split dim make samples of which split, and which none; their shard counts.

Splits range along the concat dim, or along input.new_dim (ensemble members). A sample
belongs to a split when every step it takes along that dim lies inside the split's range, so
no window or pair straddles a boundary (nothing leaks from test into train). A sample that
would join steps across a gap in the data belongs to no split either, unless the config
makes gaps an error.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from planning.config.model import BuildConfig
from planning.formats.calendars import calendar_of, date_index
from planning.formats.sources import SourceFile
from planning.inputs.coords import format_value, irregular_steps
from planning.run.generations import HeldRange
from planning.sampling import Axis, SampleGrid
from planning.selected import SelectedDataset
from planning.sizing import num_shards
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
    generation: int = 0  # the build (0) or append (1, 2, ...) writing these shards: their names say it
    #: its range holds no step of the input yet, lying after the last (or before the first): 0 samples, until an
    #: append brings its steps
    awaiting: str | None = None


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
        awaiting = None
        if stop <= start:
            held = f"({format_value(values[0])} to {format_value(values[-1])})"
            if start not in (0, len(values)) or dim != config.input.concat_dim:
                raise UserError(
                    f"splits.{name}.{dim}: [{low}, {high}] holds no {dim} step of the input {held}; fix the range"
                )
            # After the input's last step (or before its first): an append brings its steps (or a backfill).
            start = stop = start
            side = "after the input's last step" if start else "before the input's first step"
            awaiting = f"[{low}, {high}] lies {side} {held}"
        splits.append(SplitPlan(name, start, stop, awaiting=awaiting))
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


def gap_positions(
    config: BuildConfig, axis: Axis, values: np.ndarray, files: list[SourceFile], attrs: dict | None = None
) -> np.ndarray:
    """Per position along the concat dim: whether its samples would join steps across a gap in the data.

    ``attrs``: the concat coordinate's (the units and calendar of times kept as numbers).
    """
    if axis.span == 1:
        return np.zeros(axis.count, dtype=bool)
    starts = np.arange(axis.count) * axis.stride
    irregular = irregular_steps(values, attrs)
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


@dataclasses.dataclass(frozen=True)
class SplitPositions:
    """Which grid positions make samples of which split, as Positions needs it and units are filtered by."""

    dim: str  # the split dim
    labels: np.ndarray | None  # per position along it: its split, or -1; None: every position, the one split
    across_gap: np.ndarray | None  # per position along the concat dim, when the splits run along another dim

    def making(self, concat_dim: str) -> dict[str, np.ndarray]:
        """Per dim, the positions along it that can make samples (a unit without one along any makes none)."""
        out = {} if self.labels is None else {self.dim: self.labels >= 0}
        if self.across_gap is not None:
            out[concat_dim] = ~self.across_gap
        return out


def held_positions(axis: Axis, held: HeldRange) -> np.ndarray:
    """Per position along the concat dim: whether all its steps lie in the ``held`` steps (an earlier
    generation cut its samples; an append cuts only the others, those reaching into the new steps)."""
    starts = np.arange(axis.count) * axis.stride
    return (starts >= held.start) & (starts + axis.span <= held.stop)


def assign_splits(
    config: BuildConfig,
    grid: SampleGrid,
    dataset: SelectedDataset,
    files: list[SourceFile],
    record_bound: int,
    held: HeldRange | None = None,
    generation: int = 0,
) -> tuple[list[SplitPlan], SplitPositions, dict[str, int]]:
    """Splits with their sample and shard counts, which positions make samples of each, and the drop counts.

    ``files``: their ranges on the selected concat dim, where gaps are found. ``held``: the steps of
    the concat dim an output's earlier generations hold: the positions within them make no samples,
    nor count among the drops (an append, ``generation`` 1, 2, ..., plans the others only).
    """
    appending = held is not None
    concat_dim, split_dim = config.input.concat_dim, config.split_dim
    splits = split_ranges(config, *dataset.coordinate(split_dim))
    grid_dims = [a.dim for a in grid.grid_axes]
    if split_dim not in grid_dims and config.splits:
        raise UserError(f"splits: {split_dim!r} is kept whole in every sample, so it cannot be split")
    across_gap, cut_before, held_samples = None, None, 0
    if concat_dim in grid_dims:
        values, attrs = dataset.coordinate(concat_dim)
        across_gap = gap_positions(config, grid.axis(concat_dim), values, files, attrs)
        if appending:
            cut_before = held_positions(grid.axis(concat_dim), held)
            held_samples = int(cut_before.sum()) * (grid.num_samples // grid.axis(concat_dim).count)
            across_gap = across_gap & ~cut_before  # (gaps among held steps were counted by their generation)
    elif appending:
        raise UserError(
            f"input: {concat_dim!r} is kept whole in every sample, so new steps change every sample; "
            "--append needs samples along it: rebuild with --overwrite"
        )
    gap_drops = 0 if across_gap is None else int(across_gap.sum()) * (grid.num_samples // grid.axis(concat_dim).count)
    if cut_before is not None:
        across_gap = across_gap | cut_before  # positions that make no sample (here: not again)
    if split_dim not in grid_dims:
        labels, counts = None, [grid.num_samples - gap_drops]
    else:
        labels = position_labels(grid.axis(split_dim), splits)
        per_position = grid.num_samples // grid.axis(split_dim).count
        if split_dim == concat_dim:
            labels[across_gap] = -1
            across_gap = None  # in the labels now
        elif across_gap is not None:
            # Per split-dim position, the samples at positions along the concat dim that cross no gap.
            per_position = per_position // grid.axis(concat_dim).count * int((~across_gap).sum())
        counts = [int((labels == i).sum()) * per_position for i in range(len(splits))]
    drops = {
        "grid_positions": grid.num_samples - held_samples,
        "samples_dropped_at_gaps": gap_drops,
        "samples_outside_splits": grid.num_samples - held_samples - gap_drops - sum(counts),
    }
    if sum(counts) == 0 and not appending:  # (an append whose samples all lie outside the splits adds none)
        reason = "crosses a gap in the data" if gap_drops else "lies outside every split"
        raise UserError(f"input: every sample along {split_dim} {reason}; there is nothing to write")
    planned, first = [], 0
    for split, count in zip(splits, counts):
        if count == 0 and not appending and split.awaiting is None:
            if split.stop < len(dataset.coordinate(split_dim)[0]) or split_dim != concat_dim:
                raise UserError(f"splits.{split.name}: no whole sample fits in its range; widen it")
            # It reaches the input's last step: the steps an append brings will complete its samples.
            split = dataclasses.replace(split, awaiting="no whole sample fits in its steps yet")
        shards = num_shards(config, count, record_bound) if count else 0  # (an append adds none to a split)
        planned.append(
            dataclasses.replace(split, num_samples=count, num_shards=shards, first_shard=first, generation=generation)
        )
        first += shards
    if labels is not None and not config.splits and (labels == 0).all():
        labels = None  # every position makes samples of the one split: nothing to look up
    if across_gap is not None and not across_gap.any():
        across_gap = None
    return planned, SplitPositions(split_dim, labels, across_gap), drops
