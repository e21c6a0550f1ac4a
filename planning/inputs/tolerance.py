"""Whether two files' grid coordinates agree within input.coord_tolerance, and if not, by how much they differ."""

from __future__ import annotations

import dataclasses

import numpy as np

#: float32's relative rounding: two float32 roundings of one value differ by at most this times it.
FLOAT32_RELATIVE = float(np.finfo(np.float32).eps)


@dataclasses.dataclass(frozen=True)
class Mismatch:
    """The largest difference between two coordinates and where it is."""

    index: int
    value: object  # the other file's value there
    reference: object  # the first file's
    difference: float | None  # None for values that are not numbers (times, text)
    allowed: float | None  # the tolerance there


def allowed_difference(reference: np.ndarray, values: np.ndarray, tolerance: str | float) -> np.ndarray:
    """The difference each pair of values may have."""
    if tolerance == "float32":
        return FLOAT32_RELATIVE * np.maximum(np.abs(reference), np.abs(values))
    return np.full(reference.shape, float(tolerance))


def coordinate_mismatch(values: np.ndarray, reference: np.ndarray, tolerance: str | float) -> Mismatch | None:
    """None when ``values`` equal ``reference`` (same length) within ``tolerance``; else the largest difference.

    Numbers agree within the tolerance; other values (times, text) must be equal.
    """
    if np.array_equal(values, reference):
        return None
    if values.dtype.kind in "fiu" and reference.dtype.kind in "fiu":
        other, first = values.astype(np.float64), reference.astype(np.float64)
        difference = np.abs(other - first)
        allowed = allowed_difference(first, other, tolerance)
        both_nan = np.isnan(other) & np.isnan(first)
        beyond = ~both_nan & ~(difference <= allowed)  # a NaN against a number is beyond any tolerance
        if not beyond.any():
            return None
        index = int(np.argmax(np.where(beyond, np.nan_to_num(difference, nan=np.inf), -1.0)))
        return Mismatch(index, values[index], reference[index], float(difference[index]), float(allowed[index]))
    index = int(np.flatnonzero(values != reference)[0])
    return Mismatch(index, values[index], reference[index], None, None)


def describe_tolerance(tolerance: str | float, allowed: float | None) -> str:
    """The tolerance as a message names it, with what it allows where the values differ most."""
    if tolerance == "float32":
        there = f", {allowed:.2g} there" if allowed is not None else ""
        return f"float32: {FLOAT32_RELATIVE:.2g} times the value{there}"
    return f"{float(tolerance):g}"
