"""Data behind the --plot page: a cheap random scan of an output, sample labels, planes and a lat/lon mosaic."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from schemas.errors import UserError
from schemas.reader import Reader, batch_length
from schemas.schema import Feature, Schema

LAT_NAMES = ("lat", "latitude", "nav_lat")
LON_NAMES = ("lon", "longitude", "nav_lon")
LAT_UNITS = ("degrees_north", "degree_north", "degrees_n", "degree_n")
LON_UNITS = ("degrees_east", "degree_east", "degrees_e", "degree_e")
EPOCH_UNITS = "seconds since 1970-01-01"


@dataclasses.dataclass
class Scan:
    """Samples read from the start of randomly chosen shards, and where each came from."""

    samples: dict[str, np.ndarray]
    origins: list[tuple[str, int]]  # (shard file, sample position in the shard)
    #: where a variable's values were filled (nan_policy: fill, marked by its mask/ feature): shown as NaN
    filled: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.origins)

    def sample(self, i: int) -> dict[str, np.ndarray]:
        return {name: values[i] for name, values in self.samples.items()}


def scan_output(reader: Reader, rng: np.random.Generator, max_samples: int = 5000, max_bytes: float = 128e6) -> Scan:
    """Up to ``max_samples`` samples (or ``max_bytes`` decoded) from shards taken in random order.

    The records are fully shuffled on disk, so the first records of a shard are a uniform random
    sample of the split: reading only those keeps --plot cheap on large and remote outputs.
    """
    shards = [s for s in reader.shards if s.records]
    if not shards:
        raise UserError(f"{reader.path}: split {reader.split!r} has no records; there is nothing to plot")
    blocks, origins, decoded = [], [], 0
    for i in rng.permutation(len(shards)):
        position = 0
        for block in reader.iter_chunks([shards[i]]):
            n = batch_length(block)
            blocks.append(block)
            origins.extend((shards[i].file, position + j) for j in range(n))
            position += n
            decoded += sum(values.nbytes for values in block.values())
            if len(origins) >= max_samples or decoded >= max_bytes:
                break
        if len(origins) >= max_samples or decoded >= max_bytes:
            break
    samples = {name: np.concatenate([b[name] for b in blocks]) for name in blocks[0]}
    return Scan(samples, origins)


def hide_filled(schema: Schema, scan: Scan) -> None:
    """Values nan_policy: fill filled (where their mask/ feature says 1) become NaN in ``scan.samples``, so no image,
    line or histogram takes a fill value for data; ``scan.filled`` keeps where they were."""
    for feature in schema.features:
        of = feature.source.get("of")
        if feature.role != "mask" or of not in scan.samples or feature.name not in scan.samples:
            continue
        filled = scan.samples[feature.name] != 0
        values = scan.samples[of].astype(np.float32, copy=True)
        values[filled] = np.nan
        scan.samples[of], scan.filled[of] = values, filled


def unstack(schema: Schema, scan: Scan) -> list[Feature]:
    """The variables to draw: stacked features split back into their channels' variables.

    Adds each channel's values to ``scan.samples`` (and where they were filled to ``scan.filled``) under its
    variable's name.
    """
    variables = []
    for feature in schema.variable_features:
        channels = feature.source.get("channels")
        if not channels:
            variables.append(feature)
            continue
        axis = feature.dims.index("channel")
        dims = tuple(d for d in feature.dims if d != "channel")
        shape = tuple(n for d, n in zip(feature.dims, feature.shape) if d != "channel")
        values = scan.samples[feature.name]
        for i, name in enumerate(channels):
            scan.samples[name] = np.take(values, i, axis=axis + 1)  # after the leading sample axis
            if feature.name in scan.filled:
                scan.filled[name] = np.take(scan.filled[feature.name], i, axis=axis + 1)
            source = feature.source["variables"].get(name, {})
            variables.append(Feature(name, feature.dtype, shape, dims, "variable", source))
    return variables


def pooled(summary: dict[str, Any]) -> tuple[float | None, float | None]:
    """Overall mean and std of a variable from stats.json, pooling per-dim statistics (e.g. per level)."""
    mean, variance, count = summary.get("mean"), summary.get("variance"), summary.get("count")
    if not isinstance(mean, list):
        return mean, summary.get("std")
    counts = np.asarray(count, dtype=np.float64).reshape(-1)
    means = np.asarray(mean, dtype=np.float64).reshape(-1)
    variances = np.asarray(variance, dtype=np.float64).reshape(-1)
    real = counts > 0
    if not real.any():
        return None, None
    total = counts[real].sum()
    overall = float((counts[real] * means[real]).sum() / total)
    spread = (counts[real] * (variances[real] + (means[real] - overall) ** 2)).sum() / total
    return overall, float(np.sqrt(spread))


# ---------------------------------------------------------------------------------------------
# Coordinates


def _units(feature: Feature) -> str:
    return str(feature.source.get("units", "")).strip().lower()


def is_time(feature: Feature) -> bool:
    """A coord feature holding int64 seconds since 1970 (how the pipeline stores datetimes)."""
    return feature.role == "coord" and _units(feature).startswith(EPOCH_UNITS)


def dim_kind(schema: Schema, dim: str) -> str | None:
    """'lat', 'lon' or None for a dim, from its coord feature's units or else its name."""
    for feature in schema.features:
        if feature.role == "coord" and feature.source.get("dim") == dim:
            if _units(feature) in LAT_UNITS:
                return "lat"
            if _units(feature) in LON_UNITS:
                return "lon"
    name = dim.lower()
    return "lat" if name in LAT_NAMES else "lon" if name in LON_NAMES else None


def find_latlon(schema: Schema) -> tuple[str, str] | None:
    """The (latitude, longitude) dims of the samples, if the output has both."""
    dims = [a["dim"] for a in schema.sample.get("axes", [])] or [f.source.get("dim") for f in schema.features]
    kinds = {dim_kind(schema, d): d for d in dims if d}
    return (kinds["lat"], kinds["lon"]) if "lat" in kinds and "lon" in kinds else None


def sample_coord(schema: Schema, sample: dict[str, np.ndarray], dim: str) -> np.ndarray | None:
    """The coordinate values a sample covers along ``dim``: from its coord/ feature or, for a dim
    kept whole in every sample, from the schema."""
    name = f"coord/{dim}"
    if name in sample:
        return np.atleast_1d(sample[name])
    if dim in schema.coords:
        return np.asarray(schema.coords[dim])
    return None


#: Calendars whose dates are the proleptic Gregorian ones numpy's datetime64 counts (after 1582).
GREGORIAN = ("standard", "gregorian", "proleptic_gregorian")


def calendar(feature: Feature) -> str:
    """The calendar of a time coord feature's seconds (proleptic_gregorian if the schema states none)."""
    return str(feature.source.get("calendar", "proleptic_gregorian"))


def to_date(seconds: int, calendar: str):
    """Seconds since 1970 as a date of the calendar they were counted in (cftime: noleap, 360_day, ...)."""
    import cftime

    return cftime.num2date(int(seconds), EPOCH_UNITS, calendar, only_use_cftime_datetimes=True)


def format_time(seconds: int, calendar: str = "proleptic_gregorian") -> str:
    """'2000-02-30 06:00': a time to the minute, in its own calendar."""
    return to_date(seconds, calendar).strftime("%Y-%m-%d %H:%M")


def format_date(seconds: float, calendar: str) -> str:
    """'2000-02-30': the day a time falls on, in its own calendar (an axis tick)."""
    return to_date(round(seconds), calendar).strftime("%Y-%m-%d")


def _number(value: float) -> str:
    return f"{value:.5g}"


def _range(values: np.ndarray, fmt=_number) -> str:
    values = np.atleast_1d(values)
    first, last = values[0], values[-1]
    return fmt(first) if first == last else f"{fmt(first)} to {fmt(last)}"


def coord_text(feature: Feature, values: np.ndarray) -> str:
    """A coord feature's values for a title: '2020-01-03 06:00 UTC', '2000-02-30 00:00 (360_day calendar)',
    'level 500 hPa', 'lat 45 to 25'."""
    if is_time(feature):
        own = calendar(feature)
        text = _range(values, lambda seconds: format_time(seconds, own))
        return text + (" UTC" if own.lower() in GREGORIAN else f" ({own} calendar)")
    units = "" if _units(feature) in LAT_UNITS + LON_UNITS else f" {feature.source.get('units', '')}"
    return f"{feature.source.get('dim', feature.name)} {_range(values)}{units}".rstrip()


def describe_sample(schema: Schema, sample: dict[str, np.ndarray]) -> str:
    """The sample's time and location, e.g. '2020-01-03 06:00 UTC · lat 45 to 25 · lon 90 to 110'."""
    return " · ".join(coord_text(f, sample[f.name]) for f in schema.features if f.role == "coord")


def _position_text(schema: Schema, sample: dict[str, np.ndarray], dim: str) -> str:
    """Where a sample starts along a dim: its coordinate if the output has it, else its index."""
    for feature in schema.features:
        if feature.role == "coord" and feature.source.get("dim") == dim:
            values = np.atleast_1d(sample[feature.name])
            text = coord_text(feature, values[:1])
            text = f"{dim} {text}" if is_time(feature) else text
            return text + (" (window start)" if len(values) > 1 else "")
    return f"{dim} index {int(sample[f'index/{dim}'])}"


# ---------------------------------------------------------------------------------------------
# What to draw of a feature


@dataclasses.dataclass
class Plane:
    """A 2-D slice of a feature for an image, and what was fixed to get it."""

    values: np.ndarray  # (y, x)
    ydim: str
    xdim: str
    fixed: str  # e.g. "level 500", empty if the feature is 2-D


def select_plane(schema: Schema, feature: Feature, values: np.ndarray) -> Plane:
    """The last two dims of a feature (latitude as y), other dims fixed: a kept dim at its middle
    index (the mid level of a column), any other (an offset in time) at its first."""
    dims = list(feature.dims)
    leading, fixed = dims[:-2], []
    index = []
    for axis, dim in enumerate(leading):
        n = values.shape[axis]
        if dim in schema.coords:
            i = n // 2
            fixed.append(f"{dim} {_number(np.asarray(schema.coords[dim])[i])}")
        else:
            i = 0
            fixed.append(f"{dim} 1 of {n}")
        index.append(i)
    plane = values[tuple(index)]
    ydim, xdim = dims[-2], dims[-1]
    if dim_kind(schema, xdim) == "lat" or dim_kind(schema, ydim) == "lon":
        plane, ydim, xdim = plane.T, xdim, ydim
    return Plane(plane, ydim, xdim, ", ".join(fixed))


def spatial_block(schema: Schema, feature: Feature, values: np.ndarray, latlon: tuple[str, str]) -> np.ndarray:
    """A sample's values as a (lat, lon) block for the map: its plane, or the mean over other dims."""
    lat, lon = latlon
    if lat in feature.dims and lon in feature.dims:
        return select_plane(schema, feature, values).values
    return np.full((1, 1), np.nanmean(values) if values.size else np.nan)


@dataclasses.dataclass
class Mosaic:
    """Samples put back on the source grid (lat x lon); NaN where no scanned sample lies."""

    lat: np.ndarray
    lon: np.ndarray
    values: np.ndarray
    samples: int
    matches: str  # which samples were placed (those sharing the reference's other coordinates)


def _fill_gaps(coord: np.ndarray) -> np.ndarray:
    """Coordinates of grid rows no scanned sample covers, interpolated (extrapolated at the ends)."""
    known = np.flatnonzero(~np.isnan(coord))
    if len(known) == 0:
        return np.arange(len(coord), dtype=float)
    if len(known) == 1:
        return coord[known[0]] + (np.arange(len(coord)) - known[0]).astype(float)
    out = np.interp(np.arange(len(coord)), known, coord[known])
    step_lo = (coord[known[1]] - coord[known[0]]) / (known[1] - known[0])
    step_hi = (coord[known[-1]] - coord[known[-2]]) / (known[-1] - known[-2])
    below, above = np.arange(known[0]), np.arange(known[-1] + 1, len(coord))
    out[below] = coord[known[0]] - (known[0] - below) * step_lo
    out[above] = coord[known[-1]] + (above - known[-1]) * step_hi
    return out


def unwrapped(longitudes: np.ndarray) -> np.ndarray:
    """Longitudes in degrees made continuous (330, 345, 360, 375 for 330, 345, 0, 15: a selection across the seam
    runs on), NaN (rows no sample covers) kept: so cells are not drawn across the whole globe between them."""
    out = np.array(longitudes, dtype=np.float64)
    known = ~np.isnan(out)
    out[known] = np.unwrap(out[known], period=360.0)
    return out


def _index(sample: dict[str, Any], dim: str) -> int:
    return int(sample[f"index/{dim}"]) if f"index/{dim}" in sample else 0


def build_mosaic(schema: Schema, scan: Scan, feature: Feature, reference: int, latlon: tuple[str, str]) -> Mosaic:
    """The scanned samples that share the reference sample's other indices (time, level, ...),
    each placed at its index on the lat/lon grid."""
    lat, lon = latlon
    lengths = {a["dim"]: a["length"] for a in schema.sample.get("axes", [])}
    others = [f.name for f in schema.features if f.role == "index" and f.source.get("dim") not in latlon]
    other_dims = [name.split("/", 1)[1] for name in others]
    ref = scan.sample(reference)
    same = np.ones(len(scan), dtype=bool)
    for name in others:
        same &= scan.samples[name] == ref[name]
    rows = np.flatnonzero(same)
    nlat, nlon = lengths.get(lat), lengths.get(lon)
    if nlat is None or nlon is None:  # an older schema without the sample grid: only the samples' extent
        nlat = max(_index(scan.sample(i), lat) + len(sample_coord(schema, scan.sample(i), lat)) for i in rows)
        nlon = max(_index(scan.sample(i), lon) + len(sample_coord(schema, scan.sample(i), lon)) for i in rows)
    grid = np.full((nlat, nlon), np.nan)
    lat_values, lon_values = np.full(nlat, np.nan), np.full(nlon, np.nan)
    for i in rows:
        sample = scan.sample(i)
        block = spatial_block(schema, feature, sample[feature.name], latlon)
        y, x = _index(sample, lat), _index(sample, lon)
        grid[y : y + block.shape[0], x : x + block.shape[1]] = block
        lat_values[y : y + block.shape[0]] = sample_coord(schema, sample, lat)
        lon_values[x : x + block.shape[1]] = sample_coord(schema, sample, lon)
    matches = ", ".join(_position_text(schema, ref, dim) for dim in other_dims)
    return Mosaic(_fill_gaps(lat_values), _fill_gaps(unwrapped(lon_values)), grid, len(rows), matches)


def footprint(mosaic: Mosaic, schema: Schema, sample: dict[str, Any], latlon: tuple[str, str]) -> tuple[slice, slice]:
    """The rows and columns of the mosaic a sample covers (from its index/*, so across the seam too)."""
    out = []
    for dim in latlon:
        start, values = _index(sample, dim), sample_coord(schema, sample, dim)
        out.append(slice(start, start + (len(values) if values is not None else 1)))
    return out[0], out[1]


# ---------------------------------------------------------------------------------------------
# A curvilinear grid: latitude and longitude as 2-D coordinates the records carry


def _aux_kind(feature: Feature) -> str | None:
    attrs = feature.source.get("attrs", {})
    units = str(attrs.get("units", "")).strip().lower()
    name = str(feature.source.get("coordinate", feature.name)).lower()
    if units in LAT_UNITS or attrs.get("standard_name") == "latitude" or name in LAT_NAMES:
        return "lat"
    if units in LON_UNITS or attrs.get("standard_name") == "longitude" or name in LON_NAMES:
        return "lon"
    return None


def cell_corners(centres: np.ndarray) -> np.ndarray:
    """The (ny + 1, nx + 1) corners of cells given their (ny, nx) centres: midway between, extrapolated at the edges
    (a dim one cell long: a zero-width edge)."""
    out = np.asarray(centres, dtype=np.float64)
    for axis in (0, 1):
        first, last = np.take(out, [0], axis), np.take(out, [-1], axis)
        if out.shape[axis] > 1:
            first = 2 * first - np.take(out, [1], axis)
            last = 2 * last - np.take(out, [-2], axis)
        out = np.concatenate([first, out, last], axis=axis)
    return (out[:-1, :-1] + out[1:, :-1] + out[:-1, 1:] + out[1:, 1:]) / 4


def find_curvilinear(schema: Schema) -> tuple[Feature, Feature] | None:
    """The records' own 2-D latitude and longitude (config ``coords:`` of a curvilinear grid) on the same dims."""
    grids = [f for f in schema.features if f.role == "aux_coord" and len(f.dims) == 2]
    for lat in (f for f in grids if _aux_kind(f) == "lat"):
        for lon in (f for f in grids if _aux_kind(f) == "lon"):
            if set(lat.dims) == set(lon.dims):
                return lat, lon
    return None


@dataclasses.dataclass
class Cells:
    """A sample's values on its own 2-D latitudes and longitudes (y, x as the latitude feature lays them)."""

    lat: np.ndarray
    lon: np.ndarray
    values: np.ndarray


@dataclasses.dataclass
class CurvilinearMosaic:
    """The scanned samples sharing the reference's other coordinates, each on its own cells."""

    cells: list[Cells]
    matches: str
    centre: float  # the longitude every cell's are taken within 180 degrees of
    unplaced: int = 0  # samples read whose coordinates are not all finite (a model's land points): not drawn

    def near_centre(self, longitudes: np.ndarray) -> np.ndarray:
        return self.centre + np.mod(longitudes - self.centre + 180.0, 360.0) - 180.0

    @property
    def samples(self) -> int:
        return len(self.cells)


def sample_cells(schema: Schema, feature: Feature, sample: dict[str, Any], grid: tuple[Feature, Feature]) -> Cells:
    """A sample's plane of ``feature`` on the 2-D grid (its mean where it lacks the grid's dims)."""
    lat, lon = grid
    lat_values = np.asarray(sample[lat.name], dtype=np.float64)
    lon_values = np.asarray(sample[lon.name], dtype=np.float64)
    if lon.dims != lat.dims:
        lon_values = lon_values.T
    values = np.asarray(sample[feature.name])
    if set(lat.dims) <= set(feature.dims) and feature.dims[-2:] in (lat.dims, lat.dims[::-1]):
        plane = select_plane(schema, feature, values)
        block = plane.values if (plane.ydim, plane.xdim) == lat.dims else plane.values.T
    else:
        block = np.full(lat_values.shape, np.nanmean(values) if values.size else np.nan)
    return Cells(lat_values, lon_values, np.asarray(block, dtype=np.float64))


def build_curvilinear(
    schema: Schema, scan: Scan, feature: Feature, reference: int, grid: tuple[Feature, Feature]
) -> CurvilinearMosaic:
    """The scanned samples that share the reference sample's other indices (time, level, ...), on their cells;
    longitudes within 180 degrees of the reference's first, so none is drawn across the seam."""
    dims = set(grid[0].dims)
    others = [f.name for f in schema.features if f.role == "index" and f.source.get("dim") not in dims]
    ref = scan.sample(reference)
    same = np.ones(len(scan), dtype=bool)
    for name in others:
        same &= scan.samples[name] == ref[name]
    every = [sample_cells(schema, feature, scan.sample(i), grid) for i in np.flatnonzero(same)]
    cells = [c for c in every if np.isfinite(c.lat).all() and np.isfinite(c.lon).all()]
    if not cells:
        raise UserError(
            f"--map: the {len(every)} samples read that share sample A's coordinates have no finite "
            f"{grid[0].name} and {grid[1].name} to place them at; drop --map"
        )
    matches = ", ".join(_position_text(schema, ref, name.split("/", 1)[1]) for name in others)
    centre = float(np.median(cells[0].lon))
    mosaic = CurvilinearMosaic(cells, matches, centre, len(every) - len(cells))
    for cell in cells:
        cell.lon = mosaic.near_centre(cell.lon)
    return mosaic
