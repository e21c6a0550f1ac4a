"""Shards of a build without a write-time shuffle (shuffle.mode: read): each a run of one split's samples in unit order.

A split's samples, in unit order (each unit's in sample-id order among them), are cut into as many
runs of equal counts as the split has shards (within one sample); shard i holds run i, so one
worker writes it whole, streaming, with no sort and no intermediate files. A run starts at a
sample of some unit: the shard's start is (unit, rank of that sample among the unit's samples of
the split). Where the samples are is known at planning: a unit's samples of a split are the product,
over the grid dims, of its span's positions that make samples of the split (the splits' labels along
the split dim, the gaps along the concat dim, every position along the others), so the runs are
found from a few small arrays, a chunk of units at a time, never an array over every unit or sample.

A unit whose samples fall in two runs (a shard's boundary) or in two splits is cut by each of their
shards: one unit per shard at most, beside each unit along a split's boundary. Its statistics are
summarised by one of them alone (``owns``), so every unit is summarised once, from the same block,
as a write-shuffled build summarises it. With nan_policy: drop a sample's rank counts the dropped
ones too: shards then hold their runs' samples that were kept.
"""

from __future__ import annotations

import dataclasses
import io
from collections.abc import Sequence

import numpy as np

from planning.positions import Positions
from planning.sampling import Unit, Units
from schemas.errors import UserError
from schemas.npy_files import npz_arrays

#: Units counted at once while planning the runs (a few arrays of this length at a time).
_CHUNK = 1 << 20


@dataclasses.dataclass(frozen=True, eq=False)
class UnitRuns:
    """Per shard (numbered across splits) where its run starts; what counts a unit's samples of each split."""

    starts: np.ndarray  # (shards, 2) int64: each shard's first (unit, rank among the unit's samples of its split)
    split_of_shard: np.ndarray  # (shards,) int64: its split's index (the samples' split label)
    #: [split][grid dim] -> per span of the units along that dim, its positions making samples of the split
    factors: tuple[tuple[np.ndarray, ...], ...]
    sizes: tuple[int, ...]  # the units' spans along each dim of ``order`` (Units.sizes)
    order: tuple[int, ...]  # Units.order
    total_units: int
    #: the split that summarises a unit with no sample in any split (the first split with shards)
    fallback: int = 0

    def counts(self, split: int, start: int, stop: int) -> np.ndarray:
        """Samples of ``split`` in each unit numbered [start, stop)."""
        numbers = np.arange(start, stop, dtype=np.int64)
        out = np.ones(len(numbers), dtype=np.int64)
        if not self.order:  # no grid dim: one unit, one sample, of the one split
            return out if split == 0 else out * 0
        picks = np.unravel_index(numbers, self.sizes)
        for which, pick in zip(self.order, picks):
            out *= self.factors[split][which][pick]
        return out

    def owners(self, start: int, stop: int) -> np.ndarray:
        """The split that summarises each unit numbered [start, stop): the first holding samples of it."""
        owner = np.full(stop - start, -1, dtype=np.int64)
        for split in range(len(self.factors)):
            owner[(owner < 0) & (self.counts(split, start, stop) > 0)] = split
        owner[owner < 0] = self.fallback
        return owner

    def end(self, shard: int) -> tuple[int, int]:
        """Where shard ``shard``'s run ends (exclusive): the next shard's start, or past the last unit."""
        following = shard + 1
        if following < len(self.starts) and self.split_of_shard[following] == self.split_of_shard[shard]:
            unit, rank = self.starts[following]
            return int(unit), int(rank)
        return self.total_units, 0

    def to_bytes(self) -> bytes:
        """The run file's bytes: per shard its start as two int32 (8 bytes a shard: 18 MB for ARCO-ERA5's 2.2M),
        the splits' shard counts and the factors; compressed (consecutive starts differ by little)."""
        if len(self.starts) and int(self.starts.max()) >= 2**31:
            raise UserError(
                f"shuffle.mode: read: unit {int(self.starts.max()):,} is past the 2^31 units a unit-order build "
                "can hold; build with shuffle.mode: write"
            )
        counts = np.bincount(self.split_of_shard, minlength=len(self.factors)) if len(self.factors) else []
        arrays = {
            "starts": self.starts.astype(np.int32),
            "shards": np.asarray(counts, dtype=np.int64),
            "sizes": np.asarray(self.sizes, dtype=np.int64),
            "order": np.asarray(self.order, dtype=np.int64),
            "numbers": np.asarray([len(self.factors), len(self.order), self.total_units, self.fallback], np.int64),
        }
        for split, per_dim in enumerate(self.factors):
            for dim, factor in enumerate(per_dim):
                arrays[f"factor_{split}_{dim}"] = factor
        buffer = io.BytesIO()
        np.savez_compressed(buffer, **arrays)
        return buffer.getvalue()

    @classmethod
    def from_bytes(cls, data: bytes) -> UnitRuns:
        with npz_arrays(data) as arrays:
            splits, dims, total_units, fallback = (int(n) for n in arrays["numbers"])
            factors = tuple(tuple(arrays[f"factor_{s}_{d}"] for d in range(dims)) for s in range(splits))
            shards = arrays["shards"]
            return cls(
                arrays["starts"].astype(np.int64).reshape(-1, 2),
                np.repeat(np.arange(len(shards), dtype=np.int64), shards),
                factors,
                tuple(int(n) for n in arrays["sizes"]),
                tuple(int(w) for w in arrays["order"]),
                total_units,
                fallback,
            )


@dataclasses.dataclass(frozen=True)
class RunUnit:
    """A unit a shard cuts: which of its samples of the shard's split the shard holds, whether it summarises it."""

    unit: Unit
    first: int  # rank among the unit's samples of the split (sample-id order) of the first the shard holds
    stop: int  # ... and past its last
    count: int  # the unit's samples of the split
    owns: bool

    @property
    def whole(self) -> bool:
        """Whether the shard holds all the unit's samples of its split (no rank to look at)."""
        return self.first == 0 and self.stop == self.count


def run_units(runs: UnitRuns, units: Units, shard: int, at_a_time: int = 4096):
    """The units shard ``shard`` cuts, in order (RunUnit), those it neither holds samples of nor summarises left out."""
    split = int(runs.split_of_shard[shard])
    (start, start_rank), (end, end_rank) = (int(n) for n in runs.starts[shard]), runs.end(shard)
    stop = end + (end_rank > 0)  # the unit where the next shard starts: this one holds its first end_rank samples
    for first in range(start, stop, at_a_time):
        last = min(stop, first + at_a_time)
        counts = runs.counts(split, first, last)
        owners = runs.owners(first, last) == split
        numbers = np.arange(first, last)
        lows = np.where(numbers == start, start_rank, 0)
        highs = np.where(numbers == end, end_rank, counts)
        # A unit is summarised by the shard of its split holding its first sample (rank 0): not by this one if
        # the shard starts inside it.
        owns = owners & ~((numbers == start) & (start_rank > 0))
        for i in np.flatnonzero((highs > lows) | owns).tolist():
            yield RunUnit(units[first + i], int(lows[i]), int(highs[i]), int(counts[i]), bool(owns[i]))


def split_ranks(positions: Positions, unit: Unit, split: int, sample_ids: np.ndarray) -> np.ndarray:
    """Each of ``sample_ids``' rank among ``unit``'s samples of ``split`` (by sample id, the dropped ones counted)."""
    grid = positions.grid
    labels = positions.split_labels(grid.unit_positions(unit))
    ids = grid.sample_ids(unit)[np.asarray(labels) == split]  # (ascending: the unit's box, row-major)
    return np.searchsorted(ids, sample_ids)


def split_factors(positions: Positions, units: Units, splits: int) -> tuple[tuple[np.ndarray, ...], ...]:
    """Per split and grid dim: each unit span's positions along the dim that make samples of the split."""
    dims = [a.dim for a in positions.grid.grid_axes]
    split_dim = positions.split_dim or positions.concat_dim
    out = []
    for split in range(splits):
        per_dim = []
        for which, (dim, spans) in enumerate(zip(dims, units.spans)):
            making = np.ones(positions.grid.grid_axes[which].count, dtype=bool)
            if positions.split_of_position is not None and dim == split_dim:
                making &= positions.split_of_position == split
            elif positions.split_of_position is None and split:
                making[:] = False  # (one split: every position is the first's)
            if positions.across_gap is not None and dim == positions.concat_dim:
                making &= ~positions.across_gap
            made = np.concatenate([[0], np.cumsum(making, dtype=np.int64)])
            per_dim.append(made[spans[:, 1]] - made[spans[:, 0]])
        out.append(tuple(per_dim))
    return tuple(out)


def _starts(runs: UnitRuns, split: int, shards: int, samples: int) -> np.ndarray:
    """Where each of the split's ``shards`` runs starts, as (unit, rank): run i at sample i * samples // shards."""
    targets = (np.arange(1, shards, dtype=np.int64) * samples) // shards
    starts = np.zeros((shards, 2), dtype=np.int64)
    found, counted = 0, 0
    for first in range(0, runs.total_units, _CHUNK):
        counts = runs.counts(split, first, min(runs.total_units, first + _CHUNK))
        ends = counted + np.cumsum(counts)  # the split's samples up to and including each unit
        where = np.searchsorted(ends, targets[found:], side="right")  # the unit holding each target sample
        inside = int(np.count_nonzero(where < len(ends)))
        units = where[:inside]
        starts[1 + found : 1 + found + inside, 0] = first + units
        starts[1 + found : 1 + found + inside, 1] = targets[found : found + inside] - (ends[units] - counts[units])
        found += inside
        counted = int(ends[-1]) if len(ends) else counted
    starts[1 + found :] = (runs.total_units, 0)  # (not reached: every target is below the split's count)
    return starts


def plan_unit_runs(positions: Positions, units: Units, split_samples: Sequence[int], split_shards: Sequence[int]):
    """Each split's shards as runs of its samples in unit order (UnitRuns).

    ``split_samples``, ``split_shards``: per split (label order), its samples and shards (planning.sizing: a run
    holds at most one sample more than samples / shards, so no shard outgrows what sizing allowed).
    """
    factors = split_factors(positions, units, len(split_samples))
    fallback = next((i for i, shards in enumerate(split_shards) if shards), 0)
    empty = np.zeros((0, 2), dtype=np.int64)
    runs = UnitRuns(empty, np.zeros(0, np.int64), factors, units.sizes, units.order, len(units), fallback)
    starts, labels = [empty], [np.zeros(0, dtype=np.int64)]
    for split, (samples, shards) in enumerate(zip(split_samples, split_shards)):
        if shards:
            starts.append(_starts(runs, split, shards, samples))
            labels.append(np.full(shards, split, dtype=np.int64))
    return dataclasses.replace(runs, starts=np.concatenate(starts), split_of_shard=np.concatenate(labels))
