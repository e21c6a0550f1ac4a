"""A fresh global order of a split's samples every epoch, in O(1) memory, the same on every machine.

``epoch_order(n, seed, epoch, positions)`` is a seeded bijection of ``[0, n)`` (a Feistel
network on the smallest even power of two at least n, cycle-walked into range), evaluated
per position: no shuffled list of n indices is ever held. Seeds and epochs are whole numbers in
``0..2**64-1`` (the round keys are 64-bit): others are refused, never folded onto one of those.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from schemas.errors import UserError

_ROUNDS = 6
_MASK64 = (1 << 64) - 1


def checked_word(value, name: str) -> int:
    """``value`` as an int if it is a whole number in 0..2**64-1 (a seed, an epoch), else UserError naming ``name``.

    Outside that range a seed would alias another (the keys are taken modulo 2**64): two seeds, one order.
    """
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise UserError(f"{name}: {value!r} is not a whole number; pass an int from 0 to 2**64-1")
    if not 0 <= int(value) <= _MASK64:
        raise UserError(f"{name}: {value} is outside 0..2**64-1; pass an int in that range")
    return int(value)


def _mix(value: int) -> int:
    """splitmix64's finaliser on a Python int: the round keys."""
    value = (value + 0x9E3779B97F4A7C15) & _MASK64
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _MASK64
    return value ^ (value >> 31)


def _mix_array(values: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser on uint64 arrays (wrapping multiplication, as on every machine)."""
    with np.errstate(over="ignore"):
        values = values ^ (values >> np.uint64(30))
        values = values * np.uint64(0xBF58476D1CE4E5B9)
        values = values ^ (values >> np.uint64(27))
        values = values * np.uint64(0x94D049BB133111EB)
        return values ^ (values >> np.uint64(31))


def _round_keys(seed: int, epoch: int) -> list[np.uint64]:
    base = _mix(_mix(seed) ^ epoch)
    return [np.uint64(_mix(base + r)) for r in range(_ROUNDS)]


def _feistel(values: np.ndarray, keys: list[np.uint64], half: int) -> np.ndarray:
    mask = np.uint64((1 << half) - 1)
    shift = np.uint64(half)
    left, right = values >> shift, values & mask
    for key in keys:
        left, right = right, left ^ (_mix_array(right ^ key) & mask)
    return (left << shift) | right


def epoch_order(num_samples: int, seed: int, epoch: int, positions: ArrayLike | None = None) -> np.ndarray:
    """The sample at each position of an epoch's order: a seeded bijection of ``[0, num_samples)``.

    Different for every seed and epoch; every sample once per epoch; the same on every machine. The
    array form of all positions is for tests and small splits: pass positions to read a large one piecewise.

    Args:
        num_samples: the split's sample count n.
        seed: a whole number in 0..2**64-1.
        epoch: a whole number in 0..2**64-1.
        positions: some of ``range(num_samples)`` (an array or sequence of ints); None: all of them.

    Returns:
        An int64 array: the sample index at each position.

    Raises:
        UserError: a seed or epoch that is not a whole number in range.
        IndexError: a position outside ``[0, num_samples)``.
    """
    seed, epoch = checked_word(seed, "seed"), checked_word(epoch, "epoch")
    n = int(num_samples)
    if n < 0:
        raise ValueError(f"num_samples must be at least 0, not {n}")
    where = np.arange(n, dtype=np.int64) if positions is None else np.asarray(positions, dtype=np.int64)
    if where.size and (where.min() < 0 or where.max() >= n):
        raise IndexError(f"positions must be in [0, {n})")
    if n <= 1:
        return where.copy()
    half = max(1, ((n - 1).bit_length() + 1) // 2)  # 2 * half bits hold every index below n
    keys = _round_keys(seed, epoch)
    out = _feistel(where.astype(np.uint64), keys, half)
    # Cycle-walking: a value outside [0, n) is permuted again until it falls inside (fewer than 4 times on average).
    outside = out >= np.uint64(n)
    while outside.any():
        out[outside] = _feistel(out[outside], keys, half)
        outside = out >= np.uint64(n)
    return out.astype(np.int64)
