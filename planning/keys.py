"""Shuffle keys: a seeded bijective hash of each sample's id, which also picks its shard.

Sorting a shard by key is the shuffle (docs/design.md, decision 2). Keys depend only on the seed
and the sample's position, never on content, order of processing or ``random``: a retried or
rebalanced worker computes the same keys, so the output is byte-identical on any runner.
Every step of the hash is a bijection on 64-bit integers, so distinct ids get distinct keys.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _mix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64's output function: a bijection that mixes every input bit into every output bit."""
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def sample_keys(sample_ids: np.ndarray, seed: int) -> np.ndarray:
    """uint64 shuffle key of each sample id under ``seed``."""
    with np.errstate(over="ignore"):
        salt = _mix64(np.array([seed], dtype=np.uint64) * _GOLDEN + _GOLDEN)
        ids = np.asarray(sample_ids, dtype=np.int64).view(np.uint64)
        return _mix64(_mix64(ids + salt) ^ salt)


def shard_of(keys: np.ndarray, num_shards: int | np.ndarray) -> np.ndarray:
    """Shard index in [0, num_shards) of each key, from its high bits (uniform for any count)."""
    counts = np.asarray(num_shards, dtype=np.uint64)
    return ((keys >> np.uint64(32)) * counts >> np.uint64(32)).astype(np.int64)


def keys_and_shards(
    sample_ids: np.ndarray, labels: np.ndarray, seed: int, splits: Sequence
) -> tuple[np.ndarray, np.ndarray]:
    """Each sample's shuffle key and its shard numbered across splits.

    ``labels``: each sample's split index into ``splits`` (which have ``num_shards`` and
    ``first_shard``); the key picks the shard within the split.
    """
    keys = sample_keys(sample_ids, seed)
    labels = np.asarray(labels, dtype=np.int64)
    counts = np.array([s.num_shards for s in splits], dtype=np.uint64)[labels]
    firsts = np.array([s.first_shard for s in splits], dtype=np.int64)[labels]
    return keys, firsts + shard_of(keys, counts)
