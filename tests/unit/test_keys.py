"""Shuffle keys: unique, seed-dependent, evenly spread over shards, and a real permutation."""

from __future__ import annotations

import numpy as np
from scipy import stats

from planning.keys import sample_keys, shard_of


def test_distinct_ids_get_distinct_keys():
    ids = np.arange(2_000_000)
    keys = np.sort(sample_keys(ids, 7))  # not np.unique: numpy 2.4's hashing takes 70x as long over 2M keys
    assert (keys[1:] != keys[:-1]).all()


def test_keys_depend_only_on_id_and_seed():
    ids = np.array([5, 1, 99, 5])
    keys = sample_keys(ids, 3)
    assert keys[0] == keys[3]
    np.testing.assert_array_equal(sample_keys(ids[::-1], 3), keys[::-1])
    assert not np.array_equal(sample_keys(ids, 4), keys)


def test_shards_are_balanced_for_every_seed():
    ids = np.arange(200_000)
    for seed in range(5):
        counts = np.bincount(shard_of(sample_keys(ids, seed), 7), minlength=7)
        assert stats.chisquare(counts).pvalue > 1e-4, counts


def test_sorting_by_key_is_unrelated_to_archive_order():
    ids = np.arange(50_000)
    order = np.argsort(sample_keys(ids, 0))
    rho = stats.spearmanr(np.arange(len(ids)), order).statistic
    assert abs(rho) < 0.02
    other = np.argsort(sample_keys(ids, 1))
    assert abs(stats.spearmanr(order, other).statistic) < 0.02
