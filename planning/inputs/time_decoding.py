"""How planning decodes the files' times: input.decode_times and input.calendar, and one line for times it cannot."""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np
import xarray as xr

from planning.formats.calendars import check_calendar
from planning.formats.cf_decoding import decoded
from planning.formats.sources import NETCDF_LOCK
from planning.inputs.input_config import InputConfig
from schemas.errors import UserError

#: What decoding a time can raise: xarray's ValueError for units or a calendar it cannot use,
#: OverflowError and pandas' OutOfBoundsDatetime (a ValueError) for dates out of range.
DECODING_ERRORS = (ValueError, OverflowError)


def is_time(attrs: dict) -> bool:
    """Whether CF attributes describe times (units 'days since ...', 'hours since ...', ...)."""
    return " since " in str(attrs.get("units", "")).lower()


class MissingValue(UserError):
    """A concat coordinate without a value at some step (NaN, NaT, or its fill value): no sorting places it."""

    def __init__(self, path: str, name: str, index: int, value):
        self.path, self.name, self.index, self.value = path, name, index, value
        super().__init__(
            f"{path}: {name!r} has no value at index {index} ({value}: a {name} value is missing), so that step has "
            f"no place; repair the file, or write it again without that step (xarray: open it with decode_times=False, "
            f"then ds.sel({name}=ds[{name!r}].notnull()))"
        )

    def __reduce__(self):
        # Raised in a planning pool's process, it is pickled back to the launcher: rebuilt from its own fields.
        return type(self), (self.path, self.name, self.index, self.value)


def first_missing(values: np.ndarray) -> int | None:
    """The index of the first missing value (NaN, NaT) of 1-D coordinate values, or None if none is."""
    kind = values.dtype.kind
    if kind not in "fmM":
        return None
    missing = np.flatnonzero(np.isnan(values) if kind == "f" else np.isnat(values))
    return int(missing[0]) if len(missing) else None


def check_no_missing(path: str, name: str, values: np.ndarray) -> None:
    """Refuse a coordinate with a missing value, naming the file, the coordinate and the step."""
    at = first_missing(values)
    if at is not None:
        raise MissingValue(path, name, at, values[at])


@dataclasses.dataclass(frozen=True)
class TimeDecoding:
    """Whether times are decoded to dates, and the calendar that replaces the files' own, if any."""

    enabled: bool = True
    calendar: str | None = None

    @classmethod
    def of(cls, input_config: InputConfig) -> TimeDecoding:
        """From the config's ``input`` section."""
        return cls(input_config.decode_times, input_config.calendar)

    def attrs(self, attrs: dict) -> dict:
        """A variable's attributes with the configured calendar in place of its own (times only)."""
        if self.calendar is None or not is_time(attrs):
            return attrs
        return {**attrs, "calendar": self.calendar}

    def values(self, path: str, name: str, dims, raw: np.ndarray, attrs: dict) -> xr.Variable:
        """A variable's stored values decoded as xarray would open them, with this decoding of times.

        A dim coordinate's missing time is refused before decoding: xarray dates NaN at the units'
        epoch in cftime's calendars (noleap, 360_day, ...), a wrong step nothing would notice.
        """
        if self.enabled and is_time(attrs) and tuple(dims) == (name,):
            check_no_missing(path, name, decoded(name, dims, raw, attrs, decode_times=False).values)
        try:
            return decoded(name, dims, raw, self.attrs(attrs), decode_times=self.enabled)
        except DECODING_ERRORS as error:
            if not (self.enabled and is_time(attrs)):
                raise
            raise self.error(path, name, attrs, error) from None

    def dataset(self, path: str, dataset: xr.Dataset) -> xr.Dataset:
        """A dataset opened with ``decode_times=False``, its times decoded as configured (lazily)."""
        if not self.enabled:
            return dataset
        times = [name for name, variable in dataset.variables.items() if is_time(variable.attrs)]
        for name in times:
            if dataset[name].dims == (name,):  # a dim coordinate: loaded for planning anyway, and small
                with NETCDF_LOCK:
                    check_no_missing(path, name, dataset[name].values)
        if self.calendar is not None and times:
            dataset = dataset.copy()
            for name in times:
                dataset[name].attrs["calendar"] = self.calendar
        try:
            with NETCDF_LOCK, warnings.catch_warnings():
                warnings.simplefilter("ignore", xr.SerializationWarning)
                # Everything else was decoded on opening: only times are left to decode.
                return xr.decode_cf(dataset, mask_and_scale=False, concat_characters=False, decode_coords=False)
        except DECODING_ERRORS as error:
            for name in times:  # which one: each alone (only on failure, so the cost does not matter)
                variable = dataset.variables[name]
                with NETCDF_LOCK:
                    raw = variable.values
                self.values(path, name, variable.dims, raw, variable.attrs)
            raise UserError(
                f"{path}: its times cannot be decoded ({_reason(error)}); set input.decode_times: false"
            ) from None

    def error(self, path: str, name: str, attrs: dict, error: Exception) -> UserError:
        """Why a file's times cannot be decoded, and the config key that gets past it."""
        calendar = self.calendar or str(attrs.get("calendar", "standard"))
        try:
            check_calendar(calendar)
        except ValueError as unknown:
            return UserError(
                f"{path}: {name!r} has an {unknown}; set input.calendar to the calendar the file means "
                "(e.g. noleap for 365_days), or input.decode_times: false (splits then take numbers)"
            )
        reason = _reason(error)
        because = "" if reason.startswith("unable to decode time units") else f" ({reason})"
        return UserError(
            f"{path}: time units {attrs.get('units')!r} of {name!r} cannot be decoded as dates in calendar "
            f"{calendar!r}{because}; set input.decode_times: false (splits then take numbers)"
        )


#: Times decoded as the files state them (the config's defaults).
AS_STATED = TimeDecoding()


def _reason(error: Exception) -> str:
    # xarray's own advice ("Try opening your dataset with decode_times=False") names no key of ours.
    text = str(error).split(". Try opening")[0].splitlines()[0] if str(error) else type(error).__name__
    return text[:200]
