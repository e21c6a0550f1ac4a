"""Statistics: pairwise float64 merges equal numpy over all values, per dim too, where float32 sums fail."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from transforms.stats import Moments


def merged(parts, keep_axes=()):
    return functools.reduce(Moments.merge, (Moments.of(p, keep_axes) for p in parts))


@given(sizes=st.lists(st.integers(0, 50), min_size=1, max_size=8), seed=st.integers(0, 1000))
def test_merged_parts_equal_numpy_over_the_whole(sizes, seed):
    rng = np.random.default_rng(seed)
    parts = [rng.normal(rng.uniform(-100, 100), rng.uniform(0.1, 50), n).astype(np.float32) for n in sizes]
    for part in parts:
        if len(part) > 2:
            part[::3] = np.nan
        if len(part) > 4:
            part[1] = np.inf
    result = merged(parts).to_json()
    values = np.concatenate(parts).astype(np.float64)
    finite = values[np.isfinite(values)]
    assert result["nan_count"] == int(np.isnan(values).sum())
    assert result["inf_count"] == int(np.isinf(values).sum())
    assert result["count"] == len(finite)
    if len(finite):
        assert result["mean"] == pytest.approx(finite.mean(), rel=1e-12, abs=1e-12)
        assert result["variance"] == pytest.approx(finite.var(), rel=1e-9, abs=1e-12)
        assert (result["min"], result["max"]) == (finite.min(), finite.max())
    else:
        assert result["mean"] is None and result["std"] is None


def test_per_level_statistics_equal_numpy_per_level():
    rng = np.random.default_rng(1)
    # blocks of samples shaped (sample, level, lat, lon), each level with its own mean
    blocks = [rng.normal([[[200.0]], [[250.0]], [[300.0]]], 5.0, (n, 3, 4, 5)) for n in (7, 0, 12)]
    result = merged(blocks, keep_axes=[1]).to_json(["level"])
    whole = np.concatenate(blocks)
    assert result["dims"] == ["level"]
    np.testing.assert_allclose(result["mean"], whole.mean(axis=(0, 2, 3)), rtol=1e-12)
    np.testing.assert_allclose(result["variance"], whole.var(axis=(0, 2, 3)), rtol=1e-9)
    assert result["count"] == [19 * 20] * 3


def test_large_mean_small_spread_keeps_its_precision():
    # Pressure in Pa: mean 1e5, std 1. A float32 sum of squares loses everything here.
    rng = np.random.default_rng(0)
    blocks = [(1e5 + rng.normal(0, 1, 10_000)).astype(np.float32) for _ in range(20)]
    reference = np.concatenate(blocks).astype(np.float64)
    assert float(merged(blocks).variance) == pytest.approx(reference.var(), rel=1e-9)
    x = np.concatenate(blocks)
    naive = np.float32(np.sum(x * x, dtype=np.float32) / len(x)) - np.float32(np.mean(x, dtype=np.float32)) ** 2
    assert abs(naive - reference.var()) / reference.var() > 0.5  # why the float64 pairwise merge is needed


def test_moments_of_an_all_nan_block():
    m = Moments.of(np.full(4, np.nan, np.float32))
    assert (int(m.count), int(m.nan_count)) == (0, 4)
    assert m.to_json()["mean"] is None


def test_non_finite_values_are_counted_per_split_and_merge_to_the_first_unit():
    from planning.run.contracts import NonFinite
    from transforms.cut import count_nonfinite
    from transforms.stats import SplitSummary

    values = np.ones((4, 2, 3), dtype=np.float32)
    values[0, 0, 0] = np.nan
    values[2, 1] = [np.inf, -np.inf, np.nan]
    data = {"t": values, "n": np.zeros((4, 2), dtype=np.int64), "empty": np.zeros((4, 0), dtype=np.float32)}
    train, test = count_nonfinite(data, np.array([0, 1, 0, 1]), 2, unit=7)
    assert train == {"t": NonFinite(12, 2, 2, 7), "empty": NonFinite(0, 0, 0, None)}
    assert test == {"t": NonFinite(12, 0, 0, None), "empty": NonFinite(0, 0, 0, None)}
    assert count_nonfinite({"t": values[:0]}, np.array([], dtype=int), 1, unit=0) == [{}]
    later = SplitSummary({}, nonfinite={"t": NonFinite(6, 1, 0, 9)})
    merged = later.merge(SplitSummary({}, nonfinite=train)).merge(SplitSummary({}, nonfinite=test))
    assert merged.nonfinite["t"] == NonFinite(30, 3, 2, 7)


def test_filled_values_are_left_out_and_counted_apart():
    """nan_policy: fill stores 0.0 over land; the statistics are those of the ocean alone, per level too."""
    rng = np.random.default_rng(4)
    blocks = [rng.normal([[[283.0]], [[270.0]]], 10.0, (n, 2, 4, 5)) for n in (6, 3, 9)]
    blocks[0][:, :, :2, :] = np.nan  # land in the first block only: the others take the fast path
    blocks[2][0, 1] = np.nan
    real = np.concatenate(blocks)
    masks = [np.isnan(b) for b in blocks]
    stored = [np.where(m, 0.0, b).astype(np.float32) for b, m in zip(blocks, masks)]
    parts = [Moments.of(s, [1], m) for s, m in zip(stored, masks)]
    result = functools.reduce(Moments.merge, parts).to_json(["level"])
    expected = real.astype(np.float32).astype(np.float64)
    np.testing.assert_allclose(result["mean"], np.nanmean(expected, axis=(0, 2, 3)), rtol=1e-12)
    np.testing.assert_allclose(result["std"], np.nanstd(expected, axis=(0, 2, 3)), rtol=1e-9)
    np.testing.assert_array_equal(result["min"], np.nanmin(expected, axis=(0, 2, 3)))
    assert result["filled_count"] == np.isnan(real).sum(axis=(0, 2, 3)).tolist()
    assert result["count"] == (~np.isnan(real)).sum(axis=(0, 2, 3)).tolist()
    assert result["nan_count"] == [0, 0]  # nothing stored is NaN: the filled values are counted apart
    # Hostile: without the mask the fill is taken for data, which is the bug the mask prevents.
    unmasked = functools.reduce(Moments.merge, (Moments.of(s, [1]) for s in stored)).to_json(["level"])
    assert unmasked["min"][0] == 0.0 and unmasked["filled_count"] == [0, 0]


def test_a_stored_nan_beside_filled_values_is_still_a_nan():
    values = np.array([1.0, 0.0, np.nan, 3.0, np.inf], np.float32)  # 0.0 at index 1 was filled
    filled = np.array([False, True, False, False, False])
    m = Moments.of(values, filled=filled).to_json()
    assert (m["count"], m["nan_count"], m["inf_count"], m["filled_count"]) == (2, 1, 1, 1)
    assert m["mean"] == 2.0


def test_integer_values_and_kept_axes_anywhere_equal_numpy():
    rng = np.random.default_rng(7)
    counts = rng.integers(-(2**40), 2**40, (11, 3, 4, 2), dtype=np.int64)  # an int64 variable, beyond float32
    for keep in ([], [1], [3], [1, 3]):
        result = Moments.of(counts, keep)
        others = tuple(a for a in range(4) if a not in keep)
        exact = counts.astype(np.float64)
        np.testing.assert_allclose(result.mean, exact.mean(axis=others), rtol=1e-12)
        np.testing.assert_allclose(result.variance, exact.var(axis=others), rtol=1e-9)
        np.testing.assert_array_equal(result.minimum, exact.min(axis=others))
        np.testing.assert_array_equal(result.maximum, exact.max(axis=others))


def test_a_level_filled_throughout_has_no_moments_and_leaves_the_others_exact():
    rng = np.random.default_rng(8)
    values = rng.normal(280.0, 3.0, (5, 3, 4)).astype(np.float32)
    filled = np.zeros(values.shape, dtype=bool)
    filled[:, 1] = True  # every value of level 1 was NaN, and filled
    filled[0, 2, :2] = True
    values[filled] = -999.0  # the fill value: no moment may see it
    result = Moments.of(values, [1], filled).to_json(["level"])
    assert result["count"] == [20, 0, 18] and result["filled_count"] == [0, 20, 2]
    assert result["mean"][1] is None and result["min"][1] is None and result["max"][1] is None
    real = np.where(filled, np.nan, values.astype(np.float64))
    for level in (0, 2):
        np.testing.assert_allclose(result["mean"][level], np.nanmean(real[:, level]), rtol=1e-12)
        np.testing.assert_allclose(result["variance"][level], np.nanvar(real[:, level]), rtol=1e-9)
        assert (result["min"][level], result["max"][level]) == (np.nanmin(real[:, level]), np.nanmax(real[:, level]))


def test_stored_cells_are_the_union_of_role_features_and_role_stacks_channels():
    """A role stack stores each channel's variable at its steps; a cropped role adds its crop; a cell held by two
    roles is one cell; a variable no role holds (or a build without roles) is stored whole."""
    from planning.features import (
        CHANNEL_AXIS_KEY,
        CHANNELS_KEY,
        CROP_KEY,
        ROLE_KEY,
        STEPS_KEY,
        VARIABLE_KEY,
        stored_cells,
    )
    from schemas.schema import Feature
    from transforms.stats import stored_values

    stack = Feature(
        "inputs/fields",
        "float32",
        (2, 2, 4),
        ("channel", "time", "lat"),
        "variable",
        {ROLE_KEY: "inputs", STEPS_KEY: {"time": [0, 1]}, CHANNELS_KEY: ["t", "u"], CHANNEL_AXIS_KEY: 0},
    )
    target = Feature(
        "targets/t",
        "float32",
        (2, 2),
        ("time", "lat"),
        "variable",
        {ROLE_KEY: "targets", VARIABLE_KEY: "t", STEPS_KEY: {"time": [1, 2]}, CROP_KEY: {"lat": [1, 3]}},
    )
    t = stored_cells([stack, target], "t", (3, 4))
    np.testing.assert_array_equal(t, [[1, 1, 1, 1], [1, 1, 1, 1], [0, 1, 1, 0]])
    np.testing.assert_array_equal(stored_cells([stack, target], "u", (3, 4)), [[1] * 4, [1] * 4, [0] * 4])
    assert stored_cells([stack, target], "v", (3, 4)) is None
    assert stored_cells([Feature("t", "float32", (3, 4), ("time", "lat"), "variable")], "t", (3, 4)) is None
    # A block of 5 samples x 2 levels (kept, between the dims) x 3 steps x 4 lats: per level, each sample's 10 cells.
    values = np.arange(5 * 3 * 2 * 4, dtype=np.float32).reshape(5, 3, 2, 4)  # (sample, time, level, lat)
    stored = np.broadcast_to(t[:, None, :], (3, 2, 4))
    got, filled, axes = stored_values(values, None, [2], stored)
    assert axes == [1] and filled is None and got.shape == (5, 2, 10)
    np.testing.assert_array_equal(got[3, 1], values[3, :, 1][t])
