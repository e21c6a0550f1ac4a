"""GRIB files written with ecCodes from its own sample messages: forecast fields on pressure levels and at the
surface, one file per analysis time (GRIB 2) or per forecast step (GRIB 1): the GRIB tests' inputs."""

from __future__ import annotations

from pathlib import Path

import numpy as np

#: (shortName, typeOfLevel, levels): temperature and geopotential on pressure levels, 2 m temperature and
#: surface pressure at the surface.
FIELDS = [("t", "isobaricInhPa", (850, 500)), ("z", "isobaricInhPa", (850, 500)), ("sp", "surface", (0,))]
LAT, LON = 7, 12


def _field(rng, name: str, level: int) -> np.ndarray:
    base = {"t": 250.0, "z": 50000.0, "sp": 100000.0}[name]
    return (base + 10 * rng.standard_normal((LAT, LON))).astype(np.float64)


def _message(eccodes, edition: int, name: str, level_type: str, level: int, date: int, hour: int, step: int, values):
    sample = f"regular_ll_{'pl' if level_type == 'isobaricInhPa' else 'sfc'}_grib{edition}"
    handle = eccodes.codes_grib_new_from_samples(sample)
    for key, value in [
        ("Ni", LON),
        ("Nj", LAT),
        ("latitudeOfFirstGridPointInDegrees", 90.0),
        ("longitudeOfFirstGridPointInDegrees", 0.0),
        ("latitudeOfLastGridPointInDegrees", -90.0),
        ("longitudeOfLastGridPointInDegrees", 330.0),
        ("iDirectionIncrementInDegrees", 30.0),
        ("jDirectionIncrementInDegrees", 30.0),
        ("dataDate", date),
        ("dataTime", hour * 100),
        ("typeOfLevel", level_type),
        ("level", level),
        ("shortName", name),
        ("stepUnits", 1),
        ("step", step),
        ("bitsPerValue", 16),
    ]:
        eccodes.codes_set(handle, key, value)
    eccodes.codes_set_values(handle, values.ravel())
    return handle


def write_grib(
    path: Path, edition: int, times: list[tuple[int, int]], steps: list[int], fields=FIELDS, seed: int = 0
) -> Path:
    """One file of ``fields`` at each (date, hour) of ``times`` and each forecast step (hours) of ``steps``."""
    import eccodes

    rng = np.random.default_rng(seed)
    with open(path, "wb") as stream:
        for date, hour in times:
            for step in steps:
                for name, level_type, levels in fields:
                    for level in levels:
                        handle = _message(
                            eccodes, edition, name, level_type, level, date, hour, step, _field(rng, name, level)
                        )
                        eccodes.codes_write(handle, stream)
                        eccodes.codes_release(handle)
    return path


def grib_along_time(root: Path, edition: int = 2, days: int = 3, fields=FIELDS) -> list[Path]:
    """A file per analysis time (00 and 12 UTC of each day), each at steps 0 and 6: forecasts along time."""
    root.mkdir(parents=True, exist_ok=True)
    paths = []
    for day in range(days):
        for hour in (0, 12):
            date = 20200101 + day
            path = root / f"fc_{date}{hour:02d}.grib{edition}"
            paths.append(write_grib(path, edition, [(date, hour)], [0, 6], fields, seed=day * 24 + hour))
    return paths


def grib_along_step(root: Path, edition: int = 1, steps: int = 4, fields=FIELDS) -> list[Path]:
    """One forecast, a file per step (0, 6, 12, ... hours): files along the forecast step."""
    root.mkdir(parents=True, exist_ok=True)
    return [
        write_grib(root / f"step_{6 * s:03d}.grb", edition, [(20200101, 0)], [6 * s], fields, seed=s)
        for s in range(steps)
    ]


def write_ensemble(path: Path, date: int, members: int = 3, seed: int = 0) -> Path:
    """An ensemble forecast's 2 m temperature at one analysis time, a message per member (cfgrib's ``number``)."""
    import eccodes

    rng = np.random.default_rng(seed)
    with open(path, "wb") as stream:
        for member in range(members):
            handle = _message(eccodes, 2, "2t", "surface", 0, date, 0, 0, _field(rng, "t", 0))
            for key, value in [("productDefinitionTemplateNumber", 1), ("numberOfForecastsInEnsemble", members)]:
                eccodes.codes_set(handle, key, value)
            eccodes.codes_set(handle, "number", member)
            eccodes.codes_write(handle, stream)
            eccodes.codes_release(handle)
    return path


def write_reduced_gaussian(path: Path, date: int, seed: int = 0) -> Path:
    """Temperature on ecCodes' reduced Gaussian grid N32 (cfgrib: one ``values`` dim, lat/lon along it)."""
    import eccodes

    rng = np.random.default_rng(seed)
    with open(path, "wb") as stream:
        handle = eccodes.codes_grib_new_from_samples("reduced_gg_pl_32_grib2")
        eccodes.codes_set(handle, "dataDate", date)
        count = eccodes.codes_get(handle, "numberOfValues")
        eccodes.codes_set_values(handle, 250 + 10 * rng.standard_normal(count))
        eccodes.codes_write(handle, stream)
        eccodes.codes_release(handle)
    return path


def write_polar_stereographic(path: Path, date: int, seed: int = 0) -> Path:
    """Temperature on ecCodes' polar stereographic sample grid (cfgrib: dims y, x; 2-D latitude and longitude)."""
    import eccodes

    rng = np.random.default_rng(seed)
    with open(path, "wb") as stream:
        handle = eccodes.codes_grib_new_from_samples("polar_stereographic_pl_grib2")
        eccodes.codes_set(handle, "dataDate", date)
        eccodes.codes_set_values(handle, 250 + 10 * rng.standard_normal(eccodes.codes_get(handle, "numberOfValues")))
        eccodes.codes_write(handle, stream)
        eccodes.codes_release(handle)
    return path


def write_scanned(path: Path, edition: int, scanning: dict, date: int, seed: int = 0) -> Path:
    """Temperature on 2 pressure levels at 2 steps, on a grid scanned as ``scanning`` says (jScansPositively,
    iScansNegatively, alternativeRowScanning), with points missing by the bitmap (and one value at float32's
    largest, which cfgrib takes for missing too): every way a field's values can come out of a message."""
    import eccodes

    rng = np.random.default_rng(seed)
    with open(path, "wb") as stream:
        for step in (0, 6):
            for level in (850, 500):
                values = _field(rng, "t", level)
                values[rng.random(values.shape) < 0.2] = 9999.0  # the bitmap's missing points
                if level == 500:
                    values[0, 1] = float(np.finfo(np.float32).max)
                handle = _message(eccodes, edition, "t", "isobaricInhPa", level, date, 0, step, np.zeros((LAT, LON)))
                eccodes.codes_set(handle, "packingType", "grid_ieee")  # float32's largest value kept as it is
                for key, value in scanning.items():
                    eccodes.codes_set(handle, key, value)
                if scanning.get("jScansPositively"):
                    eccodes.codes_set(handle, "latitudeOfFirstGridPointInDegrees", -90.0)
                    eccodes.codes_set(handle, "latitudeOfLastGridPointInDegrees", 90.0)
                if scanning.get("iScansNegatively"):
                    eccodes.codes_set(handle, "longitudeOfFirstGridPointInDegrees", 330.0)
                    eccodes.codes_set(handle, "longitudeOfLastGridPointInDegrees", 0.0)
                eccodes.codes_set(handle, "bitmapPresent", 1)
                eccodes.codes_set(handle, "missingValue", 9999.0)
                eccodes.codes_set_values(handle, values.ravel())
                eccodes.codes_write(handle, stream)
                eccodes.codes_release(handle)
    return path


def write_multi_field(path: Path, date: int, seed: int = 0) -> Path:
    """Temperature at 850 and 500 hPa as two fields of one GRIB 2 message (a multi-field message)."""
    import eccodes

    rng = np.random.default_rng(seed)
    multi = eccodes.codes_grib_multi_new()
    for level in (850, 500):
        handle = _message(eccodes, 2, "t", "isobaricInhPa", level, date, 0, 0, _field(rng, "t", level))
        eccodes.codes_grib_multi_append(handle, 4, multi)
        eccodes.codes_release(handle)
    with open(path, "wb") as stream:
        eccodes.codes_grib_multi_write(multi, stream)
    eccodes.codes_grib_multi_release(multi)
    return path


def cfgrib_dataset(paths, concat_dim: str, filter_by_keys: dict):
    """The files as xarray reads them through cfgrib, joined along ``concat_dim``: what every record must equal."""
    import xarray as xr

    parts = []
    for path in paths:
        ds = xr.open_dataset(path, engine="cfgrib", backend_kwargs={"indexpath": "", "filter_by_keys": filter_by_keys})
        parts.append(ds.expand_dims(concat_dim) if ds[concat_dim].ndim == 0 else ds)
    return xr.concat(parts, concat_dim, data_vars="minimal", coords="minimal", compat="override").load()
