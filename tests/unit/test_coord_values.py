"""Coordinate values as records hold them: times kept as numbers are not rounded by float32."""

from __future__ import annotations

import numpy as np

from planning.inputs.coords import record_values


def test_whole_times_kept_as_numbers_are_stored_exactly_as_int64():
    # Seconds since 1970 in float64, as many files store them: float32 would round these by 64 s.
    stored = np.array([1_700_000_001.0, 1_700_003_601.0])
    values, attrs = record_values(stored, {"units": "seconds since 1970-01-01", "calendar": "noleap"})
    assert values.dtype == np.int64 and values.tolist() == [1_700_000_001, 1_700_003_601]
    assert attrs == {"units": "seconds since 1970-01-01", "calendar": "noleap"}
    assert np.float32(stored[0]) != stored[0]  # what float32 would have stored


def test_other_floats_stay_float32():
    fractional, _ = record_values(np.array([0.5, 1.5]), {"units": "days since 2000-01-01"})
    levels, _ = record_values(np.array([500.0, 850.0]), {"units": "hPa"})  # whole, but not times
    with_nan, _ = record_values(np.array([1.0, np.nan]), {"units": "hours since 1800-01-01"})
    assert fractional.dtype == levels.dtype == with_nan.dtype == np.float32
