"""schema.json's ``grid``: every sample dim's coordinate on the selected grid, exactly, as JSON and back.

Reassembly (schemas.reassemble) puts samples back on this grid without the source files, so it
records what records do not: the coordinate of every cell (also those no sample covers), in the
source's dtype, with its attributes; times as whole seconds since 1970 in their own calendar. An
exactly regular run of values is stored as start, step and count, so a long time axis stays small; a large entry
(a curvilinear grid's 2-D lat, lon) keeps its values in grid.npz beside schema.json (schemas.grid_file).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from schemas.grid_file import is_reference, referenced_values

#: How times are counted in schema.json (as the coord/<dim> features count them).
TIME_UNITS = "seconds since 1970-01-01"
#: Attributes xarray keeps in a decoded time's encoding, not its attrs.
TIME_ENCODING = ("units", "calendar")


def _compact(values: np.ndarray) -> Any:
    """A list, or {start, step, count} when the values are exactly that arithmetic run (in their dtype)."""
    if len(values) > 2 and values.dtype.kind in "iuf":
        start, step = values[0].item(), (values[1] - values[0]).item()
        run = (np.float64(start) + np.float64(step) * np.arange(len(values))).astype(values.dtype)
        if np.array_equal(run, values) and np.isfinite(values).all():
            return {"start": start, "step": step, "count": len(values)}
    return values.tolist()


def _expand(stored: Any, dtype: str, folder: str | None) -> np.ndarray:
    if is_reference(stored):
        return referenced_values(stored, dtype, folder)
    if isinstance(stored, dict):
        run = np.float64(stored["start"]) + np.float64(stored["step"]) * np.arange(stored["count"])
        return run.astype(dtype)
    return np.asarray(stored, dtype=dtype)


def describe_coordinate(values: np.ndarray, attrs: dict[str, Any]) -> dict[str, Any]:
    """One dim's coordinate as schema.json's grid holds it (numbers in their dtype, times in seconds)."""
    attrs = {k: (v.tolist() if isinstance(v, np.ndarray | np.generic) else v) for k, v in attrs.items()}
    if values.dtype.kind == "M":
        seconds = values.astype("datetime64[s]").astype(np.int64)
        return {"time": "datetime64", "calendar": "proleptic_gregorian", "seconds": _compact(seconds), "attrs": attrs}
    if values.dtype.kind == "O" and len(values) and hasattr(values[0], "calendar"):
        import cftime

        calendar = values[0].calendar
        seconds = np.round(np.asarray(cftime.date2num(list(values), TIME_UNITS, calendar=calendar))).astype(np.int64)
        return {"time": "cftime", "calendar": calendar, "seconds": _compact(seconds), "attrs": attrs}
    if values.dtype.kind not in "iufb":
        return {"dtype": "str", "values": [str(v) for v in values], "attrs": attrs}
    return {"dtype": values.dtype.str, "values": _compact(values), "attrs": attrs}


def coordinate_values(entry: dict[str, Any], folder: str | None = None) -> np.ndarray:
    """A grid entry's values as the source held them (datetime64[ns] or cftime dates for times).

    Args:
        entry: an entry of schema.json's grid.
        folder: the output's folder (``Schema.location``), where a large entry's values are (schemas.grid_file).

    Raises:
        UserError: the entry's values are in a sidecar that is missing, replaced, or not in ``folder``.
    """
    if "time" not in entry:
        if entry["dtype"] == "str":
            return np.asarray(entry["values"], dtype=object)
        return _expand(entry["values"], entry["dtype"], folder)
    seconds = _expand(entry["seconds"], "int64", folder)
    if entry["time"] == "datetime64":
        return seconds.astype("datetime64[s]").astype("datetime64[ns]")
    import cftime

    return np.asarray(cftime.num2date(seconds, TIME_UNITS, calendar=entry["calendar"], only_use_cftime_datetimes=True))


def coordinate_attrs(entry: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """A grid entry's (attrs, encoding): a time's units and calendar go to its encoding, as xarray decodes them."""
    attrs = dict(entry.get("attrs", {}))
    if "time" not in entry:
        return attrs, {}
    encoding = {k: attrs.pop(k) for k in TIME_ENCODING if k in attrs}
    return attrs, encoding
