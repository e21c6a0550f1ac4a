"""Per-sample position features (split, index/<dim>, coord/<dim>, time features) from grid positions alone.

Cutting a unit and laying out the shards before any data is read both need them, so they are
one small spec with two functions of the positions.

sample.time_features follow GraphCast: ``day_progress = (seconds since 1970-01-01 mod 86400) / 86400``
at the sample's own longitudes (``+ lon / 360``, mod 1: local solar time): per longitude of a range
of them (a window, or all), at the one an iterated, selected or scalar longitude gives, per cell of a
curvilinear grid's 2-D one; refused where the sample has none. ``year_progress`` depends on the calendar: in the
standard and proleptic Gregorian calendars, whose seconds since 1970 are elapsed time, it is
GraphCast's ``(seconds since 1970-01-01 / (365.24219 * 86400)) mod 1`` (the tropical year); in
every other calendar (noleap, 360_day, all_leap, julian, ...) a tropical year of the calendar's
seconds drifts through its dates (a 360_day 16 December would read 0.23 one year and 0.07 the next),
so it is the fraction of the step's own calendar year elapsed: its day of year and time of day over
that year's length (365, 360, 366, or julian's 365 or 366 days). Seconds count in the concat dim's
own calendar, from the record-ready times planning already makes
(planning.inputs.coords.record_values). Each progress is written as ``time_features/<name>_sin`` and
``_cos`` (of 2 pi times it), float32, so a model sees a continuous cycle.

``cos_zenith`` is the cosine of the solar zenith angle at each cell of the sample and step,
``sin(lat) sin(decl) + cos(lat) cos(decl) cos(hour angle)``, with the declination and the
equation of time (minutes) of NOAA's "General Solar Position Calculations" (Spencer's 1971
Fourier series) at the fractional-year angle ``2 pi year_progress`` (as above, so a model
calendar's solstice stays on its date), and the hour angle ``2 pi (day_progress at the cell's
longitude + equation of time / 1440) - pi``: negative at night (not clipped), float32.
"""

from __future__ import annotations

import dataclasses
import io
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from planning.formats.calendars import GREGORIAN
from planning.inputs.coords import TIME_UNITS
from planning.run.contracts import coord_feature, index_feature
from planning.sampling import SampleGrid
from schemas.errors import UserError
from schemas.npy_files import npz_arrays
from schemas.schema import Feature


@dataclasses.dataclass(frozen=True, eq=False)
class Positions:
    """The sample grid and what each grid position means: its split, its coordinate values."""

    grid: SampleGrid
    concat_dim: str
    #: per position along the split dim, the index of its split, or -1: no sample there;
    #: None when every position makes samples of the one split
    split_of_position: np.ndarray | None
    #: record-ready coordinate values (int64 or float32) along each grid dim that has them
    coords: dict[str, np.ndarray]
    split_dim: str | None = None  # the dim splits range along (None: the concat dim)
    #: when the splits range along another dim (input.new_dim): per position along the concat
    #: dim, whether its samples would join steps across a gap (they make none); None: none do
    across_gap: np.ndarray | None = None
    #: the arrays above were left out (``hollow``): a worker loads them from the run's file (``filled``)
    is_hollow: bool = False
    #: sample.time_features, computed from the concat dim's coordinate (None: none configured)
    time_features: TimeFeatures | None = None
    #: the position along the concat dim whose index/<concat_dim> is 0 (above 0 after a backfill: the steps
    #: added before an output's first get negative indices, so the held samples keep theirs)
    index_origin: int = 0

    def to_bytes(self) -> bytes:
        """The per-position arrays (splits, gaps, coordinates): what grows with the grid, saved for the workers."""
        arrays = {f"coord_{i}": self.coords[a.dim] for i, a in enumerate(self.grid.grid_axes) if a.dim in self.coords}
        if self.split_of_position is not None:
            arrays["split_of_position"] = self.split_of_position
        if self.across_gap is not None:
            arrays["across_gap"] = self.across_gap
        if self._grid_longitudes() is not None:
            arrays["time_features_lon"] = self._grid_longitudes()
        buffer = io.BytesIO()
        np.savez(buffer, **arrays)
        return buffer.getvalue()

    def _grid_longitudes(self) -> np.ndarray | None:
        """day_progress's longitudes where they grow with the grid (a curvilinear grid's 2-D ones)."""
        features = self.time_features
        if features is None or features.lon_values is None or features.lon_values.ndim < 2:
            return None
        return features.lon_values

    def hollow(self) -> Positions:
        """These positions without their arrays: what the job graph carries when they are saved in a file."""
        features = self.time_features
        if self._grid_longitudes() is not None:
            features = dataclasses.replace(features, lon_values=None)
        return dataclasses.replace(
            self, split_of_position=None, coords={}, across_gap=None, is_hollow=True, time_features=features
        )

    def filled(self, data: bytes) -> Positions:
        """These (hollow) positions with the arrays ``to_bytes`` saved."""
        with npz_arrays(data) as arrays:
            coords = {a.dim: arrays[f"coord_{i}"] for i, a in enumerate(self.grid.grid_axes) if f"coord_{i}" in arrays}
            labels = arrays.get("split_of_position")
            gap = arrays.get("across_gap")
            lon = arrays.get("time_features_lon")
        features = self.time_features
        if lon is not None and features is not None:
            features = dataclasses.replace(features, lon_values=lon)
        return dataclasses.replace(
            self, split_of_position=labels, coords=coords, across_gap=gap, is_hollow=False, time_features=features
        )

    def _check_filled(self) -> None:
        if self.is_hollow:
            raise RuntimeError("positions used before their arrays were loaded from the run's file (Positions.filled)")

    def split_labels(self, positions: list[np.ndarray]) -> np.ndarray:
        """Each sample's split index, or -1 for samples that belong to none."""
        self._check_filled()
        dims = [a.dim for a in self.grid.grid_axes]
        labels = np.zeros(len(positions[0]) if positions else 1, dtype=np.int16)
        if self.split_of_position is not None:
            labels = self.split_of_position[positions[dims.index(self.split_dim or self.concat_dim)]]
        if self.across_gap is not None:
            labels = np.where(self.across_gap[positions[dims.index(self.concat_dim)]], np.int16(-1), labels)
        return labels

    def columns(self, positions: list[np.ndarray]) -> dict[str, tuple[tuple[str, ...], np.ndarray]]:
        """{feature name: (dims after the sample dim, values)} of the index/* and coord/* features."""
        self._check_filled()
        columns: dict[str, tuple[tuple[str, ...], np.ndarray]] = {}
        for axis, where in zip(self.grid.grid_axes, positions):
            origin = self.index_origin if axis.dim == self.concat_dim else 0
            columns[index_feature(axis.dim)] = ((), axis.first_index(where).astype(np.int64) - origin)
            if axis.dim in self.coords:
                values = self.coords[axis.dim]
                if axis.role == "iterate":
                    columns[coord_feature(axis.dim)] = ((), values[axis.first_index(where)])
                else:
                    columns[coord_feature(axis.dim)] = ((axis.dim,), values[axis.element_indices(where)])
        if self.time_features is not None:
            columns.update(self.time_features.columns(self.grid, positions, self.coords[self.concat_dim]))
        return columns


COS_ZENITH = "cos_zenith"
SECONDS_PER_DAY = 86400
DAYS_PER_YEAR = 365.24219  # the tropical year, as GraphCast divides by
#: Calendars whose years are all as long: a year starts at 1970-01-01 and every whole number of years from it.
_FIXED_YEAR_DAYS = {"noleap": 365, "365_day": 365, "all_leap": 366, "366_day": 366, "360_day": 360}
#: What schema.json says year_progress is, by calendar.
TROPICAL_YEAR = "(seconds since 1970-01-01 / (365.24219 * 86400)) mod 1 (GraphCast's; the tropical year)"
CALENDAR_YEAR = "(day of year - 1 + time of day) / days in that year of the calendar"
DAY = "(seconds since 1970-01-01 mod 86400) / 86400 + longitude / 360, mod 1 (local solar time)"
TIME_FEATURE_ROLE = "time_feature"
#: What a dim must be called (or its coordinate's units or standard name) to be taken as longitude.
_LONGITUDE_NAMES = ("lon", "longitude", "x_lon", "nav_lon")


def feature_name(progress: str, function: str) -> str:
    return f"time_features/{progress}_{function}"


def counts_elapsed_time(calendar: str | None) -> bool:
    """Whether seconds since 1970 in ``calendar`` are elapsed time (the standard and proleptic Gregorian
    calendars), so GraphCast's tropical-year fraction applies."""
    return calendar is None or calendar.lower() in GREGORIAN


def year_progress(seconds: np.ndarray, calendar: str | None) -> np.ndarray:
    """Each time's progress through its year, in [0, 1); ``seconds``: float64 seconds since 1970-01-01 counted in
    ``calendar`` (None: numpy datetimes, proleptic Gregorian)."""
    if counts_elapsed_time(calendar):
        return np.mod(seconds / (DAYS_PER_YEAR * SECONDS_PER_DAY), 1.0)
    days = _FIXED_YEAR_DAYS.get(calendar.lower())
    if days is not None:  # 1970-01-01 starts a year, and every year is as long
        return np.mod(seconds, days * SECONDS_PER_DAY) / (days * SECONDS_PER_DAY)
    return _calendar_year_progress(seconds, calendar)


def _calendar_year_progress(seconds: np.ndarray, calendar: str) -> np.ndarray:
    """Year progress where years differ in length (julian, and any other calendar cftime knows): from the
    dates' own year starts, each year's once."""
    import cftime

    if not seconds.size:
        return np.zeros(seconds.shape)
    units = TIME_UNITS.replace("Z", "")
    unique, inverse = np.unique(seconds, return_inverse=True)
    dates = cftime.num2date(unique, units, calendar, only_use_cftime_datetimes=True)
    dates = np.atleast_1d(dates)
    years = np.array([d.year for d in dates])
    has_year_zero = bool(dates[0].has_year_zero)
    first, which = np.unique(years, return_inverse=True)
    following = [y + 1 if y + 1 != 0 or has_year_zero else 1 for y in first.tolist()]

    def starts(of_years) -> np.ndarray:
        begins = [cftime.datetime(y, 1, 1, calendar=calendar, has_year_zero=has_year_zero) for y in of_years]
        return np.asarray(cftime.date2num(begins, units, calendar), dtype=np.float64)

    start, end = starts(first.tolist()), starts(following)
    progress = (unique - start[which]) / (end - start)[which]
    return progress[inverse].reshape(seconds.shape)


@dataclasses.dataclass(frozen=True, eq=False)
class TimeFeatures:
    """The configured progresses, the concat dim they are of, and the sample's longitudes for day_progress."""

    names: tuple[str, ...]
    concat_dim: str
    calendar: str | None  # the concat dim's times' (None: numpy datetimes, proleptic Gregorian)
    #: the sample's longitude coordinate (None: the sample holds none), its dims (a dim's own coordinate; a
    #: curvilinear grid's 2-D one; none for a scalar one) and its float64 degrees over them on the selected grid
    lon_name: str | None = None
    lon_dims: tuple[str, ...] = ()
    lon_values: np.ndarray | None = None
    lat_dim: str | None = None  # cos_zenith's: a dim of the sample holding a range of latitudes
    lat_values: np.ndarray | None = None

    @property
    def lon_dim(self) -> str | None:
        """cos_zenith's: the longitude dim when the longitude is a dim's own coordinate."""
        return self.lon_dims[0] if self.lon_name is not None and self.lon_dims == (self.lon_name,) else None

    def _cell_dims(self, grid: SampleGrid) -> tuple[str, ...]:
        """The dims of the sample along which its longitude varies (its iterated dims give it one value)."""
        return tuple(a.dim for a in grid.axes if a.dim in self.lon_dims and a.role != "iterate")

    def features(self, grid: SampleGrid) -> list[Feature]:
        concat = grid.axis(self.concat_dim)
        steps = ((), ()) if concat.role == "iterate" else ((len(concat.steps),), (self.concat_dim,))
        year = TROPICAL_YEAR if counts_elapsed_time(self.calendar) else CALENDAR_YEAR
        out = []
        for name in self.names:
            if name == COS_ZENITH:
                shape, dims = steps
                cells = [a.dim for a in grid.axes if a.dim in (self.lat_dim, self.lon_dim)]
                shape = (*shape, *(len(grid.axis(d).steps) for d in cells))
                source = {"feature": name, "dim": self.concat_dim, "latitude": self.lat_dim, "longitude": self.lon_dim}
                source.update(calendar=self.calendar, year_progress=year)
                feature = Feature(f"time_features/{name}", "float32", shape, (*dims, *cells), TIME_FEATURE_ROLE, source)
                out.append(feature)
                continue
            (shape, dims), source = steps, {"progress": name, "dim": self.concat_dim, "calendar": self.calendar}
            if name == "year_progress":
                source["formula"] = year
            else:
                cells = self._cell_dims(grid)
                shape, dims = (*shape, *(len(grid.axis(d).steps) for d in cells)), (*dims, *cells)
                source["longitude"] = self.lon_name  # local solar time: + lon / 360, at each cell's own
                source["formula"] = DAY
            out.extend(
                Feature(feature_name(name, f), "float32", shape, dims, TIME_FEATURE_ROLE, source)
                for f in ("sin", "cos")
            )
        return out

    def columns(
        self, grid: SampleGrid, positions: Sequence[np.ndarray], seconds: np.ndarray
    ) -> dict[str, tuple[tuple[str, ...], np.ndarray]]:
        """{feature name: (dims after the sample dim, values)}; ``seconds``: int64 seconds since 1970 of every
        step of the concat dim (on the selected grid), ``positions``: the samples' grid positions."""
        dims = [a.dim for a in grid.grid_axes]
        concat = grid.axis(self.concat_dim)
        where = positions[dims.index(self.concat_dim)]
        if concat.role == "iterate":
            steps, step_dims = seconds[concat.first_index(where)], ()
        else:
            steps, step_dims = seconds[concat.element_indices(where)], (self.concat_dim,)
        steps = steps.astype(np.float64)
        out = {}
        for name in self.names:
            out_dims: tuple[str, ...] = step_dims
            if name == COS_ZENITH:
                out[f"time_features/{name}"] = self._cos_zenith(grid, positions, dims, steps, step_dims)
                continue
            if name == "year_progress":
                progress = year_progress(steps, self.calendar)
            else:
                progress = np.mod(steps, SECONDS_PER_DAY) / SECONDS_PER_DAY
                lon = self._longitudes(grid, positions, dims)  # (samples, *cells)
                cells = lon.ndim - 1
                # (samples, [steps,] *cells): each step at each of the sample's longitudes
                lon = lon.reshape(len(lon), *([1] * (progress.ndim - 1)), *lon.shape[1:])
                progress = np.mod(progress.reshape(*progress.shape, *([1] * cells)) + lon / 360.0, 1.0)
                out_dims = (*step_dims, *self._cell_dims(grid))
            angle = 2 * np.pi * progress
            out[feature_name(name, "sin")] = (out_dims, np.sin(angle).astype(np.float32))
            out[feature_name(name, "cos")] = (out_dims, np.cos(angle).astype(np.float32))
        return out

    def _longitudes(self, grid: SampleGrid, positions: Sequence[np.ndarray], dims: list[str]) -> np.ndarray:
        """Each sample's longitudes (samples, *cells), over the dims ``_cell_dims`` names, in the sample's order."""
        count = len(positions[0]) if positions else 1
        values = np.asarray(self.lon_values, dtype=np.float64)
        index = []
        for k, dim in enumerate(self.lon_dims):
            axis = grid.axis(dim)
            if axis.role == "keep":
                taken = np.arange(axis.length)[None, :]
            elif axis.role == "iterate":
                taken = axis.first_index(positions[dims.index(dim)])[:, None]
            else:
                taken = axis.element_indices(positions[dims.index(dim)])
            shape = [len(taken)] + [1] * len(self.lon_dims)
            shape[1 + k] = taken.shape[1]
            index.append(taken.reshape(shape))
        if not index:  # a scalar longitude: every sample's
            return np.full(count, float(values))
        lon = np.broadcast_to(values[tuple(index)], (count, *values[tuple(index)].shape[1:]))
        order = [a.dim for a in grid.axes if a.dim in self.lon_dims]
        lon = np.moveaxis(lon, [1 + self.lon_dims.index(d) for d in order], list(range(1, 1 + len(order))))
        iterated = tuple(1 + i for i, d in enumerate(order) if grid.axis(d).role == "iterate")
        return lon.reshape([n for i, n in enumerate(lon.shape) if i not in iterated])

    def _cos_zenith(
        self, grid: SampleGrid, positions: Sequence[np.ndarray], dims: list[str], steps: np.ndarray, step_dims: tuple
    ) -> tuple[tuple[str, ...], np.ndarray]:
        """(dims, values (samples, [steps,] cells)) of cos_zenith; ``steps``: float64 seconds since 1970."""
        cells = [a.dim for a in grid.axes if a.dim in (self.lat_dim, self.lon_dim)]
        lat = np.radians(_along(grid, positions, dims, self.lat_dim, self.lat_values))
        lon = _along(grid, positions, dims, self.lon_dim, self.lon_values)
        lat_first = cells[0] == self.lat_dim
        # (samples, [steps,] lat, lon) or (..., lon, lat), by the dims' order in the sample.
        lead = (len(steps),) + (1,) * (steps.ndim - 1)
        lat = lat.reshape(*lead, *((lat.shape[1], 1) if lat_first else (1, lat.shape[1])))
        lon = lon.reshape(*lead, *((1, lon.shape[1]) if lat_first else (lon.shape[1], 1)))
        seconds = steps[..., None, None]
        gamma = 2 * np.pi * year_progress(seconds, self.calendar)
        declination = (
            0.006918
            - 0.399912 * np.cos(gamma)
            + 0.070257 * np.sin(gamma)
            - 0.006758 * np.cos(2 * gamma)
            + 0.000907 * np.sin(2 * gamma)
            - 0.002697 * np.cos(3 * gamma)
            + 0.00148 * np.sin(3 * gamma)
        )
        minutes = 229.18 * (
            0.000075
            + 0.001868 * np.cos(gamma)
            - 0.032077 * np.sin(gamma)
            - 0.014615 * np.cos(2 * gamma)
            - 0.040849 * np.sin(2 * gamma)
        )  # the equation of time
        solar = np.mod(seconds, SECONDS_PER_DAY) / SECONDS_PER_DAY + lon / 360.0 + minutes / 1440.0
        hour_angle = 2 * np.pi * solar - np.pi
        cos = np.sin(lat) * np.sin(declination) + np.cos(lat) * np.cos(declination) * np.cos(hour_angle)
        return (*step_dims, *cells), cos.astype(np.float32)


def _along(grid: SampleGrid, positions: Sequence[np.ndarray], dims: list[str], dim: str, values) -> np.ndarray:
    """Each sample's coordinate values along ``dim`` (a window or kept dim), (samples, elements)."""
    axis = grid.axis(dim)
    count = len(positions[0]) if positions else 1
    if axis.role == "keep":
        return np.broadcast_to(values, (count, len(values)))
    return values[axis.element_indices(positions[dims.index(dim)])]


#: What an output written before schema.json named the formulas computed (its sources say no more).
_EARLIER = {"year_progress": TROPICAL_YEAR, "day_progress": "(seconds since 1970-01-01 mod 86400) / 86400 (UTC)"}


def _meaning(feature: Feature) -> tuple:
    """What a time feature's values mean: its formula (year progress too, for cos_zenith) and longitude."""
    source = feature.source
    if COS_ZENITH in feature.name:
        return source.get("year_progress", TROPICAL_YEAR), source.get("longitude")
    progress = source.get("progress", "")
    earlier = DAY if progress == "day_progress" and source.get("longitude") else _EARLIER.get(progress)
    return source.get("formula", earlier), source.get("longitude")


def check_time_features_unchanged(held: Sequence[Feature], now: Sequence[Feature]) -> None:
    """UserError where an append would compute a time feature otherwise than the output's earlier generations
    did (an output written before year_progress followed model calendars, or day_progress a scalar longitude)."""
    before = {f.name: f for f in held if f.role == TIME_FEATURE_ROLE}
    for feature in now:
        if feature.role != TIME_FEATURE_ROLE or feature.name not in before:
            continue
        (was, was_lon), (is_, lon) = _meaning(before[feature.name]), _meaning(feature)
        if (was, was_lon) != (is_, lon):
            then = f"{was}" + (f" at longitude {was_lon!r}" if was_lon else "")
            now_ = f"{is_}" + (f" at longitude {lon!r}" if lon else "")
            raise UserError(
                f"sample.time_features: the output's {feature.name} was written as {then}, and this version "
                f"computes {now_}; appending would mix the two, so rebuild with --overwrite"
            )


@dataclasses.dataclass(frozen=True)
class OtherCoordinate:
    """A coordinate that is not a dim's own (a curvilinear grid's 2-D lon, a scalar one): its name, dims and
    attributes, and how to load its values on the selected grid (read only if a time feature needs them)."""

    name: str
    dims: tuple[str, ...]
    attrs: dict
    load: Callable[[], np.ndarray]


def plan_time_features(
    names: Sequence[str],
    grid: SampleGrid,
    concat_dim: str,
    coords: Mapping[str, tuple[np.ndarray, dict]],
    coordinate,
    others: Sequence[OtherCoordinate] = (),
) -> TimeFeatures | None:
    """The time features ``names`` (sample.time_features) asks for, checked against the grid; None for none.

    ``coords``: the grid dims' record-ready coordinates and their info; ``coordinate(dim)``: a dim's
    values and attributes on the selected grid (SelectedDataset.coordinate); ``others``: the files'
    coordinates that are not a dim's own, where the sample's longitude may be.
    """
    if not names:
        return None
    grid_dims = [a.dim for a in grid.grid_axes]
    if concat_dim not in grid_dims:
        raise UserError(
            f"sample.time_features: the samples keep {concat_dim!r} whole, so a sample has no steps of its own; "
            f"iterate {concat_dim!r}, or cut it in windows or offsets"
        )
    found = coords.get(concat_dim)
    if found is None or found[1].get("units") != TIME_UNITS:
        raise UserError(
            f"sample.time_features: {concat_dim!r} does not hold decoded times (no coordinate, or "
            "input.decode_times: false, or units that are not a time); time features need dates"
        )
    lon_name, lon_dims, lon_values = None, (), None
    if "day_progress" in names or COS_ZENITH in names:
        lon_name, lon_dims, lon_values = _longitude(grid, concat_dim, coordinate, others)
    if "day_progress" in names and lon_name is None:
        raise UserError(
            "sample.time_features: day_progress is local solar time, but the samples hold no longitude (no dim or "
            "coordinate named lon or longitude, with standard_name longitude, or in degrees_east); give the files "
            "a longitude coordinate (a scalar one for a station; a grid file's variable: list it under coords:), "
            "or remove day_progress"
        )
    lat_dim = lat_values = None
    if COS_ZENITH in names:
        lat_dim = _axis_dim(grid, coordinate, _LATITUDE_NAMES, "latitude", _LATITUDE_UNITS)
        lon_ranges = lon_dims == (lon_name,) and grid.axis(lon_name).role in ("window", "keep")
        if lat_dim is None or not lon_ranges:
            raise UserError(
                "sample.time_features: cos_zenith is per cell, so the sample must hold a range of latitudes and one "
                "of longitudes (a window or kept dim each, with a 1-D coordinate in degrees); window or keep them, "
                "or remove cos_zenith"
            )
        lat_values = np.asarray(coordinate(lat_dim)[0], dtype=np.float64)
    calendar = found[1].get("calendar")
    return TimeFeatures(tuple(names), concat_dim, calendar, lon_name, lon_dims, lon_values, lat_dim, lat_values)


def _longitude(
    grid: SampleGrid, concat_dim: str, coordinate, others: Sequence[OtherCoordinate]
) -> tuple[str | None, tuple[str, ...], np.ndarray | None]:
    """The sample's longitude coordinate: its name, dims and float64 values on the selected grid (None: none).

    A dim's own coordinate first (a window or kept dim of them before an iterated or selected one), then a
    coordinate over the sample's dims that is not a dim's own (a curvilinear grid's 2-D one, a scalar one)."""
    dim = _longitude_dim(grid, coordinate) or _axis_dim(
        grid, coordinate, _LONGITUDE_NAMES, "longitude", _LONGITUDE_UNITS, ("iterate", "offsets")
    )
    if dim is not None:
        return dim, (dim,), _finite(dim, np.asarray(coordinate(dim)[0], dtype=np.float64))
    sample_dims = {a.dim for a in grid.axes}
    for other in others:
        if concat_dim in other.dims or not set(other.dims) <= sample_dims:
            continue  # (a longitude moving along the steps, or over dims the sample does not have)
        if _is_axis(other.name, other.attrs, _LONGITUDE_NAMES, "longitude", _LONGITUDE_UNITS):
            values = np.asarray(other.load())
            if values.dtype.kind in "iuf":
                return other.name, tuple(other.dims), _finite(other.name, values.astype(np.float64))
    return None, (), None


def _finite(name: str, values: np.ndarray) -> np.ndarray:
    """The longitudes, refused where some are missing: local solar time there would be NaN."""
    missing = int(np.count_nonzero(~np.isfinite(values)))
    if missing:
        raise UserError(
            f"sample.time_features: longitude {name!r} has {missing} missing value(s) (NaN or its _FillValue, on "
            "land?), where day_progress and cos_zenith would be NaN; fill them in the files, or remove "
            "day_progress and cos_zenith"
        )
    return values


_LATITUDE_NAMES = ("lat", "latitude", "y_lat", "nav_lat")
_LONGITUDE_UNITS = ("degrees_east", "degree_east", "degrees_e", "degree_e")
_LATITUDE_UNITS = ("degrees_north", "degree_north", "degrees_n", "degree_n")


def _longitude_dim(grid: SampleGrid, coordinate) -> str | None:
    """The sample's longitude dim, if it holds a range of them (window or keep) and has a numeric coordinate."""
    return _axis_dim(grid, coordinate, _LONGITUDE_NAMES, "longitude", _LONGITUDE_UNITS)


def _axis_dim(grid: SampleGrid, coordinate, names, standard_name: str, units, roles=("window", "keep")) -> str | None:
    """The sample's dim of ``standard_name`` (by its name, standard_name or units), if it holds a range of them
    (window or keep; or of ``roles``) and has a numeric coordinate."""
    for axis in grid.axes:
        if axis.role not in roles:
            continue
        found = coordinate(axis.dim)
        if found is None or np.asarray(found[0]).dtype.kind not in "iuf":
            continue
        if _is_axis(axis.dim, found[1], names, standard_name, units):
            return axis.dim
    return None


def _is_axis(name: str, attrs: dict, names, standard_name: str, units) -> bool:
    return (
        name.lower() in names
        or attrs.get("standard_name") == standard_name
        or str(attrs.get("units", "")).lower() in units
    )
