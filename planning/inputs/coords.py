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


def irregular_steps(values: np.ndarray) -> np.ndarray:
    """Per consecutive pair of steps, True where the step is not the typical one.

    Typical = the median step; a step over 1.5x (a gap) or under 0.5x of it is irregular.
    The tolerance lets calendar months (28 to 31 days) count as regular.
    """
    numeric = _numeric(values)
    if numeric is None or len(numeric) < 2:
        return np.zeros(max(len(values) - 1, 0), dtype=bool)
    diffs = np.diff(numeric)
    typical = np.median(diffs)
    return (diffs > 1.5 * typical) | (diffs < 0.5 * typical)


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
