"""Coordinate values as records hold them (times kept as numbers are not rounded by float32); regular steps."""

from __future__ import annotations

import datetime

import cftime
import numpy as np
import pytest

from planning.inputs.coords import irregular_steps, record_values


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


def six_hourly(shift_hours: float = 0.0) -> np.ndarray:
    """Two files of 6-hourly times; the second's shifted by ``shift_hours`` (the step between them 6 h + shift)."""
    first = np.datetime64("2000-01-01T00") + np.arange(8) * np.timedelta64(6, "h")
    second = first[-1] + np.timedelta64(6, "h") + np.arange(8) * np.timedelta64(6, "h")
    return np.concatenate([first, second + np.timedelta64(int(shift_hours * 60), "m")]).astype("datetime64[ns]")


def test_regular_six_hourly_steps_are_regular():
    assert not irregular_steps(six_hourly()).any()


@pytest.mark.parametrize("shift_hours", [3, -2, 1])  # a 9 h, a 4 h and a 7 h step between the files
def test_a_shifted_file_of_six_hourly_times_makes_its_step_irregular(shift_hours):
    irregular = irregular_steps(six_hourly(shift_hours))
    assert irregular.tolist() == [i == 7 for i in range(15)], irregular


def test_a_missing_day_is_a_gap():
    days = np.datetime64("2001-03-01") + np.array([d for d in range(40) if d != 17]) * np.timedelta64(1, "D")
    assert np.flatnonzero(irregular_steps(days)).tolist() == [16]


def test_weekly_steps_and_numeric_steps_are_exact():
    weeks = np.datetime64("2001-01-01") + np.array([0, 7, 14, 21, 29, 36]) * np.timedelta64(1, "D")
    assert np.flatnonzero(irregular_steps(weeks)).tolist() == [3]
    levels = np.array([1000.0, 975.0, 950.0, 925.0, 900.0, 870.0, 850.0], dtype=np.float32)  # descending
    assert np.flatnonzero(irregular_steps(levels)).tolist() == [4, 5]
    tenths = (np.arange(2000) * 0.1 + 100).astype(np.float32)  # float32 rounding is not a gap
    assert not irregular_steps(tenths).any()
    members = np.array([0, 1, 2, 4, 5])
    assert np.flatnonzero(irregular_steps(members)).tolist() == [2]


def dates(calendar: str, years: range, day: int, hour: int = 0) -> np.ndarray:
    return np.array([cftime.datetime(y, m, day, hour, calendar=calendar) for y in years for m in range(1, 13)])


@pytest.mark.parametrize("calendar", ["standard", "gregorian", "proleptic_gregorian", "julian", "noleap", "360_day"])
@pytest.mark.parametrize(("day", "hour"), [(1, 0), (15, 12)])  # the 1st of each month, or mid-month
def test_monthly_means_over_years_are_regular_in_every_calendar(calendar, day, hour):
    monthly = dates(calendar, range(1999, 2005), day, hour)  # 2000 and 2004 are leap years
    assert not irregular_steps(monthly).any()
    missing_march = np.delete(monthly, 14)  # a month missing: a gap
    assert np.flatnonzero(irregular_steps(missing_march)).tolist() == [13]


def test_monthly_datetimes_and_month_midpoints_are_regular():
    starts = np.arange("1999-01", "2005-02", dtype="datetime64[M]").astype("datetime64[ns]")
    assert not irregular_steps(starts).any()
    middles = starts[:-1] + (starts[1:] - starts[:-1]) / 2  # CMIP-like: the middle of each month's bounds
    assert not irregular_steps(middles).any()


def test_a_360_day_month_is_thirty_days_exactly():
    monthly = dates("360_day", range(2000, 2003), 1)
    monthly[10] = cftime.datetime(2000, 11, 2, calendar="360_day")  # a day late: 31 and 29 days
    assert np.flatnonzero(irregular_steps(monthly)).tolist() == [9, 10]


def yearly(calendar: str) -> np.ndarray:
    return np.array([cftime.datetime(y, 7, 1, calendar=calendar) for y in range(1990, 2011)])


@pytest.mark.parametrize("calendar", ["standard", "noleap", "360_day"])
def test_yearly_steps_over_leap_years_are_regular_and_a_missing_year_is_a_gap(calendar):
    assert not irregular_steps(yearly(calendar)).any()
    assert np.flatnonzero(irregular_steps(np.delete(yearly(calendar), 5))).tolist() == [4]
    datetimes = np.arange("1990", "2011", dtype="datetime64[Y]").astype("datetime64[ns]")
    assert not irregular_steps(datetimes).any()


@pytest.mark.parametrize(("calendar", "days"), [("standard", 365), ("noleap", 365), ("360_day", 360)])
def test_yearly_steps_a_month_off_between_files_are_irregular(calendar, days):
    shifted = yearly(calendar)
    shifted[10:] = shifted[10:] + datetime.timedelta(days=days // 12)
    assert np.flatnonzero(irregular_steps(shifted)).tolist() == [9]


def test_times_kept_as_numbers_use_their_units_and_calendar():
    months = np.asarray(cftime.date2num(list(dates("noleap", range(2000, 2004), 1)), "days since 2000-01-01", "noleap"))
    noleap = {"units": "days since 2000-01-01", "calendar": "noleap"}
    assert not irregular_steps(months, noleap).any()
    assert irregular_steps(months).any()  # without units: plain numbers, a fixed step
    hours = np.concatenate([np.arange(8) * 6.0, 48 + 3 + np.arange(8) * 6.0])
    assert np.flatnonzero(irregular_steps(hours, {"units": "hours since 2000-01-01"})).tolist() == [7]
    assert not irregular_steps(np.arange(24.0) + 1200, {"units": "months since 1800-1-1"}).any()


def test_dekads_pentads_and_seasons_are_regular_and_a_missing_one_is_a_gap():
    """Calendar products: dekads (1st, 11th, 21st: 8 to 11 days), pentads (73 a year: one of 6 days in a leap
    year), seasons (DJF, MAM, ...: 90 to 92 days). A missing one is still a gap, as a week off by a day is."""
    months = np.arange("2000-01", "2003-01", dtype="datetime64[M]")
    dekads = (months[:, None] + np.array([0, 10, 20]).astype("timedelta64[D]")).reshape(-1).astype("datetime64[ns]")
    assert not irregular_steps(dekads).any()
    assert np.flatnonzero(irregular_steps(np.delete(dekads, 7))).tolist() == [6]
    pentads = np.concatenate(
        [np.datetime64(f"{y}-01-01") + np.arange(73) * np.timedelta64(5, "D") for y in (2000, 2001)]
    ).astype("datetime64[ns]")  # 2000's last pentad is 6 days long (its 29 February)
    assert not irregular_steps(pentads).any()
    seasons = np.array([f"{y}-{m:02d}-01" for y in (2000, 2001, 2002) for m in (3, 6, 9, 12)], dtype="datetime64[ns]")
    assert not irregular_steps(seasons).any()
    assert np.flatnonzero(irregular_steps(np.delete(seasons, 5))).tolist() == [4]
