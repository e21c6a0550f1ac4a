"""Zarr reads at ARCO-ERA5's real chunking (benchmarks.scale's ``zarr`` part): bytes fetched per stored byte.

A store of 2 steps shaped as ARCO-ERA5 (37 levels x 721 x 1440, one step of a variable per chunk,
the whole globe in it; the docs' variables: four on levels and one at the surface, 1.2 GB) is
written once into the work directory, then built with the docs' 32x32 patches, all levels and
the 3 selected levels, each ``python -m pipelines.build`` in its own process: the bytes it
fetched against the stored bytes of the chunks it needed (its summary line), and its peak RSS.
The same for a NetCDF-4 copy of the store chunked alike (one file, a step of a variable per
chunk): the chunks it read against those it needed.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import numpy as np

from benchmarks.measure import run_measured
from benchmarks.targets import GB, MAX_ZARR_BUILD_RSS, MAX_ZARR_FETCHED_PER_STORED, Target

LEVELS = [1, 2, 3, 5, 7, 10, 20, 30, 50, 70, 100, 125, 150, 175, 200, 225, 250, 300, 350, 400, 450, 500, 550, 600,
          650, 700, 750, 775, 800, 825, 850, 875, 900, 925, 950, 975, 1000]  # fmt: skip
ON_LEVELS = ("temperature", "geopotential", "u_component_of_wind", "v_component_of_wind")
SURFACE = "2m_temperature"
SELECTED = [500, 700, 850]
#: ARCO-ERA5's grid; --quick: a coarse one, a smoke test of the rows (not a measurement).
FULL = {"steps": 2, "lat": 721, "lon": 1440}
QUICK = {"steps": 2, "lat": 40, "lon": 72}
_MARKER = "store.json"
_SUMMARY = re.compile(
    r"read ([\d,.]+) MB from (?:the store|NetCDF-4 chunks) for ([\d,.]+) MB of chunks needed \(([\d,.]+)x"
)


def ensure_store(workdir: Path, steps: int, lat: int, lon: int) -> Path:
    """The ARCO-shaped store, written once (a marker says what it holds)."""
    import zarr

    store = workdir / f"arco_{steps}x{lat}x{lon}.zarr"
    wanted = {"steps": steps, "lat": lat, "lon": lon, "variables": [*ON_LEVELS, SURFACE]}
    marker = store.parent / f"{store.name}.{_MARKER}"
    if marker.exists() and json.loads(marker.read_text()) == wanted:
        return store
    print(f"[zarr] writing {store} ...", flush=True)
    shutil.rmtree(store, ignore_errors=True)
    group = zarr.create_group(store, attributes={})
    time = group.create_array("time", shape=(steps,), dtype="int64", dimension_names=["time"])
    time[:] = np.arange(steps)
    time.attrs.update({"units": "hours since 2010-01-01", "calendar": "proleptic_gregorian"})
    group.create_array("level", shape=(len(LEVELS),), dtype="int64", dimension_names=["level"])[:] = LEVELS
    for name, values in (("latitude", np.linspace(90, -90, lat)), ("longitude", np.arange(lon) * 360 / lon)):
        group.create_array(name, shape=values.shape, dtype="float32", dimension_names=[name])[:] = values
    rng = np.random.default_rng(0)
    for name in (*ON_LEVELS, SURFACE):
        dims = ["time", "latitude", "longitude"] if name == SURFACE else ["time", "level", "latitude", "longitude"]
        shape = tuple({"time": steps, "level": len(LEVELS), "latitude": lat, "longitude": lon}[d] for d in dims)
        array = group.create_array(name, shape=shape, chunks=(1, *shape[1:]), dtype="float32", dimension_names=dims)
        for step in range(steps):  # a step at a time: the whole store is 1.2 GB
            array[step] = rng.standard_normal(shape[1:], dtype=np.float32)
    zarr.consolidate_metadata(store)
    marker.write_text(json.dumps(wanted))
    return store


def ensure_netcdf(store: Path) -> Path:
    """The store copied once into one NetCDF-4 file, chunked as the store is (uncompressed, as ARCO's NetCDF peers)."""
    import xarray as xr

    path = store.with_suffix(".nc")
    marker = store.parent / f"{path.name}.{_MARKER}"
    wanted = (store.parent / f"{store.name}.{_MARKER}").read_text()
    if marker.exists() and marker.read_text() == wanted:
        return path
    print(f"[zarr] writing {path} ...", flush=True)
    with xr.open_zarr(store, chunks=None) as ds:
        encoding = {name: {"chunksizes": (1, *ds[name].shape[1:])} for name in (*ON_LEVELS, SURFACE)}
        ds.to_netcdf(path, engine="netcdf4", encoding=encoding)
    marker.write_text(wanted)
    return path


def _config(workdir: Path, store: Path, name: str, levels: list[int] | None) -> Path:
    import yaml

    config = {
        "input": {"paths": str(store), "concat_dim": "time"},
        "variables": [*ON_LEVELS, SURFACE],
        "sample": {"window": {"latitude": 32, "longitude": 32}, "keep": ["level"]},
        "output": {"path": str(workdir / "out" / "zarr" / name)},
    }
    if levels:
        config["select"] = {"level": levels}
    path = workdir / f"zarr-{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _parse(output: str) -> dict:
    found = _SUMMARY.search(output)
    if found is None:
        return {"fetched_mb": None, "needed_mb": None, "fetched_per_stored": None}
    fetched, needed, ratio = (float(found.group(i).replace(",", "")) for i in (1, 2, 3))
    return {"fetched_mb": fetched, "needed_mb": needed, "fetched_per_stored": ratio}


def run_zarr(
    workdir: Path, repo: Path, env: dict[str, str], quick: bool = False, timeout: float = 3600, netcdf: bool = False
) -> dict:
    """{"all levels": row, "3 levels": row}: each build's fetched MB, needed MB, their ratio, peak RSS and time.
    ``netcdf``: of the store's NetCDF-4 copy instead ("NetCDF-4, all levels", "NetCDF-4, 3 levels")."""
    shape = QUICK if quick else FULL
    store = ensure_store(workdir, **shape)
    source = ensure_netcdf(store) if netcdf else store
    rows = {}
    prefix = "NetCDF-4, " if netcdf else ""
    for name, levels in ((f"{prefix}all levels", None), (f"{prefix}3 levels", SELECTED)):
        config = _config(workdir, source, name.replace(" ", "-").replace(",", ""), levels)
        command = [sys.executable, "-m", "pipelines.build", "--config", str(config), "--overwrite", "--quiet"]
        measured = run_measured(command, str(repo), env, timeout)
        rows[name] = {
            "ok": measured.ok,
            "wall": measured.wall_seconds,
            "peak_rss": measured.peak_rss_bytes,
            "shape": shape,
            "source": "NetCDF-4" if netcdf else "Zarr",
            **_parse(measured.output_tail),
        }
        if not measured.ok:
            rows[name]["error"] = measured.output_tail[-2000:]
            print(measured.output_tail[-2000:], file=sys.stderr)
    shutil.rmtree(workdir / "out" / "zarr", ignore_errors=True)
    return rows


def _fetched_name(row: dict, name: str) -> str:
    if row.get("source") == "NetCDF-4":
        return f"NetCDF-4 chunk bytes read / stored, ARCO chunking, {name.removeprefix('NetCDF-4, ')}"
    return f"Zarr bytes fetched / stored, ARCO chunking, {name}"


def targets(rows: dict) -> list[Target]:
    """Bytes fetched per stored byte of the chunks needed, every build; the peak RSS of the store's builds (the
    issue's target is a store's; the NetCDF-4 builds' is reported beside it)."""
    found = []
    for name, row in rows.items():
        ok = row.get("ok")
        found.append(
            Target(
                _fetched_name(row, name),
                row.get("fetched_per_stored") if ok else None,
                MAX_ZARR_FETCHED_PER_STORED,
                True,
            )
        )
        if row.get("source") == "NetCDF-4":
            continue
        found.append(
            Target(
                f"peak RSS, local build of 2 ARCO steps, {name}",
                row["peak_rss"] / GB if ok else None,
                MAX_ZARR_BUILD_RSS / GB,
                True,
                "GB",
            )
        )
    return found


def report_rows(rows: dict, by_name: dict[str, Target]) -> list[list[str]]:
    """The rows of benchmarks.scale's table: (what, value, against, ratio, target, result)."""
    out = []
    for name, row in rows.items():
        shape = row.get("shape", {})
        label = name if row.get("source") == "NetCDF-4" else f"Zarr {name}"
        what = f"{label}, 2 steps of 37 x {shape.get('lat')} x {shape.get('lon')}"
        fetched = by_name.get(_fetched_name(row, name))
        rss = by_name.get(f"peak RSS, local build of 2 ARCO steps, {name}")
        if not row.get("ok"):
            out.append([f"{what}: build", "FAILED", "-", "-", "-", ""])
            continue
        ratio = row.get("fetched_per_stored")
        out.append(
            [
                f"{what}: MB fetched / MB of chunks needed",
                f"{row['fetched_mb']:,.1f}" if row.get("fetched_mb") is not None else "-",
                f"{row['needed_mb']:,.1f}" if row.get("needed_mb") is not None else "-",
                "-" if ratio is None else f"{ratio:.2f}",
                f"<= {fetched.limit:g}x" if fetched else "-",
                fetched.status if fetched else "",
            ]
        )
        out.append(
            [
                f"{what}: peak RSS (GB), wall {row['wall']:.1f} s",
                f"{row['peak_rss'] / GB:.2f}",
                "-",
                "-",
                f"<= {rss.limit:g} GB" if rss else "-",
                rss.status if rss else "",
            ]
        )
    return out
