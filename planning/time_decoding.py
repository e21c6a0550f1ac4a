"""How planning decodes the files' times: input.decode_times and input.calendar, and one line for times it cannot."""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np
import xarray as xr

from planning.calendars import check_calendar
from planning.cf_decoding import decoded
from planning.config import InputConfig
from planning.sources import NETCDF_LOCK
from schemas.errors import UserError

#: What decoding a time can raise: xarray's ValueError for units or a calendar it cannot use,
#: OverflowError and pandas' OutOfBoundsDatetime (a ValueError) for dates out of range.
DECODING_ERRORS = (ValueError, OverflowError)


def is_time(attrs: dict) -> bool:
    """Whether CF attributes describe times (units 'days since ...', 'hours since ...', ...)."""
    return " since " in str(attrs.get("units", "")).lower()


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
        """A variable's stored values decoded as xarray would open them, with this decoding of times."""
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
