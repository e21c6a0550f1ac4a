"""Coordinate values: as records store them, as JSON shows them, and whether their steps are regular."""

from __future__ import annotations

from typing import Any

import numpy as np

from planning.formats.calendars import calendar_of, is_cftime, iso
from planning.inputs.time_decoding import is_time

TIME_UNITS = "seconds since 1970-01-01T00:00:00Z"


def record_values(values: np.ndarray, attrs: dict[str, Any]) -> tuple[np.ndarray, dict[str, Any]] | None:
    """Coordinate values as a record can hold them, and how to read them back; None if it cannot.

    Times become int64 seconds since 1970 (any calendar, the calendar recorded); integers
    int64; floats float32, except times kept as stored numbers (input.decode_times: false) that
    are whole: int64, as float32 would round them (seconds since 1970 by up to two minutes).
    """
    kind = values.dtype.kind
    if kind == "M":
        seconds = values.astype("datetime64[s]").astype(np.int64)
        return seconds, {"units": TIME_UNITS, "calendar": time_calendar(values)}
    if is_cftime(values):
        import cftime

        calendar = values[0].calendar
        seconds = np.asarray(cftime.date2num(list(values), TIME_UNITS.replace("Z", ""), calendar=calendar))
        return np.round(seconds).astype(np.int64), {"units": TIME_UNITS, "calendar": calendar}
    # Times kept as stored (input.decode_times: false) keep their calendar beside their units.
    kept = {k: attrs[k] for k in ("units", "calendar") if k in attrs}
    if kind in "iub" or (kind == "f" and is_time(attrs) and _whole(values)):
        return values.astype(np.int64), kept
    if kind == "f":
        return values.astype(np.float32), kept
    return None


def _whole(values: np.ndarray) -> bool:
    """Whether every value is a whole number that int64 holds exactly (as float64 does, below 2**53)."""
    finite = np.isfinite(values).all()
    return bool(finite and (np.abs(values) < 2**53).all() and (values == np.round(values)).all())


def time_calendar(values: np.ndarray) -> str | None:
    """The calendar records state for times: their own, proleptic_gregorian for numpy datetimes; None: not times."""
    calendar = calendar_of(values)
    return "proleptic_gregorian" if calendar == "datetime64" else calendar


def json_values(values: np.ndarray) -> list:
    """Coordinate values for schema.json (times as ISO strings, in their own calendar)."""
    if values.dtype.kind in "MO":
        return [iso(v) for v in values]
    return values.tolist()


def format_value(value) -> str:
    """One coordinate value for a message (times as ISO strings, in their own calendar)."""
    return iso(value)


def _numeric(values: np.ndarray) -> np.ndarray | None:
    if values.dtype.kind == "f":
        return values.astype(np.float64)
    converted = record_values(values, {})
    return None if converted is None else converted[0].astype(np.float64)


#: Seconds in one unit of stored times ("<unit> since ..."), for times kept as numbers (input.decode_times: false).
_UNIT_SECONDS = {
    **dict.fromkeys(("seconds", "second", "secs", "sec", "s"), 1.0),
    **dict.fromkeys(("minutes", "minute", "mins", "min"), 60.0),
    **dict.fromkeys(("hours", "hour", "hrs", "hr", "h"), 3600.0),
    **dict.fromkeys(("days", "day", "d"), 86400.0),
    **dict.fromkeys(("weeks", "week"), 604800.0),
}
#: Per calendar, the periods of calendar products, each as its shortest and longest length in days: pentads (73 a
#: year), dekads (1-10, 11-20, 21 to the month's end), half months, months, seasons (DJF, MAM, ...), years.
_CALENDAR_PERIODS = {
    "360_day": ((5, 5), (10, 10), (15, 15), (30, 30), (90, 90), (360, 360)),
    **dict.fromkeys(("noleap", "365_day"), ((5, 5), (8, 11), (13, 16), (28, 31), (90, 92), (365, 365))),
    **dict.fromkeys(("all_leap", "366_day"), ((5, 6), (9, 11), (14, 16), (29, 31), (91, 92), (366, 366))),
}
#: standard, gregorian, proleptic_gregorian, julian (and any other calendar)
_STANDARD_PERIODS = ((5, 6), (8, 11), (13, 16), (28, 31), (90, 92), (365, 366))
_DAY = 86400.0


def _time_scale(values: np.ndarray, attrs: dict[str, Any] | None) -> tuple[float, str | None] | None:
    """For times, the seconds in one unit of ``_numeric(values)`` and their calendar; None: not times (or months)."""
    if values.dtype.kind == "M" or is_cftime(values):
        return 1.0, time_calendar(values)  # (_numeric gives seconds since 1970)
    if attrs and is_time(attrs):
        unit = str(attrs["units"]).lower().split(" since ")[0].strip()
        seconds = _UNIT_SECONDS.get(unit)  # (months/years since: numbers a fixed step apart)
        return None if seconds is None else (seconds, attrs.get("calendar"))
    return None


def irregular_steps(values: np.ndarray, attrs: dict[str, Any] | None = None) -> np.ndarray:
    """Per consecutive pair of steps, True where the step is not the typical one.

    Typical = the median step (the lower middle one: a step the data has). A step is regular
    when it equals it, within float rounding (and, for times, a second); so a 6-hourly series
    with a 9 h, 4 h or 7 h step, or a daily one with a missing day, has an irregular step.
    Calendar periods vary in length: where the typical step is one (times whose typical step
    lies within the lengths the calendar gives a pentad, a dekad, a half month, a month, a
    season or a year), any step within that range is regular: months 28-31 days (all_leap
    29-31; 360_day 30), dekads 8-11, years 365-366 (noleap 365, 360_day 360), ... (the
    table above). ``attrs``: the coordinate's, for times kept as numbers (input.decode_times:
    false): their units and calendar.
    """
    numeric = _numeric(values)
    if numeric is None or len(numeric) < 2:
        return np.zeros(max(len(values) - 1, 0), dtype=bool)
    diffs = np.diff(numeric)
    finite = np.sort(diffs[np.isfinite(diffs)])
    if not len(finite):
        return np.zeros(len(diffs), dtype=bool)
    typical = finite[(len(finite) - 1) // 2]
    scale = _time_scale(values, attrs)
    # Float rounding: of each value (a few units in the last place of the largest) and of the step itself.
    slack = 4 * np.finfo(np.float32 if values.dtype == np.float32 else np.float64).eps * np.nanmax(np.abs(numeric))
    slack = max(slack if values.dtype.kind == "f" else 0.0, 1e-6 * abs(typical))
    if scale is not None:
        slack = max(slack, 1.0 / scale[0])  # times: a second (cftime dates are rounded to seconds)
    regular = np.abs(diffs - typical) <= slack
    if scale is not None:
        unit_days = scale[0] / _DAY
        for shortest, longest in _CALENDAR_PERIODS.get(scale[1], _STANDARD_PERIODS):
            low, high = shortest / unit_days - slack, longest / unit_days + slack
            if low <= typical <= high:  # a calendar period: as long as the calendar makes each
                regular |= (diffs >= low) & (diffs <= high)
    return ~regular


def json_scalar(value: np.ndarray):
    """A scalar coordinate's value for schema.json: a number, text, or a time as ISO text (in its own calendar)."""
    value = np.asarray(value).reshape(())
    kind = value.dtype.kind
    if kind in "fiub":
        number = value.item()
        # schema.json is strict JSON: NaN and infinities become their names.
        return number if not isinstance(number, float) or np.isfinite(number) else str(number)
    if kind == "S":
        return value.item().decode(errors="replace")
    return iso(value[()])
