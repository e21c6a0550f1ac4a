"""Sample geometry: cutting units of a grid equals cutting the whole array, sample by sample."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planning.sampling import Axis, SampleGrid, plan_units


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


@settings(max_examples=300, deadline=None)
@given(grid=grids(), budget=st.integers(1, 12), breaks=st.lists(st.integers(0, 9), max_size=3), data=st.data())
def test_units_cut_exactly_the_samples_of_the_whole_array(grid, budget, breaks, data):
    shape = tuple(a.length for a in grid.axes)
    dims = [a.dim for a in grid.axes]
    array = np.arange(np.prod(shape), dtype=np.float64).reshape(shape)
    grid_dims = [a.dim for a in grid.grid_axes]
    split = data.draw(st.sampled_from(grid_dims)) if grid_dims else "time"
    units = plan_units(grid, split, 1.0, budget, breaks)
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


def test_feature_shape_follows_the_variables_own_dim_order():
    grid = SampleGrid((Axis.iterate("time", 10), Axis.keep("level", 3), Axis.window("lat", 20, 9, 9)))
    assert grid.feature_shape(("lat", "level", "time")) == ((9, 3), ("lat", "level"))
    assert grid.shape == (10, 2)


def test_offsets_give_pairs_and_first_index():
    axis = Axis.offsets("time", 10, [0, 4])
    assert axis.count == 6 and axis.span == 5
    assert axis.element_indices(np.array([0, 5])).tolist() == [[0, 4], [5, 9]]
    negative = Axis.offsets("time", 10, [1, -1])
    assert negative.steps == (2, 0)
    assert negative.first_index(np.array([0])).tolist() == [2]


def test_units_prefer_file_boundaries():
    grid = SampleGrid((Axis.iterate("time", 40), Axis.window("lat", 9, 3, 3)))
    units = plan_units(grid, "time", bytes_per_position=1.0, budget_bytes=10, preferred_breaks=[8, 16, 24, 32])
    assert [u.ranges[0] for u in units] == [(0, 8), (8, 16), (16, 24), (24, 32), (32, 40)]


@pytest.mark.parametrize("size", [1, 5])
def test_a_window_that_does_not_fit_gives_no_positions(size):
    assert Axis.window("lat", 4, 5, size).count == 0
