"""Statistics: pairwise float64 merges equal numpy over all values, where float32 sums fail."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from transforms.stats import Moments, merge_moments


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.integers(0, 50), min_size=1, max_size=8), seed=st.integers(0, 1000))
def test_merged_parts_equal_numpy_over_the_whole(sizes, seed):
    rng = np.random.default_rng(seed)
    parts = [rng.normal(rng.uniform(-100, 100), rng.uniform(0.1, 50), n).astype(np.float32) for n in sizes]
    for part in parts:
        if len(part) > 2:
            part[::3] = np.nan
    merged = merge_moments([{"x": Moments.of(p)} for p in parts])["x"].to_json()
    values = np.concatenate(parts).astype(np.float64)
    finite = values[~np.isnan(values)]
    assert merged["nan_count"] == int(np.isnan(values).sum())
    assert merged["count"] == len(finite)
    if len(finite):
        assert merged["mean"] == pytest.approx(finite.mean(), rel=1e-12, abs=1e-12)
        assert merged["variance"] == pytest.approx(finite.var(), rel=1e-9, abs=1e-12)
        assert (merged["min"], merged["max"]) == (finite.min(), finite.max())
    else:
        assert merged["mean"] is None and merged["std"] is None


def test_large_mean_small_spread_keeps_its_precision():
    # Pressure in Pa: mean 1e5, std 1. A float32 sum of squares loses everything here.
    rng = np.random.default_rng(0)
    blocks = [(1e5 + rng.normal(0, 1, 10_000)).astype(np.float32) for _ in range(20)]
    merged = merge_moments([{"p": Moments.of(b)} for b in blocks])["p"]
    reference = np.concatenate(blocks).astype(np.float64)
    assert merged.m2 / merged.count == pytest.approx(reference.var(), rel=1e-9)
    x = np.concatenate(blocks)
    naive = np.float32(np.sum(x * x, dtype=np.float32) / len(x)) - np.float32(np.mean(x, dtype=np.float32)) ** 2
    assert abs(naive - reference.var()) / reference.var() > 0.5  # why the float64 pairwise merge is needed
