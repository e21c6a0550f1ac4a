"""Sample geometry: cutting units of a grid equals cutting the whole array, sample by sample."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planning.sampling import Axis, SampleGrid, Unit, UnitCost, Units, contiguous_copy, plan_units
from schemas.errors import UserError


def naive_sample(array: np.ndarray, axes: list[Axis], position: dict[str, int]) -> np.ndarray:
    """One sample by direct indexing, axis by axis (the reference)."""
    out = array
    for i in reversed(range(len(axes))):
        axis = axes[i]
        if axis.role == "keep":
            continue
        start = position[axis.dim] * axis.stride
        if axis.role == "iterate":
            out = np.take(out, start, axis=i)
        else:
            out = np.take(out, [start + s for s in axis.steps], axis=i)
    return out


@st.composite
def grids(draw):
    axes = []
    for dim in ("time", "level", "lat"):
        length = draw(st.integers(1, 9))
        role = draw(st.sampled_from(["iterate", "window", "offsets", "keep"]))
        if role == "window":
            size = draw(st.integers(1, length))
            axes.append(Axis.window(dim, length, size, draw(st.integers(1, 4))))
        elif role == "offsets" and not any(a.role == "offsets" for a in axes):
            offsets = draw(st.lists(st.integers(-3, 3), min_size=1, max_size=3, unique=True))
            if max(offsets) - min(offsets) + 1 <= length:
                axes.append(Axis.offsets(dim, length, offsets))
            else:
                axes.append(Axis.iterate(dim, length))
        elif role == "keep":
            axes.append(Axis.keep(dim, length))
        else:
            axes.append(Axis.iterate(dim, length))
    return SampleGrid(tuple(axes))


@settings(max_examples=5 * settings.default.max_examples)  # the core property: the most examples
@given(
    grid=grids(),
    budget=st.integers(1, 2000),
    per_sample=st.integers(0, 50),
    breaks=st.lists(st.integers(0, 9), max_size=3),
    data=st.data(),
)
def test_units_cut_exactly_the_samples_of_the_whole_array(grid, budget, per_sample, breaks, data):
    shape = tuple(a.length for a in grid.axes)
    dims = [a.dim for a in grid.axes]
    array = np.arange(np.prod(shape), dtype=np.float64).reshape(shape)
    grid_dims = [a.dim for a in grid.grid_axes]
    first = data.draw(st.sampled_from([*grid_dims, None]))
    cost = UnitCost(((tuple(dims), 8), (tuple(dims[1:]), 4)), per_sample)  # a variable and a static one
    units = plan_units(grid, cost, budget, first, breaks)
    if cost(grid, [(0, 1)] * len(grid_dims)) <= budget:  # one position along every dim fits
        assert all(cost(grid, u.ranges) <= budget for u in units)
    seen = []
    for unit in units:
        box = grid.source_box(unit)
        slab = array[tuple(slice(*box[d]) for d in dims)]
        block = grid.cut(slab, dims, unit)
        ids = grid.sample_ids(unit)
        assert len(block) == len(ids) == unit.num_samples
        for sample_id, sample in zip(ids, block):
            position = dict(zip(grid_dims, np.unravel_index(sample_id, grid.shape))) if grid_dims else {}
            np.testing.assert_array_equal(sample, naive_sample(array, list(grid.axes), position))
        seen.extend(ids.tolist())
    assert sorted(seen) == list(range(grid.num_samples))


@given(
    dtype=st.sampled_from(["<f4", ">f4", "<f8", "<i8", "|b1", "<M8[ns]", "<c8", "|u1"]),
    shape=st.lists(st.integers(1, 6), min_size=1, max_size=4),
    data=st.data(),
)
def test_a_contiguous_copy_equals_numpys_for_every_view(dtype, shape, data):
    """Strided, transposed, windowed and broadcast views of any dtype: the same values, C-contiguous, a copy (unless
    the view was C-contiguous already, as numpy's)."""
    base = np.arange(int(np.prod(shape)) * 3).reshape(*shape[:-1], shape[-1] * 3)
    array = (base % 7 == 0) if dtype == "|b1" else base.astype(dtype)
    view = array[..., :: data.draw(st.integers(1, 3))]
    window = data.draw(st.integers(1, view.shape[-1]))
    view = np.lib.stride_tricks.sliding_window_view(view, window, axis=view.ndim - 1)  # a contiguous last axis
    order = data.draw(st.permutations(range(view.ndim - 1)))
    view = view.transpose(*order, view.ndim - 1)
    if data.draw(st.booleans()):
        view = np.broadcast_to(view[None], (2, *view.shape))
    copy = contiguous_copy(view)
    assert copy.flags.c_contiguous and copy.dtype == view.dtype and copy.shape == view.shape
    assert np.array_equal(copy, np.ascontiguousarray(view))
    assert np.shares_memory(copy, array) == view.flags.c_contiguous


def test_feature_shape_follows_the_variables_own_dim_order():
    grid = SampleGrid((Axis.iterate("time", 10), Axis.keep("level", 3), Axis.window("lat", 20, 9, 9)))
    assert grid.feature_shape(("lat", "level", "time")) == ((9, 3), ("lat", "level"))
    assert grid.shape == (10, 2)


def test_offsets_give_pairs_and_first_index():
    axis = Axis.offsets("time", 10, [0, 4])
    assert axis.count == 6 and axis.span == 5
    assert axis.element_indices(np.array([0, 5])).tolist() == [[0, 4], [5, 9]]
    negative = Axis.offsets("time", 10, [0, -1])
    assert negative.steps == (1, 0) and negative.to_json()["offsets"] == [0, -1]
    # A sample's index is its element at offset 0, and it takes index + each offset.
    assert negative.first_index(np.array([0, 3])).tolist() == [1, 4]
    assert negative.element_indices(np.array([0, 3])).tolist() == [[1, 0], [4, 3]]


def test_units_prefer_file_boundaries():
    grid = SampleGrid((Axis.iterate("time", 40), Axis.window("lat", 9, 3, 3)))
    cost = UnitCost((), bytes_per_sample=1 / 3)  # one byte per time step (3 samples)
    units = plan_units(grid, cost, budget_bytes=10, first_dim="time", preferred_breaks=[8, 16, 24, 32])
    assert [u.ranges for u in units] == [((a, b), (0, 3)) for a, b in [(0, 8), (8, 16), (16, 24), (24, 32), (32, 40)]]


def test_a_file_longer_than_a_unit_is_cut_in_even_units():
    """4-step files with room for 3 steps a unit: 2 + 2 steps, not 3 + 1 (a local runner deals units to its
    threads in turn: 3 + 1 gave one thread every large unit); no unit over the budget, none across a file."""
    grid = SampleGrid((Axis.iterate("time", 16), Axis.window("lat", 9, 3, 3)))
    cost = UnitCost((), bytes_per_sample=1 / 3)  # one byte per time step (3 samples)
    units = plan_units(grid, cost, budget_bytes=3, first_dim="time", preferred_breaks=[4, 8, 12])
    assert [u.ranges[0] for u in units] == [(a, a + 2) for a in range(0, 16, 2)]
    # Without breaks, as few units as fit, their lengths at most one apart.
    units = plan_units(grid, cost, budget_bytes=5, first_dim="time")
    assert [u.ranges[0] for u in units] == [(0, 4), (4, 8), (8, 12), (12, 16)]
    grid = SampleGrid((Axis.iterate("time", 11), Axis.window("lat", 9, 3, 3)))
    lengths = [b - a for (a, b), _ in (u.ranges for u in plan_units(grid, cost, 5, "time", [3]))]
    assert lengths == [3, 4, 4]  # the first file whole; the 8 steps after it in 2 of 4, not 5 + 3


def test_a_step_larger_than_the_budget_is_split_along_the_window_dims():
    """ERA5's shape: 5 variables x 37 levels x 721 x 1440 float32 are 768 MB per step."""
    dims = ("time", "level", "lat", "lon")
    grid = SampleGrid(
        (
            Axis.iterate("time", 24),
            Axis.keep("level", 37),
            Axis.window("lat", 721, 9, 9),
            Axis.window("lon", 1440, 9, 9),
        )
    )
    record = 5 * 37 * 81 * 4
    cost = UnitCost(((dims, 4),) * 5, 3 * record)
    assert cost(grid, [(0, 1), (0, 80), (0, 160)]) > 700e6  # one step
    units = plan_units(grid, cost, 64e6, "time", preferred_breaks=[12])
    assert all(cost(grid, u.ranges) <= 64e6 for u in units)
    assert {u.ranges[0][1] - u.ranges[0][0] for u in units} == {1}  # one step per unit
    assert {u.ranges[2] for u in units} == {(0, 160)}  # lon whole: each unit reads 5 x 37 long runs of bytes
    first_step = [u.ranges[1] for u in units if u.ranges[0] == (0, 1)]
    assert [a for a, _ in first_step] == [0, *[b for _, b in first_step[:-1]]] and first_step[-1][1] == 80
    widest = max(b - a for a, b in first_step)
    assert cost(grid, [(0, 1), (0, widest + 1), (0, 160)]) > 64e6  # as many lat positions as fit
    assert len(units) == 24 * len(first_step)
    assert [u.index for u in units] == list(range(len(units)))


def test_a_unit_is_one_position_when_even_that_exceeds_the_budget():
    grid = SampleGrid((Axis.iterate("time", 3), Axis.window("lat", 7, 2, 1), Axis.window("lon", 5, 3, 2)))
    units = plan_units(grid, UnitCost(((("time", "lat", "lon"), 8),), 100.0), 1, "time")
    assert len(units) == grid.num_samples and all(u.num_samples == 1 for u in units)


def test_absurdly_many_units_are_refused_before_they_are_made():
    """4 billion one-sample units (a budget nothing fits): one line naming the counts, not a driver that grows."""
    grid = SampleGrid((Axis.iterate("time", 2**20), Axis.iterate("cell", 2**12)))
    with pytest.raises(UserError, match=r"up to 4,294,967,296 work units \(time 1,048,576, cell 4,096\)"):
        plan_units(grid, UnitCost(((("time", "cell"), 8),), 100.0), 1, "time")


@pytest.mark.parametrize("size", [1, 5])
def test_a_window_that_does_not_fit_gives_no_positions(size):
    assert Axis.window("lat", 4, 5, size).count == 0


def _old_enumeration(spans, order, kept):
    """The units as planning made them before Units: one object each, product over ``order``, then filtered."""
    units = []
    for index, picked in enumerate(itertools.product(*(spans[which] for which in order))):
        ranges = dict(zip(order, picked))
        units.append(Unit(index, tuple(tuple(ranges[which]) for which in range(len(spans)))))
    for which, keep in kept.items():
        allowed = {tuple(span) for span, k in zip(spans[which], keep) if k}
        units = [u for u in units if u.ranges[which] in allowed]
    return [Unit(i, u.ranges) for i, u in enumerate(units)]


@settings(max_examples=200, deadline=None)
@given(data=st.data(), lengths=st.lists(st.integers(0, 5), max_size=4))
def test_units_are_numbered_and_filtered_as_the_old_enumeration(data, lengths):
    spans = [[(i, i + 1 + (i % 2)) for i in range(n)] for n in lengths]
    order = data.draw(st.permutations(range(len(lengths))))
    kept = {w: data.draw(st.lists(st.booleans(), min_size=n, max_size=n)) for w, n in enumerate(lengths) if n}
    kept = {w: k for w, k in kept.items() if data.draw(st.booleans())}
    units = Units.of([np.array(s).reshape(-1, 2) for s in spans], order)
    for which, keep in kept.items():
        units = units.keep(which, np.array(keep, dtype=bool))
    expected = _old_enumeration(spans, order, kept)
    assert list(units) == expected and len(units) == len(expected)
    assert all(isinstance(v, int) for u in units for r in u.ranges for v in r)  # plain ints, as pickled before
    if expected:
        i = data.draw(st.integers(-len(expected), len(expected) - 1))
        assert units[i] == expected[i]
        count = data.draw(st.integers(1, 2 * len(expected)))
        slices = units.slices(count)
        assert len(slices) <= count and [u for a, b in slices for u in units.ranges(a, b)] == expected
    with pytest.raises(IndexError):
        units[len(expected)]
    assert list(Units.from_bytes(units.to_bytes())) == expected


def test_units_of_a_huge_plan_are_arrays_not_objects():
    """30M units (3,000 x 10,000 spans): planning and indexing hold the spans only."""
    units = Units.of(
        [np.column_stack([np.arange(3000), np.arange(1, 3001)]), [(i, i + 2) for i in range(10_000)]], (0, 1)
    )
    assert len(units) == 30_000_000 and len(units.to_bytes()) < 300_000
    assert units[29_999_999] == Unit(29_999_999, ((2999, 3000), (9999, 10001)))
    assert [u.index for u in units.ranges(12_345_678, 12_345_681)] == [12_345_678, 12_345_679, 12_345_680]
