"""The --plot page of ``pipelines.inspect``: random samples as images or lines, histograms, a footprint map."""

from __future__ import annotations

import io
import string

import fsspec
import numpy as np

from pipelines.plot_data import (
    GREGORIAN,
    CurvilinearMosaic,
    Mosaic,
    Scan,
    build_curvilinear,
    build_mosaic,
    calendar,
    cell_corners,
    describe_sample,
    dim_kind,
    find_curvilinear,
    find_latlon,
    footprint,
    format_date,
    hide_filled,
    is_time,
    pooled,
    sample_cells,
    sample_coord,
    scan_output,
    select_plane,
    unstack,
    unwrapped,
)
from schemas.errors import UserError
from schemas.metadata import load_schema, load_stats
from schemas.reader import Reader
from schemas.schema import Feature, Schema, default_split

MAX_COLUMNS = 6  # variables drawn side by side; more would make unreadable panels
PANEL_WIDTH, SAMPLE_HEIGHT, HIST_HEIGHT = 3.4, 2.7, 2.5
FONT = 8


def plot_output(
    path: str, png: str, split: str | None = None, samples: int = 4, seed: int = 0, with_map: bool = False
) -> str:
    """Draw a page of ``samples`` random samples of a split to ``png`` (local path or fsspec URL)."""
    figure = draw_page(path, split, samples, seed, with_map)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=110)
    with fsspec.open(png, "wb") as stream:
        stream.write(buffer.getvalue())
    return png


def draw_page(path: str, split: str | None = None, samples: int = 4, seed: int = 0, with_map: bool = False):
    """The --plot page as a matplotlib Figure (rendered with Agg, no pyplot state)."""
    schema = load_schema(path)
    split = split or default_split(list(schema.splits))
    reader = Reader(path, split, schema=schema)
    rng = np.random.default_rng(seed)
    scan = scan_output(reader, rng)
    picks = sorted(rng.choice(len(scan), size=min(samples, len(scan)), replace=False).tolist())
    latlon = find_latlon(schema)
    curvilinear = find_curvilinear(schema) if latlon is None else None
    if with_map and latlon is None and curvilinear is None:
        coords = ", ".join(f.name for f in schema.features if f.role in ("coord", "aux_coord")) or "none"
        raise UserError(
            f"{path}: --map needs latitude and longitude coordinates (lat/lon or latitude/longitude dims, or 2-D "
            f"ones in every record: config coords); this output's coordinates are: {coords}; drop --map"
        )
    try:
        stats = load_stats(path).get("variables", {})
    except FileNotFoundError:
        stats = {}
    hide_filled(schema, scan)
    all_variables = unstack(schema, scan)
    variables = all_variables[:MAX_COLUMNS]
    if not variables:
        raise UserError(f"{path}: the schema has no variable features; there is nothing to plot")

    import matplotlib

    # Names and units are shown as written: a "$" in them is no TeX (mathtext would fail on it).
    with matplotlib.rc_context({"text.parse_math": False}):
        mosaic = None
        if with_map and latlon is not None:
            mosaic = build_mosaic(schema, scan, variables[0], picks[0], latlon)
        elif with_map:
            mosaic = build_curvilinear(schema, scan, variables[0], picks[0], curvilinear)
        page = Page(variables, len(picks), mosaic)
        title = f"{path} · split {split!r} · {schema.num_examples(split):,} samples · shuffle seed {schema.seed}"
        if len(all_variables) > MAX_COLUMNS:
            title += f" · first {MAX_COLUMNS} of {len(all_variables)} variables"
        page.figure.suptitle(title, fontsize=FONT + 3, fontweight="bold")
        for row, i in enumerate(picks):
            draw_sample_row(page.rows[row], schema, variables, scan, i, _letter(row))
        draw_histograms(page.histograms, schema, variables, scan, stats)
        if isinstance(mosaic, Mosaic):
            draw_map(page.map, schema, variables[0], scan, picks, latlon, mosaic)
        elif mosaic is not None:
            draw_curvilinear_map(page.map, schema, variables[0], scan, picks, curvilinear, mosaic)
    return page.figure


def _letter(row: int) -> str:
    return string.ascii_uppercase[row] if row < 26 else str(row + 1)


class Page:
    """The figure: one row per sample, a row of histograms, and the map row if asked for."""

    def __init__(self, variables: list[Feature], samples: int, mosaic: Mosaic | CurvilinearMosaic | None):
        # A bare Figure renders with Agg and touches no pyplot state: no display, no backend switch
        # in a notebook that calls this.
        from matplotlib.figure import Figure

        columns = len(variables)
        width = max(10.0, PANEL_WIDTH * columns)
        heights = [SAMPLE_HEIGHT] * samples + [HIST_HEIGHT]
        if mosaic is not None:
            # Size the row to the grid's shape, so that degrees come out about square.
            lat, lon = _extent(mosaic)
            lat_span, lon_span = np.ptp(lat) or 1.0, np.ptp(lon) or 1.0
            heights.append(float(np.clip(0.8 * width * lat_span / lon_span + 1.0, 3.0, 9.0)))
        self.figure = Figure(figsize=(width, sum(heights) + 0.6), layout="constrained")
        subfigures = np.atleast_1d(self.figure.subfigures(len(heights), 1, height_ratios=heights))
        self.rows = [(f, np.atleast_1d(f.subplots(1, columns))) for f in subfigures[:samples]]
        hist = subfigures[samples]
        self.histograms = (hist, np.atleast_1d(hist.subplots(1, columns)))
        self.map = (subfigures[-1], subfigures[-1].subplots(1, 1)) if mosaic is not None else None


def _extent(mosaic: Mosaic | CurvilinearMosaic) -> tuple[np.ndarray, np.ndarray]:
    """Every latitude and longitude the map shows."""
    if isinstance(mosaic, Mosaic):
        return mosaic.lat, mosaic.lon
    return (
        np.concatenate([c.lat.reshape(-1) for c in mosaic.cells]),
        np.concatenate([c.lon.reshape(-1) for c in mosaic.cells]),
    )


def _title(feature: Feature) -> str:
    units = feature.source.get("attrs", {}).get("units")
    return f"{feature.name} [{units}]" if units else feature.name


def _units(feature: Feature) -> str:
    return str(feature.source.get("attrs", {}).get("units", ""))


def draw_sample_row(row, schema: Schema, variables: list[Feature], scan: Scan, i: int, letter: str) -> None:
    subfigure, axes = row
    sample = scan.sample(i)
    shard, position = scan.origins[i]
    where = describe_sample(schema, sample) or "no coordinates"
    subfigure.suptitle(
        f"{letter}  {where}   ({shard}, sample {position})", fontsize=FONT + 1, x=0.01, ha="left", fontweight="bold"
    )
    for ax, feature in zip(axes, variables):
        values = np.asarray(sample[feature.name])
        if values.ndim >= 2:
            draw_image(ax, subfigure, schema, feature, sample)
        elif values.ndim == 1:
            draw_line(ax, schema, feature, sample)
        else:
            ax.text(0.5, 0.5, f"{float(values):.6g} {_units(feature)}", ha="center", va="center", fontsize=FONT + 4)
            ax.set_axis_off()
            ax.set_title(_title(feature), fontsize=FONT + 1)


def _axis_values(schema: Schema, sample, dim: str, n: int) -> tuple[np.ndarray, str]:
    """Coordinates along a dim for an axis (its index if they are unknown or not monotonic)."""
    coord = sample_coord(schema, sample, dim)
    if coord is not None and len(coord) == n:
        coord = coord.astype(float)
        steps = np.diff(coord)
        if n < 2 or np.all(steps > 0) or np.all(steps < 0):
            units = _coord_units(schema, dim)
            return coord, f"{dim} ({units})" if units else dim
    return np.arange(n, dtype=float), f"{dim} (index)"


def _coord_units(schema: Schema, dim: str) -> str:
    for feature in schema.features:
        if feature.role == "coord" and feature.source.get("dim") == dim:
            return str(feature.source.get("units", "")).replace("degrees_north", "°N").replace("degrees_east", "°E")
    return ""


def _colour_limits(values: np.ndarray) -> tuple[str, float | None, float | None]:
    """A diverging map centred on zero for fields of both signs (winds), else sequential."""
    finite = values[np.isfinite(values)]
    if finite.size and finite.min() < 0 < finite.max():
        bound = float(np.abs(finite).max())
        return "RdBu_r", -bound, bound
    return "viridis", None, None


def _time_feature(schema: Schema, dim: str) -> Feature | None:
    return next((f for f in schema.features if f.name == f"coord/{dim}" and is_time(f)), None)


def _dated_ticks(axis, own: str) -> None:
    """Ticks of an axis in seconds since 1970 shown as dates of calendar ``own`` (matplotlib's date axis knows
    the Gregorian calendar only)."""
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    axis.set_major_locator(MaxNLocator(4))
    axis.set_major_formatter(FuncFormatter(lambda seconds, _: format_date(seconds, own)))


def _image_axis(axis, schema: Schema, sample, dim: str, n: int) -> tuple[np.ndarray, str]:
    """An image's coordinates along a dim and its label; times as dates of their own calendar, longitudes
    across the seam run on (345, 360, 375 shown as 345, 0, 15)."""
    coord = sample_coord(schema, sample, dim)
    if dim_kind(schema, dim) == "lon" and coord is not None and len(coord) == n and n > 1:
        values = unwrapped(coord)
        if np.all(np.diff(values) > 0) or np.all(np.diff(values) < 0):
            _degrees_east_axis(axis)
            units = _coord_units(schema, dim)
            return values, f"{dim} ({units})" if units else dim
    values, label = _axis_values(schema, sample, dim, n)
    time_feature = _time_feature(schema, dim)
    if time_feature is None or label.endswith("(index)"):
        return values, label
    own = calendar(time_feature)
    _dated_ticks(axis, own)
    return values, f"{dim} ({own} calendar)"


def draw_image(ax, subfigure, schema: Schema, feature: Feature, sample) -> None:
    plane = select_plane(schema, feature, np.asarray(sample[feature.name]))
    ny, nx = plane.values.shape
    y, ylabel = _image_axis(ax.yaxis, schema, sample, plane.ydim, ny)
    x, xlabel = _image_axis(ax.xaxis, schema, sample, plane.xdim, nx)
    cmap, vmin, vmax = _colour_limits(plane.values)
    values = np.ma.masked_invalid(plane.values)  # NaN and filled values: left blank
    mesh = ax.pcolormesh(x, y, values, shading="nearest", cmap=cmap, vmin=vmin, vmax=vmax)
    colorbar = subfigure.colorbar(mesh, ax=ax, shrink=0.9, pad=0.02)
    colorbar.ax.tick_params(labelsize=FONT - 1)
    ax.set_title(_title(feature) + (f" at {plane.fixed}" if plane.fixed else ""), fontsize=FONT + 1)
    ax.set_xlabel(xlabel, fontsize=FONT)
    ax.set_ylabel(ylabel, fontsize=FONT)
    ax.tick_params(labelsize=FONT - 1)


def draw_line(ax, schema: Schema, feature: Feature, sample) -> None:
    import matplotlib.dates as mdates

    values = np.asarray(sample[feature.name])
    dim = feature.dims[0]
    time_feature = _time_feature(schema, dim)
    dated = time_feature is not None and np.size(sample[time_feature.name]) == len(values)
    own = calendar(time_feature) if dated else ""
    if dated and own.lower() in GREGORIAN:
        x = np.asarray(sample[time_feature.name]).astype("datetime64[s]")
        locator = mdates.AutoDateLocator(maxticks=6)
        ax.xaxis.set_major_locator(locator)
        ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator))
        xlabel = f"{dim} (UTC)"
    elif dated:
        x = np.asarray(sample[time_feature.name]).astype(np.float64)
        _dated_ticks(ax.xaxis, own)
        xlabel = f"{dim} ({own} calendar)"
    else:
        x, xlabel = _axis_values(schema, sample, dim, len(values))
    ax.plot(x, values, marker=".", markersize=3, linewidth=1)
    ax.set_title(_title(feature), fontsize=FONT + 1)
    ax.set_xlabel(xlabel, fontsize=FONT)
    ax.set_ylabel(_units(feature) or feature.name, fontsize=FONT)
    ax.tick_params(labelsize=FONT - 1)
    ax.grid(alpha=0.3)


def _filled_note(schema: Schema, feature: Feature, scan: Scan) -> str:
    """What the histogram of ``feature`` leaves out or cannot: values nan_policy: fill filled."""
    if feature.name in scan.filled:
        count = int(np.count_nonzero(scan.filled[feature.name]))
        return f", {count:,} filled left out" if count else ""
    config = schema.config
    if config.get("nan_policy") == "fill" and np.issubdtype(scan.samples[feature.name].dtype, np.floating):
        return f" (filled ones, = {config.get('fill_value')}, among them: no mask/ feature tells them)"
    return ""


def draw_histograms(row, schema: Schema, variables: list[Feature], scan: Scan, stats: dict) -> None:
    subfigure, axes = row
    subfigure.suptitle(
        f"Values of the {len(scan):,} samples read; the band is mean ± std over all samples (stats.json)",
        fontsize=FONT + 1,
        x=0.01,
        ha="left",
        fontweight="bold",
    )
    for ax, feature in zip(axes, variables):
        values = scan.samples[feature.name].astype(np.float64).reshape(-1)
        finite = values[np.isfinite(values)]
        ax.hist(finite, bins=60, color="0.55")
        mean, std = pooled(stats.get(feature.name) or {})
        if mean is not None and std is not None:
            ax.axvspan(mean - std, mean + std, color="tab:orange", alpha=0.25, label="mean ± std")
            ax.axvline(mean, color="tab:red", linewidth=1.5, label=f"mean {mean:.4g}")
            ax.legend(fontsize=FONT - 1, loc="upper right", framealpha=0.8)
        ax.set_title(f"{feature.name}: {finite.size:,} values{_filled_note(schema, feature, scan)}", fontsize=FONT + 1)
        ax.set_xlabel(_units(feature) or feature.name, fontsize=FONT)
        ax.set_ylabel("count", fontsize=FONT)
        ax.tick_params(labelsize=FONT - 1)


def draw_map(row, schema: Schema, feature: Feature, scan: Scan, picks: list[int], latlon, mosaic: Mosaic) -> None:
    from matplotlib.patches import Rectangle

    subfigure, ax = row
    cmap, vmin, vmax = _colour_limits(mosaic.values)
    values = np.ma.masked_invalid(mosaic.values)
    mesh = ax.pcolormesh(mosaic.lon, mosaic.lat, values, shading="nearest", cmap=cmap, vmin=vmin, vmax=vmax)
    colorbar = subfigure.colorbar(mesh, ax=ax, shrink=0.85, pad=0.01)
    colorbar.set_label(_title(feature), fontsize=FONT)
    colorbar.ax.tick_params(labelsize=FONT - 1)
    dlat = np.ptp(mosaic.lat) / max(len(mosaic.lat) - 1, 1)
    dlon = np.ptp(mosaic.lon) / max(len(mosaic.lon) - 1, 1)
    lat0, lat1 = mosaic.lat.min() - dlat / 2, mosaic.lat.max() + dlat / 2
    lon0, lon1 = mosaic.lon.min() - dlon / 2, mosaic.lon.max() + dlon / 2
    ax.add_patch(Rectangle((lon0, lat0), lon1 - lon0, lat1 - lat0, fill=False, edgecolor="0.3", linestyle="--"))
    lat_dim, lon_dim = latlon
    for number, i in enumerate(picks):
        sample = scan.sample(i)
        rows, columns = footprint(mosaic, schema, sample, latlon)  # on the mosaic's longitudes: across the seam too
        lats, lons = mosaic.lat[rows], mosaic.lon[columns]
        if lats.size == 1 and lons.size == 1:  # a point sample: a box of one cell would be invisible
            ax.plot(lons, lats, marker="o", markersize=8, markerfacecolor="white", markeredgecolor="black", mew=2)
            anchor = (float(lons[0]), float(lats[0]))
        else:
            y0, y1 = float(lats.min()) - dlat / 2, float(lats.max()) + dlat / 2
            x0, x1 = float(lons.min()) - dlon / 2, float(lons.max()) + dlon / 2
            for colour, width in (("white", 3.5), ("black", 1.5)):  # a halo keeps it visible on any colour
                ax.add_patch(Rectangle((x0, y0), x1 - x0, y1 - y0, fill=False, edgecolor=colour, linewidth=width))
            anchor = (x1, y1)
        ax.annotate(
            _letter(number),
            anchor,
            xytext=(4, 4),
            textcoords="offset points",
            fontsize=FONT + 2,
            fontweight="bold",
            bbox={"boxstyle": "square,pad=0.15", "facecolor": "white", "edgecolor": "black", "linewidth": 0.8},
        )
    margin_lat, margin_lon = 0.03 * (lat1 - lat0), 0.03 * (lon1 - lon0)
    ax.set_xlim(lon0 - margin_lon, lon1 + margin_lon)
    ax.set_ylim(lat0 - margin_lat, lat1 + margin_lat)
    _degrees_east(ax)
    ax.set_xlabel(f"{lon_dim} (°E)", fontsize=FONT)
    ax.set_ylabel(f"{lat_dim} (°N)", fontsize=FONT)
    ax.tick_params(labelsize=FONT - 1)
    if lat_dim in feature.dims and lon_dim in feature.dims:
        plane = select_plane(schema, feature, np.asarray(scan.sample(picks[0])[feature.name]))
        what = f"{feature.name} at {plane.fixed}" if plane.fixed else feature.name
    else:
        what = f"the mean of {feature.name} over each sample"
    subfigure.suptitle(
        f"Where the samples lie: A-{_letter(len(picks) - 1)} on the {len(mosaic.lat)} x {len(mosaic.lon)} source grid "
        f"(dashed). Background: {what}, from the {mosaic.samples:,} samples read that share sample A's "
        f"{mosaic.matches or 'coordinates'}; blank where none was read{_blank_too(scan, mosaic.values)}",
        fontsize=FONT + 1,
        x=0.01,
        ha="left",
        fontweight="bold",
        wrap=True,
    )


def _blank_too(scan: Scan, values: np.ndarray) -> str:
    """Why else the map may be blank somewhere: NaN in the data, or values nan_policy: fill filled."""
    if any(np.any(filled) for filled in scan.filled.values()):
        return " or a value was filled (or NaN)"
    return " or a value is NaN" if np.isnan(values).any() else ""


def _degrees_east(ax) -> None:
    _degrees_east_axis(ax.xaxis)


def _degrees_east_axis(axis) -> None:
    """Longitude ticks as degrees in [0, 360): a map across the seam runs on past 360 (or below 0)."""
    from matplotlib.ticker import FuncFormatter

    axis.set_major_formatter(FuncFormatter(lambda value, _: f"{value % 360:g}"))


def draw_curvilinear_map(
    row, schema: Schema, feature: Feature, scan: Scan, picks: list[int], grid, mosaic: CurvilinearMosaic
) -> None:
    """The samples on their own 2-D latitudes and longitudes (a curvilinear grid), outlined where picked."""
    subfigure, ax = row
    cmap, vmin, vmax = _colour_limits(np.concatenate([c.values.reshape(-1) for c in mosaic.cells]))
    if vmin is None:  # one colour scale for every sample's cells
        finite = np.concatenate([c.values[np.isfinite(c.values)] for c in mosaic.cells])
        vmin, vmax = (float(finite.min()), float(finite.max())) if finite.size else (None, None)
    mesh = None
    for cells in mosaic.cells:
        values = np.ma.masked_invalid(cells.values)
        mesh = ax.pcolormesh(cells.lon, cells.lat, values, shading="nearest", cmap=cmap, vmin=vmin, vmax=vmax)
    colorbar = subfigure.colorbar(mesh, ax=ax, shrink=0.85, pad=0.01)
    colorbar.set_label(_title(feature), fontsize=FONT)
    colorbar.ax.tick_params(labelsize=FONT - 1)
    for number, i in enumerate(picks):
        cells = sample_cells(schema, feature, scan.sample(i), grid)
        if not (np.isfinite(cells.lat).all() and np.isfinite(cells.lon).all()):
            continue  # (not placed: the title counts it)
        lat, lon = cell_corners(cells.lat), cell_corners(mosaic.near_centre(cells.lon))  # around its cells
        edge_lat = np.concatenate([lat[0, :], lat[1:, -1], lat[-1, -2::-1], lat[-2::-1, 0]])
        edge_lon = np.concatenate([lon[0, :], lon[1:, -1], lon[-1, -2::-1], lon[-2::-1, 0]])
        for colour, width in (("white", 3.5), ("black", 1.5)):  # a halo keeps it visible on any colour
            ax.plot(edge_lon, edge_lat, color=colour, linewidth=width)
        top = int(np.argmax(edge_lat))
        ax.annotate(
            _letter(number),
            (float(edge_lon[top]), float(edge_lat[top])),
            xytext=(4, 4),
            textcoords="offset points",
            fontsize=FONT + 2,
            fontweight="bold",
            bbox={"boxstyle": "square,pad=0.15", "facecolor": "white", "edgecolor": "black", "linewidth": 0.8},
        )
    lat_name, lon_name = (str(f.source.get("coordinate", f.name)) for f in grid)
    _degrees_east(ax)
    ax.set_xlabel(f"{lon_name} (°E)", fontsize=FONT)
    ax.set_ylabel(f"{lat_name} (°N)", fontsize=FONT)
    ax.tick_params(labelsize=FONT - 1)
    subfigure.suptitle(
        f"Where the samples lie: A-{_letter(len(picks) - 1)} outlined on their own {lat_name}/{lon_name} "
        f"(a curvilinear grid). Background: {feature.name}, from the {mosaic.samples:,} samples "
        f"read that share sample A's {mosaic.matches or 'coordinates'}, each on its cells; blank where none was "
        f"read{_blank_too(scan, np.concatenate([c.values.reshape(-1) for c in mosaic.cells]))}"
        + (f"; {mosaic.unplaced:,} without finite coordinates not drawn" if mosaic.unplaced else ""),
        fontsize=FONT + 1,
        x=0.01,
        ha="left",
        fontweight="bold",
        wrap=True,
    )
