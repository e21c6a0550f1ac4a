"""Sample geometry: which positions of the virtual dataset make samples, and cutting them out.

Every dim a sample touches has an ``Axis``: its role (iterate, window, offsets, keep), the
steps a sample takes along it and the stride between consecutive samples. The non-kept axes
form the *grid*: one sample per grid point, numbered row-major (its sample id). A *unit* is a
box of grid positions; ``cut`` turns an array holding that box's source slab into a block of
samples with a leading sample axis, in sample-id order.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import io
import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Literal

import numpy as np
from numpy.lib.stride_tricks import as_strided

from planning.inputs.limits import MAX_UNITS
from schemas.errors import UserError
from schemas.npy_files import npz_arrays

Role = Literal["iterate", "window", "offsets", "keep"]


@dataclasses.dataclass(frozen=True)
class Axis:
    """How one dim of the virtual dataset is cut into samples."""

    dim: str
    length: int  # along the virtual dataset
    role: Role
    steps: tuple[int, ...]  # element offsets within one sample, relative to the sample's start
    stride: int = 1  # between the starts of consecutive samples
    #: the step a sample's index/<dim> names: for offsets, the element at offset 0 (the first element otherwise)
    anchor: int = 0

    @classmethod
    def iterate(cls, dim: str, length: int) -> Axis:
        return cls(dim, length, "iterate", (0,), 1)

    @classmethod
    def window(cls, dim: str, length: int, size: int, stride: int) -> Axis:
        return cls(dim, length, "window", tuple(range(size)), stride)

    @classmethod
    def offsets(cls, dim: str, length: int, offsets: Sequence[int]) -> Axis:
        """Steps ``offsets`` relative to each sample's index (which offset 0 names; the config requires it)."""
        low = min(offsets)
        return cls(dim, length, "offsets", tuple(o - low for o in offsets), 1, -low)

    @classmethod
    def keep(cls, dim: str, length: int) -> Axis:
        return cls(dim, length, "keep", tuple(range(length)), 1)

    @property
    def span(self) -> int:
        """Source steps one sample covers, first to last."""
        return max(self.steps) + 1

    @property
    def count(self) -> int:
        """Number of sample positions along this dim."""
        if self.length < self.span:
            return 0
        return (self.length - self.span) // self.stride + 1

    @property
    def extent(self) -> int | None:
        """Length of the feature along this dim; None where the dim is dropped (iterated)."""
        return None if self.role == "iterate" else len(self.steps)

    @property
    def is_contiguous(self) -> bool:
        return self.steps == tuple(range(len(self.steps)))

    def source_range(self, start: int, stop: int) -> tuple[int, int]:
        """Source indices [begin, end) that positions [start, stop) read."""
        if self.role == "keep":
            return 0, self.length
        return start * self.stride, (stop - 1) * self.stride + self.span

    def first_index(self, positions: np.ndarray) -> np.ndarray:
        """Each sample's index/<dim>: the index of its first element (of its offset 0 with offsets)."""
        return positions * self.stride + self.anchor

    def element_indices(self, positions: np.ndarray) -> np.ndarray:
        """Source indices (samples, elements) of every element each sample takes."""
        return positions[:, None] * self.stride + np.asarray(self.steps)[None, :]

    def to_json(self) -> dict:
        out: dict = {"dim": self.dim, "role": self.role, "length": self.length, "positions": self.count}
        if self.role == "window":
            out.update(size=len(self.steps), stride=self.stride)
        elif self.role == "offsets":
            # As configured: relative to the sample's index/<dim>.
            out.update(offsets=[s - self.anchor for s in self.steps])
        return out


@dataclasses.dataclass(frozen=True)
class Unit:
    """A box of grid positions that one worker cuts in one go: [start, stop) per grid dim."""

    index: int
    ranges: tuple[tuple[int, int], ...]

    @property
    def num_samples(self) -> int:
        return math.prod(stop - start for start, stop in self.ranges)


#: Units made into objects at a time when a range of them is iterated (bounds the arrays behind them).
_UNITS_AT_A_TIME = 1 << 16


@dataclasses.dataclass(frozen=True, eq=False)
class Units:
    """The work units of a build: the product of one list of spans per grid dim, never one object per unit.

    Unit ``i`` is the ``i``-th box of ``itertools.product`` over the dims in ``order`` (the last
    varies fastest), so a plan of 30M units is a few arrays of spans, and a worker makes the
    units of a range of indices (``ranges``) from them alone.
    """

    spans: tuple[np.ndarray, ...]  # per grid dim (grid order): [start, stop) of each span, shape (n, 2), int64
    order: tuple[int, ...]  # the grid dims by how slowly they vary in the numbering (a permutation)

    def __post_init__(self):
        if sorted(self.order) != list(range(len(self.spans))):
            raise ValueError(f"units: order {self.order} is not a permutation of {len(self.spans)} dims")
        for span in self.spans:
            if span.ndim != 2 or span.shape[1] != 2:
                raise ValueError(f"units: spans of shape {span.shape}, not (n, 2)")

    @classmethod
    def of(cls, spans, order) -> Units:
        return cls(tuple(np.asarray(s, dtype=np.int64).reshape(-1, 2) for s in spans), tuple(order))

    @property
    def sizes(self) -> tuple[int, ...]:
        """Spans along each dim of ``order``."""
        return tuple(len(self.spans[which]) for which in self.order)

    def __len__(self) -> int:
        return math.prod(self.sizes)

    def __getitem__(self, index: int) -> Unit:
        count = len(self)
        if not -count <= index < count:
            raise IndexError(f"unit {index} of {count}")
        return next(self.ranges(index % count, index % count + 1))

    def __iter__(self):
        return self.ranges(0, len(self))

    def ranges(self, start: int, stop: int):
        """The units numbered [start, stop), in order."""
        start, stop = max(0, start), min(stop, len(self))
        for first in range(start, stop, _UNITS_AT_A_TIME):
            numbers = np.arange(first, min(stop, first + _UNITS_AT_A_TIME), dtype=np.int64)
            picks = np.unravel_index(numbers, self.sizes) if self.order else ()
            bounds: list = [None] * len(self.spans)
            for which, pick in zip(self.order, picks):
                bounds[which] = self.spans[which][pick].tolist()
            for i, number in enumerate(numbers.tolist()):
                yield Unit(number, tuple(tuple(b[i]) for b in bounds))

    def keep(self, which: int, kept: np.ndarray) -> Units:
        """These units without those whose span along grid dim ``which`` is not ``kept`` (renumbered)."""
        spans = list(self.spans)
        spans[which] = spans[which][np.asarray(kept, dtype=bool)]
        return Units(tuple(spans), self.order)

    def slices(self, count: int) -> list[tuple[int, int]]:
        """[start, stop) ranges of unit numbers, ``count`` of them at most, as even as they can be."""
        total = len(self)
        count = max(1, min(count, total))
        bounds = [total * i // count for i in range(count + 1)]
        return [(a, b) for a, b in zip(bounds[:-1], bounds[1:]) if b > a]

    def hollow(self) -> Units:
        """No units, over the same dims: what a step that never enumerates them carries (they are in a run file)."""
        return Units(tuple(np.zeros((0, 2), dtype=np.int64) for _ in self.spans), self.order)

    def to_bytes(self) -> bytes:
        buffer = io.BytesIO()
        np.savez(
            buffer, order=np.asarray(self.order, dtype=np.int64), **{f"spans{i}": s for i, s in enumerate(self.spans)}
        )
        return buffer.getvalue()

    @classmethod
    def from_bytes(cls, data: bytes) -> Units:
        with npz_arrays(data) as arrays:
            order = [int(w) for w in arrays["order"]]
            return cls.of([arrays[f"spans{i}"] for i in range(len(order))], order)


@dataclasses.dataclass(frozen=True)
class SampleGrid:
    """All the axes of a build; the non-kept ones, in order, are the grid of sample positions."""

    axes: tuple[Axis, ...]

    def __post_init__(self):
        names = [a.dim for a in self.axes]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate dims in sample grid: {names}")

    def axis(self, dim: str) -> Axis:
        for axis in self.axes:
            if axis.dim == dim:
                return axis
        raise KeyError(dim)

    @property
    def grid_axes(self) -> tuple[Axis, ...]:
        return tuple(a for a in self.axes if a.role != "keep")

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(a.count for a in self.grid_axes)

    @property
    def num_samples(self) -> int:
        return math.prod(self.shape)

    def feature_shape(self, dims: Sequence[str]) -> tuple[tuple[int, ...], tuple[str, ...]]:
        """Shape and dims of a variable's feature, in the variable's own dim order."""
        kept = [(self.axis(d).extent, d) for d in dims if self.axis(d).extent is not None]
        return tuple(e for e, _ in kept), tuple(d for _, d in kept)

    def unit_positions(self, unit: Unit) -> list[np.ndarray]:
        """Per grid dim, every sample's position in the unit (row-major, sample-id order)."""
        ranges = [np.arange(start, stop) for start, stop in unit.ranges]
        mesh = np.meshgrid(*ranges, indexing="ij") if ranges else []
        return [m.reshape(-1) for m in mesh]

    def sample_ids(self, unit: Unit) -> np.ndarray:
        positions = self.unit_positions(unit)
        if not positions:
            return np.zeros(1, dtype=np.int64)
        return np.ravel_multi_index(positions, self.shape).astype(np.int64)

    def source_box(self, unit: Unit) -> dict[str, tuple[int, int]]:
        """Source index range along every dim that the unit's samples read."""
        box = {a.dim: (0, a.length) for a in self.axes}
        for axis, (start, stop) in zip(self.grid_axes, unit.ranges):
            box[axis.dim] = axis.source_range(start, stop)
        return box

    def cut(self, slab: np.ndarray, dims: Sequence[str], unit: Unit) -> np.ndarray:
        """Cut the unit's samples out of ``slab`` (a variable's data over ``source_box(unit)``).

        Returns (samples, *feature shape), samples in sample-id order. Windows are strided
        views; the single copy is the final reshape into sample order. A variable that lacks
        some grid dims (a static field, a surface field) is the same for every position along
        them: its samples repeat along those dims.
        """
        ranges = dict(zip((a.dim for a in self.grid_axes), unit.ranges))
        view = slab
        position_axis: dict[str, int] = {}
        element_axis: dict[str, int] = {}
        for i, dim in enumerate(dims):
            axis = self.axis(dim)
            if axis.role == "keep":
                continue
            start, stop = ranges[dim]
            if axis.role == "iterate":
                view = _take_every(view, i, axis.stride, stop - start)
            else:
                view = _windows(view, i, axis.span)
                view = _take_every(view, i, axis.stride, stop - start)
                element_axis[dim] = view.ndim - 1
                if not axis.is_contiguous:
                    view = np.take(view, axis.steps, axis=view.ndim - 1)
            position_axis[dim] = i
        present = [a.dim for a in self.grid_axes if a.dim in position_axis]
        order = [position_axis[d] for d in present]
        order += [element_axis.get(d, i) for i, d in enumerate(dims) if self.axis(d).role != "iterate"]
        shape, _ = self.feature_shape(dims)
        view = view.transpose(order)
        if len(present) < len(self.grid_axes):
            # Insert the missing position axes (length 1) and repeat the samples along them.
            full = tuple(stop - start for start, stop in unit.ranges)
            expanded = tuple(n if a.dim in position_axis else 1 for a, n in zip(self.grid_axes, full))
            view = np.broadcast_to(view.reshape(expanded + tuple(shape)), full + tuple(shape))
        return contiguous_copy(view).reshape((unit.num_samples, *shape))


def contiguous_copy(view: np.ndarray) -> np.ndarray:
    """``view`` as a C-contiguous array (a copy unless it is one), its last axis's runs moved whole where they are
    contiguous.

    numpy copies a strided view element by element along its last axis; a sample's window is short runs
    (9 floats of a 9x9 patch), and copying each run as one opaque item takes 0.6x the time or less (numpy
    2.4: 0.6x for 9 float32, 0.9x for 128).
    """
    if view.ndim < 2 or view.shape[-1] < 2 or view.strides[-1] != view.itemsize or view.dtype.hasobject:
        return np.ascontiguousarray(view)
    runs = view.view(np.dtype((np.void, view.shape[-1] * view.itemsize)))
    return np.ascontiguousarray(runs).view(view.dtype).reshape(view.shape)


def _windows(array: np.ndarray, axis: int, span: int) -> np.ndarray:
    """numpy's ``sliding_window_view(array, span, axis=axis)`` (read-only), without its argument checks: 80 us of
    Python a call, held under the GIL, twice per variable and block."""
    shape = (*array.shape[:axis], array.shape[axis] - span + 1, *array.shape[axis + 1 :], span)
    return as_strided(array, shape, (*array.strides, array.strides[axis]), writeable=False)


def _take_every(array: np.ndarray, axis: int, stride: int, count: int) -> np.ndarray:
    index = [slice(None)] * array.ndim
    index[axis] = slice(0, (count - 1) * stride + 1, stride)
    return array[tuple(index)]


@dataclasses.dataclass(frozen=True)
class UnitCost:
    """Estimated worker memory of a unit: its source slab (halos included) and its samples."""

    arrays: tuple[tuple[tuple[str, ...], int], ...]  # (dims, bytes per element) of each variable read
    bytes_per_sample: float  # what each sample costs once cut (held a few times: cut, encoded, bucketed)

    def __call__(self, grid: SampleGrid, ranges: Sequence[tuple[int, int]]) -> float:
        box = grid.source_box(Unit(0, tuple(ranges)))
        slab = sum(size * math.prod(box[d][1] - box[d][0] for d in dims) for dims, size in self.arrays)
        return slab + self.bytes_per_sample * math.prod(stop - start for start, stop in ranges)


def _largest_fitting(fits, count: int) -> int:
    """The largest k in [1, count] with fits(k), given fits is monotone (true up to some k); at least 1."""
    low, high = 1, count
    while low < high:
        middle = (low + high + 1) // 2
        if fits(middle):
            low = middle
        else:
            high = middle - 1
    return low


def _chunks(
    grid: SampleGrid, cost: UnitCost, budget_bytes: float, order: Sequence[int], least: Sequence[int]
) -> list[int]:
    """Positions per unit along each grid dim: whole dims, except along ``order``'s first dims.

    The dims in ``order`` are narrowed one after another: each to the most positions that fit
    the budget with the dims after it whole; if one position does not fit, to one (to ``least``,
    per grid dim), and on to the next. A unit then fits the budget whenever one position along
    every dim does.
    """
    chunk = [a.count for a in grid.grid_axes]

    def fits(which: int, k: int) -> bool:
        trial = list(chunk)
        trial[which] = k
        return cost(grid, [(0, n) for n in trial]) <= budget_bytes

    for which in order:
        if fits(which, chunk[which]):
            break
        floor = min(least[which], chunk[which])
        chunk[which] = max(floor, _largest_fitting(functools.partial(fits, which), chunk[which]))
    return chunk


def _order(grid: SampleGrid, first_dim: str | None) -> list[int]:
    """The grid dims in the order units are narrowed along: ``first_dim`` first, then grid order."""
    dims = [a.dim for a in grid.grid_axes]
    order = list(range(len(dims)))
    if first_dim in dims:
        order.remove(dims.index(first_dim))
        order.insert(0, dims.index(first_dim))
    return order


def piece_positions(
    grid: SampleGrid, cost: UnitCost, budget_bytes: float, first_dim: str | None = None
) -> tuple[int, ...]:
    """Positions per piece along each grid dim: a unit over the budget (whole chunks of a Zarr store) is cut in
    pieces of at most this many on its worker, one block each, so the samples it holds at once fit the budget."""
    if grid.num_samples == 0:
        return ()
    return tuple(_chunks(grid, cost, budget_bytes, _order(grid, first_dim), [1] * len(grid.grid_axes)))


def chunk_breaks(starts: Sequence[int], chunk: int) -> list[int]:
    """The positions along a grid dim where a source chunk of ``chunk`` elements starts; ``starts``: each
    position's first source index (selection applied), in order."""
    ids = np.asarray(starts, dtype=np.int64) // chunk
    return (np.flatnonzero(ids[1:] != ids[:-1]) + 1).tolist()


def _bounds(count: int, chunk: int, breaks: Sequence[int]) -> list[int]:
    """Unit boundaries along one dim: at most ``chunk`` positions apart, ending at a break that fits; a stretch
    to the next break (or the end) longer than ``chunk`` in as few units as fit, as even as they can be."""
    bounds = [0]
    while bounds[-1] < count:
        start = bounds[-1]
        limit = min(count, start + chunk)
        at = bisect.bisect_right(breaks, limit) - 1  # the last break at or before limit
        if limit == count or (at >= 0 and breaks[at] > start):
            bounds.append(breaks[at] if limit < count else limit)
            continue
        # Not ``chunk``s and a remainder: 4-step files in units of 3 and 1 steps put every large unit on
        # one of a local runner's two threads (it deals a stage's elements out in turn), which then worked
        # alone for half the build (4x benchmark: 8.6 vs 3.5 CPU-s).
        after = bisect.bisect_right(breaks, start)
        end = breaks[after] if after < len(breaks) else count
        parts = -(-(end - start) // chunk)
        bounds.extend(start + (end - start) * i // parts for i in range(1, parts + 1))
    return bounds


def plan_units(
    grid: SampleGrid,
    cost: UnitCost,
    budget_bytes: float,
    first_dim: str | None = None,
    preferred_breaks: Sequence[int] = (),
    least_first: int = 1,
    chunked: Mapping[str, Sequence[int]] | None = None,
) -> Units:
    """Cut the grid into boxes of positions whose estimated cost fits ``budget_bytes``.

    Units are narrowed along ``first_dim`` (the concat dim) first, then along the other grid
    dims in grid order (the variables' storage order: a box spanning the inner dims whole is
    a few long runs of bytes in the files) while one position of the dims before does not fit.
    Along ``first_dim`` units end at ``preferred_breaks`` (positions where a file starts) when
    one fits, so most units open whole files and no halo; and hold at least ``least_first``
    positions along it. ``chunked``: per grid dim, the positions where a Zarr store's chunks
    start (planning.sampling.chunk_breaks): along it units start and end only there, so a chunk
    is never split between units (a unit over the budget is cut in pieces on its worker:
    piece_positions). Time and memory are linear in the spans along each dim, not in the units
    (their product).
    """
    if grid.num_samples == 0:
        return Units.of([np.zeros((0, 2))] * len(grid.grid_axes), range(len(grid.grid_axes)))
    dims = [a.dim for a in grid.grid_axes]
    order = _order(grid, first_dim)
    least = [1] * len(dims)
    breaks: dict[int, list[int]] = {w: [] for w in order}
    if first_dim in dims:
        least[order[0]] = least_first
        breaks[order[0]] = sorted({b for b in preferred_breaks if 0 < b < grid.shape[order[0]]})
    for dim, starts in (chunked or {}).items():
        which = dims.index(dim)
        # Only the chunk starts, and at least the longest chunk: a break always lies within reach.
        breaks[which] = sorted({b for b in starts if 0 < b < grid.shape[which]})
        edges = [0, *breaks[which], grid.shape[which]]
        least[which] = max(least[which], *(b - a for a, b in zip(edges[:-1], edges[1:])))
    chunk = _chunks(grid, cost, budget_bytes, order, least)
    # Units end at most once per chunk and once per break: refused before they are made if absurdly many.
    most = math.prod(-(-grid.shape[w] // chunk[w]) + len(breaks[w]) for w in order)
    if most > MAX_UNITS:
        along = ", ".join(f"{dims[w]} {-(-grid.shape[w] // chunk[w]):,}" for w in order)
        raise UserError(
            f"sample: the plan would make up to {most:,} work units ({along}), over the {MAX_UNITS:,} a build can "
            "hold; select a smaller part of the input (select:) or take fewer samples (a window stride)"
        )
    spans = []
    for which in range(len(dims)):
        bounds = _bounds(grid.shape[which], chunk[which], breaks[which])
        spans.append(np.column_stack([bounds[:-1], bounds[1:]]))
    return Units.of(spans, order)


def unit_pieces(unit: Unit, piece: Sequence[int]) -> list[Unit]:
    """The unit cut in boxes of at most ``piece`` positions per grid dim (planning.sampling.piece_positions), row-major;
    each keeps the unit's index. ``piece`` empty: the unit whole."""
    if not piece:
        return [unit]
    spans = [[(a, min(a + k, stop)) for a in range(start, stop, k)] for (start, stop), k in zip(unit.ranges, piece)]
    return [Unit(unit.index, ranges) for ranges in itertools.product(*spans)]
