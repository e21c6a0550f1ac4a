"""Calendars of decoded times: which one a file's times are in, and dates of any precision read in it.

xarray decodes times of the standard calendars to numpy datetime64 and times of every other
calendar cftime knows (noleap, 360_day, julian, ...) to cftime objects, which carry their calendar.
"""

from __future__ import annotations

import numpy as np

#: Calendars whose dates numpy's datetime64 holds exactly (after 1582-10-15, where xarray uses it).
GREGORIAN = ("standard", "gregorian", "proleptic_gregorian")


def check_calendar(name: str) -> None:
    """Raise ValueError, listing the calendars cftime knows, for a name it does not know."""
    import cftime

    try:
        cftime.datetime(2000, 1, 1, calendar=name)
    except ValueError as error:
        raise ValueError(f"unknown calendar {name!r} ({error})") from None


def is_cftime(values: np.ndarray) -> bool:
    return values.dtype.kind == "O" and len(values) > 0 and hasattr(values[0], "calendar")


def calendar_of(values: np.ndarray) -> str | None:
    """The calendar of decoded times as cftime names it; 'datetime64' for numpy datetimes; None: not times."""
    if values.dtype.kind == "M":
        return "datetime64"
    return values[0].calendar if is_cftime(values) else None


def as_cftime(values: np.ndarray, calendar: str) -> np.ndarray:
    """numpy datetimes as cftime dates of a Gregorian calendar (the same days after 1582)."""
    import cftime

    microseconds = values.astype("datetime64[us]").astype(np.int64)
    dates = cftime.num2date(microseconds, "microseconds since 1970-01-01", calendar, only_use_cftime_datetimes=True)
    return np.asarray(dates, dtype=object)


def date_index(values: np.ndarray):
    """An index that slices ``values`` by dates written at any precision ("1890", "1890-06",
    "1890-06-15T12:00"), read in the values' own calendar; None for values that are not dates."""
    if values.dtype.kind == "M":
        import pandas as pd

        return pd.DatetimeIndex(values)
    if is_cftime(values):
        import xarray as xr

        return xr.CFTimeIndex(values)
    return None


def iso(value) -> str:
    """A date as ISO text to the second, whatever its calendar; any other value as str()."""
    if isinstance(value, np.datetime64):
        return str(value.astype("datetime64[s]"))
    if hasattr(value, "calendar") and hasattr(value, "isoformat"):
        return value.isoformat()
    return str(value)
