"""ComputeStats: per split and variable, count, mean, variance, min, max, NaN, inf and filled counts; sample counts.

Each block is summarised in float64 (count, mean, M2) and summaries merge pairwise with Chan
et al.'s update, which stays accurate where a float32 sum of squares loses (mean/std)^2 in
relative precision (docs/design.md, decision 4). The values summarised are those stored (after the
cast to the record dtype; with sample.roles, the cells the variable's role features store, not its
whole cut sample; with stats.over: field, none here: transforms.field summarises the source's
steps and cells), except the values nan_policy: fill put where NaN was: those are
counted apart (``filled_count``), so the statistics describe the real values and a land
filled with 0 does not drag an ocean's mean and std. With ``stats.per`` (kept dims such as
level) every field is an array over those dims.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

import apache_beam as beam
import numpy as np

from planning.features import stored_cells
from planning.run.contracts import SPLIT, Block, NonFinite
from planning.specs import StatsSpec
from schemas.schema import Feature
from transforms.merging import summary_tree
from transforms.merging.probe import measured


@dataclasses.dataclass(frozen=True)
class Moments:
    """Summary of a set of values that merges exactly with another; arrays over the ``per`` dims."""

    count: np.ndarray
    mean: np.ndarray
    m2: np.ndarray
    minimum: np.ndarray
    maximum: np.ndarray
    nan_count: np.ndarray
    inf_count: np.ndarray
    filled_count: np.ndarray

    @classmethod
    def of(cls, values: np.ndarray, keep_axes: Sequence[int] = (), filled: np.ndarray | None = None) -> Moments:
        """Moments of the finite values, one per index along ``keep_axes``; NaN and inf counted apart.

        ``filled`` (bool, the shape of ``values``): values that were NaN and were filled; they are
        left out of every moment and counted in ``filled_count``.
        """

        def flat(array: np.ndarray, dtype=None) -> np.ndarray:
            array = np.moveaxis(np.asarray(array), list(keep_axes), list(range(len(keep_axes))))
            if dtype is not None:  # a copy in the moved axes' order: the reshape copies nothing more
                array = array.astype(dtype, order="C")
            return array.reshape((*array.shape[: len(keep_axes)], -1))

        # One float64 copy, then every pass in place over it: numpy's float32 -> float64 reductions
        # (sum with dtype=, einsum) cast in buffers at each call, and took 1.8x the time (a block's
        # variable of 196 samples x 27 x 9 x 9: 0.74 ms against 0.40).
        work = flat(values, np.float64)
        rows, n = work.shape[:-1], work.shape[-1]
        none = np.zeros(rows, dtype=np.int64)
        if n == 0:
            zeros = np.zeros(rows)
            return cls(none, zeros, zeros, zeros + np.inf, zeros - np.inf, none, none, none)
        filled_count, mask = none, None
        if filled is not None and filled.any():
            mask = flat(filled)
            filled_count = mask.sum(axis=-1)
        if mask is None and not keep_axes:  # (over the values as they are: half the bytes of the copy's)
            low, high = np.float64(np.min(values)), np.float64(np.max(values))
        elif mask is None:
            low, high = work.min(axis=-1), work.max(axis=-1)
        else:  # a filled value, as each pass's identity, leaves the pass's result unchanged
            np.putmask(work, mask, np.inf)
            low = work.min(axis=-1)
            np.putmask(work, mask, -np.inf)
            high = work.max(axis=-1)
            np.putmask(work, mask, 0.0)
        total = work.sum(axis=-1)
        if np.isfinite(total).all():
            # Every real value is finite (a NaN or inf would make its row's sum non-finite): the
            # centred squares, summed, in the same copy.
            count = np.full(rows, n, dtype=np.int64) - filled_count
            mean = total / np.maximum(count, 1)  # 0 where every value was filled
            work -= mean[..., None]
            if mask is not None:
                np.putmask(work, mask, 0.0)
            np.square(work, out=work)
            return cls(count, mean, work.sum(axis=-1), low, high, none, none, filled_count)
        x = work  # the values in float64 still, but where filled (0 there since the extremes)
        if mask is not None:
            x[mask] = np.nan
        finite = np.isfinite(x)
        nan = np.isnan(x)
        count = finite.sum(axis=-1)
        safe = np.where(finite, x, 0.0)
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = np.where(count > 0, safe.sum(axis=-1) / np.maximum(count, 1), 0.0)
        centred = np.where(finite, x - mean[..., None], 0.0)
        return cls(
            count,
            mean,
            np.einsum("...i,...i->...", centred, centred),
            np.where(finite, x, np.inf).min(axis=-1, initial=np.inf),
            np.where(finite, x, -np.inf).max(axis=-1, initial=-np.inf),
            nan.sum(axis=-1) - filled_count,
            (~finite & ~nan).sum(axis=-1),
            filled_count,
        )

    def __reduce__(self):
        # Unpickled by a runner, each array would be a view on the buffers it was decoded from (Beam's coder keeps
        # ~0.5 KB alive per array, Dask's serialization another amount): copied into arrays of their own, a merge
        # holds the same bytes on every runner, a third of what it held (benchmarks.merge_memory).
        return _owned_moments, tuple(getattr(self, field) for field in _MOMENT_FIELDS)

    def merge(self, other: Moments) -> Moments:
        count = self.count + other.count
        delta = other.mean - self.mean
        with np.errstate(invalid="ignore", divide="ignore"):
            share = np.where(count > 0, other.count / np.maximum(count, 1), 0.0)
            cross = np.where(count > 0, self.count * other.count / np.maximum(count, 1), 0.0)
        return Moments(
            count=count,
            mean=self.mean + delta * share,
            m2=self.m2 + other.m2 + delta * delta * cross,
            minimum=np.minimum(self.minimum, other.minimum),
            maximum=np.maximum(self.maximum, other.maximum),
            nan_count=self.nan_count + other.nan_count,
            inf_count=self.inf_count + other.inf_count,
            filled_count=self.filled_count + other.filled_count,
        )

    @property
    def variance(self) -> np.ndarray:
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.count > 0, self.m2 / np.maximum(self.count, 1), np.nan)

    def to_json(self, dims: Sequence[str] = ()) -> dict:
        """JSON-ready fields: numbers, or nested lists over ``dims``; null where there is no value."""
        empty = self.count == 0

        def floats(values) -> float | list | None:
            return _plain(np.where(empty, np.nan, np.asarray(values, dtype=np.float64)))

        out = {
            "count": np.asarray(self.count).tolist(),
            "mean": floats(self.mean),
            "variance": floats(self.variance),
            "std": floats(np.sqrt(self.variance)),
            "min": floats(self.minimum),
            "max": floats(self.maximum),
            "nan_count": np.asarray(self.nan_count).tolist(),
            "inf_count": np.asarray(self.inf_count).tolist(),
            "filled_count": np.asarray(self.filled_count).tolist(),
        }
        if dims:
            out["dims"] = list(dims)
        return out


def _owned_moments(*fields: np.ndarray) -> Moments:
    """Moments of copies of ``fields`` (in Moments' field order), each array owning its data."""
    return Moments(*(np.array(field) for field in fields))


def _plain(values: np.ndarray) -> float | list | None:
    """A float array as Python numbers (nested lists), NaN as None (JSON has no NaN)."""
    if values.ndim == 0:
        return None if np.isnan(values) else float(values)
    return [_plain(v) for v in values]


#: An accumulator that merges with another of its kind.
M = TypeVar("M", Moments, NonFinite, "SplitSummary")
#: What the tree merges (transforms.merging.summary_tree), and how a list of them is folded in order.
Summary = Any
Merge = Callable[[Iterable[Summary]], Summary]


def merge_by_name(parts: Iterable[Mapping[str, M]]) -> dict[str, M]:
    """One accumulator per name: those of the same name merged (each has ``merge``)."""
    merged: dict[str, M] = {}
    for part in parts:
        for name, value in part.items():
            merged[name] = merged[name].merge(value) if name in merged else value
    return merged


@dataclasses.dataclass(frozen=True)
class SplitSummary:
    """What one split's samples in some blocks add up to: statistics and sample counts."""

    moments: dict[str, Moments]
    cut: int = 0
    dropped_nan: int = 0
    with_nan: int = 0
    #: per derived variable (input.preprocess), its NaN and inf values before nan_policy
    nonfinite: dict[str, NonFinite] = dataclasses.field(default_factory=dict)
    #: stats.tendency, per variable: the moments of x(t+1) - x(t) over the split's pairs of steps (transforms.tendency)
    tendency: dict[str, Moments] = dataclasses.field(default_factory=dict)

    def merge(self, other: SplitSummary) -> SplitSummary:
        moments = merge_by_name([self.moments, other.moments])
        nonfinite = merge_by_name([self.nonfinite, other.nonfinite])
        return SplitSummary(
            moments,
            self.cut + other.cut,
            self.dropped_nan + other.dropped_nan,
            self.with_nan + other.with_nan,
            nonfinite,
            merge_by_name([self.tendency, other.tendency]),
        )


def per_axes(feature_dims: Sequence[str], per: Sequence[str]) -> tuple[list[int], list[str]]:
    """Axes of a sample's feature (after the leading sample axis) that statistics keep, and their dims."""
    dims = [d for d in per if d in feature_dims]
    return [1 + list(feature_dims).index(d) for d in dims], dims


def stored_values(
    values: np.ndarray, filled: np.ndarray | None, axes: Sequence[int], stored: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray | None, list[int]]:
    """A block's values of a variable (samples first) cut to the cells ``stored`` marks in a sample (None: all),
    with their ``filled`` marks, and the axes statistics keep (``axes``) where they are then.

    The kept axes come first after the samples, the stored cells of each sample last, flat. Roles take steps
    along the concat dim and crops of windows, never parts of a kept dim, so every index along the kept axes
    stores the same cells.
    """
    if stored is None:
        return values, filled, list(axes)
    front = list(range(1, 1 + len(axes)))
    cells = np.moveaxis(stored, [a - 1 for a in axes], [f - 1 for f in front]).any(axis=tuple(range(len(axes))))

    def cut(array: np.ndarray) -> np.ndarray:
        return np.moveaxis(array, list(axes), front)[..., cells]

    return cut(values), None if filled is None else cut(filled), front


def summarize_block(
    block: Block,
    split_names: Sequence[str],
    per: Sequence[str] = (),
    features: Sequence[Feature] = (),
    over: str = "samples",
) -> dict[str, SplitSummary]:
    """Per split: the moments of every variable over the values the block's records store, and the sample counts.

    ``features``: the record's features; with sample.roles, a variable's statistics cover the cells its role
    features store (the union of their steps and crops), each once per sample, not its whole cut sample.
    ``over``: stats.over; "field" leaves the moments to transforms.field (the sample counts only here).
    """
    samples = block.samples
    labels = samples[SPLIT].values
    names = list(samples.data_vars) if over == "samples" else []
    stored = {name: stored_cells(features, name, samples[name].values.shape[1:]) for name in names}
    out = {}
    for index, name in enumerate(split_names):
        counts = block.counts[name]
        if not counts.cut:
            continue
        mine = labels == index
        moments = {}
        for variable in names:
            values = samples[variable].values
            filled = block.filled.get(variable)
            if not mine.all():
                values = values[mine]
                filled = None if filled is None else filled[mine]
            axes, _ = per_axes(samples[variable].dims[1:], per)
            values, filled, axes = stored_values(values, filled, axes, stored[variable])
            moments[variable] = Moments.of(values, axes, filled)
        out[name] = SplitSummary(moments, counts.cut, counts.dropped_nan, counts.with_nan, dict(counts.nonfinite))
    return out


def keyed_part(unit: int, summary, piece: int = 0, pieces: int = 1):
    """(group, ((unit, piece, pieces), summary)): a unit's (or a piece's) summary as the merge takes it."""
    return unit // summary_tree.UNITS_PER_GROUP, ((unit, piece, pieces), summary)


def keyed_summary(
    block: Block, split_names: Sequence[str], per: Sequence[str], features: Sequence[Feature] = (), over="samples"
):
    summary = summarize_block(block, split_names, per, features, over)
    return keyed_part(block.unit, summary, block.piece, block.pieces)


@measured("MergeGroup")
def _merge_group(group: int, parts: Iterable[tuple[tuple[int, int, int], Summary]], merge: Merge = merge_by_name):
    """(branch, (group, its parts merged in (unit, piece) order)): one group of the tree, keyed for its branch."""
    merged = merge(summary for _, summary in sorted(parts, key=lambda part: part[0]))
    return group // summary_tree.GROUPS_PER_BRANCH, (group, merged)


@measured("MergeBranch")
def _merge_branch(branch: int, groups: Iterable[tuple[int, Summary]], merge: Merge = merge_by_name):
    """(branch, its groups merged in group order): one branch of the tree."""
    return branch, merge(summary for _, summary in sorted(groups, key=lambda group: group[0]))


def summary_tree_of(units: int, merge: Merge = merge_by_name) -> summary_tree.SummaryTree:
    """An empty merge of the summaries in the fixed tree (transforms.merging.summary_tree), for ``units`` units."""
    return summary_tree.SummaryTree(merge, units)


class _MergeBranchesInOrderFn(beam.CombineFn):
    """Merges the branches' summaries in the tree's order; its accumulator holds one summary a branch (one per
    summary_tree.UNITS_PER_GROUP x GROUPS_PER_BRANCH units)."""

    def create_accumulator(self):
        return summary_tree_of(0)

    @measured("MergeBranches", method=True)
    def add_input(self, accumulator, element):
        accumulator.add_branch(*element)
        return accumulator

    @measured("MergeBranches", method=True)
    def add_inputs(self, accumulator, elements):
        for element in elements:
            accumulator = self.add_input(accumulator, element)
        return accumulator

    @measured("MergeBranches", method=True)
    def merge_accumulators(self, accumulators):
        merged, *rest = accumulators
        for accumulator in rest:
            merged.absorb(accumulator)
        return merged

    @measured("MergeBranches", method=True)
    def extract_output(self, accumulator):
        return accumulator.result()


@dataclasses.dataclass
class ComputeStats(beam.PTransform):
    """Blocks -> one {split: SplitSummary} dict over every sample (none without blocks), merged in unit order."""

    spec: StatsSpec

    def expand(self, blocks):
        return (
            blocks
            | "SummarizeBlock"
            >> beam.Map(keyed_summary, self.spec.split_names, self.spec.per, self.spec.features, self.spec.over)
            | "MergeSummaries" >> MergeSummaries()
        )


@dataclasses.dataclass
class MergeBranches(beam.PTransform):
    """keyed_part's parts -> (branch, summary) per branch of the tree: each group's parts merged once grouped, then
    each branch's groups, so that no step holds more than a group's parts or a branch's groups (at most 256 of
    either), whatever the number of units. ``merge``: folds a list of summaries in the order given."""

    merge: Merge = merge_by_name

    def expand(self, parts):
        return (
            parts
            | "GroupUnits" >> beam.GroupByKey()
            | "MergeGroup" >> beam.MapTuple(_merge_group, self.merge)
            | "GroupGroups" >> beam.GroupByKey()
            | "MergeBranch" >> beam.MapTuple(_merge_branch, self.merge)
        )


@dataclasses.dataclass
class MergeSummaries(beam.PTransform):
    """keyed_summary's parts -> one merged {split: SplitSummary} dict, in the tree's order (ComputeStats' and the
    tendency's steps after their per-unit one)."""

    def expand(self, parts):
        return (
            parts
            | "MergeBranches" >> MergeBranches()
            # Without defaults: a global combine's default value is a side input, which Beam's
            # DaskRunner evaluates by running every stage upstream of it again.
            | "MergeInOrder" >> beam.CombineGlobally(_MergeBranchesInOrderFn()).without_defaults()
        )


#: Moments' fields, in the order a stored accumulator lists them.
_MOMENT_FIELDS = tuple(f.name for f in dataclasses.fields(Moments))


def _moments_to_json(moments: Mapping[str, Moments]) -> dict:
    return {
        name: {field: np.asarray(getattr(m, field)).tolist() for field in _MOMENT_FIELDS} for name, m in moments.items()
    }


def summary_to_json(summary: SplitSummary) -> dict:
    """A split's accumulators as JSON-ready values: float64 written exactly (Python's repr), for generations.json."""
    out = {
        "cut": summary.cut,
        "dropped_nan": summary.dropped_nan,
        "with_nan": summary.with_nan,
        "moments": _moments_to_json(summary.moments),
        "nonfinite": {name: dataclasses.asdict(n) for name, n in summary.nonfinite.items()},
    }
    if summary.tendency:
        out["tendency"] = _moments_to_json(summary.tendency)
    return out


def summary_from_json(data: dict) -> SplitSummary:
    """summary_to_json's accumulators back (counts as int64, the rest as float64); KeyError or TypeError if not."""

    def moments(fields: dict) -> Moments:
        return Moments(
            **{
                field: np.asarray(fields[field], dtype=np.int64 if field.endswith("count") else np.float64)
                for field in _MOMENT_FIELDS
            }
        )

    return SplitSummary(
        {name: moments(fields) for name, fields in data["moments"].items()},
        int(data["cut"]),
        int(data["dropped_nan"]),
        int(data["with_nan"]),
        {name: NonFinite(**fields) for name, fields in data.get("nonfinite", {}).items()},
        {name: moments(fields) for name, fields in data.get("tendency", {}).items()},
    )
