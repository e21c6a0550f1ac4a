"""The benchmark set as GRIB files and as a kerchunk reference against its NetCDF files (``python -m
benchmarks.inputs_vs_netcdf``).

The patches set (48 NetCDF-4 files at 1x) is converted once, cached in the work directory, into
(a) GRIB 2 files, one per NetCDF file, written with ecCodes (every variable on pressure levels, 16
bits a value, as ERA5's GRIB holds them), and (b) one kerchunk JSON reference over the NetCDF files
(``SingleHdf5ToZarr`` each, joined along time by ``MultiZarrToZarr``; no chunk inlined). The three
are built with the same config (GRIB's names its dims as cfgrib does: latitude, longitude,
isobaricInhPa), each ``python -m pipelines.build`` in its own process: wall time, peak RSS of the
process tree, the bytes the build's reads passed through the kernel (``rchar``, imports included,
alike for all), and what the build's summary says it fetched over the byte ranges of the chunks it
needed. Prints ratios against NetCDF, and compares shards: the reference's must be byte-identical
to the NetCDF build's; GRIB's values are the 16-bit packed ones (and its keys are named as cfgrib
names them), so its shards cannot be: the table gives its sample count against NetCDF's instead.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks import datasets
from benchmarks.measure import run_measured
from benchmarks.outputs import REPO, same_shards, warm_files
from benchmarks.tables import table
from benchmarks.zarr_vs_netcdf import build_child

_MARKER = "converted.json"
#: GRIB 2 packing of every value (ERA5's pressure-level fields are 16 bits too).
BITS_PER_VALUE = 16
INPUTS = ("NetCDF files", "GRIB 2 files", "kerchunk reference")
#: The build's summary line of a Zarr store (a reference is one): MB fetched for MB of chunks needed.
_FETCHED = re.compile(r"read ([\d,.]+) MB from (?:the store|NetCDF-4 chunks) for ([\d,.]+) MB of chunks needed")


def _cached(marker: Path, wanted: dict, written: list[Path]) -> bool:
    """Whether the conversion ``marker`` records was made from these very files and all it wrote is still there."""
    try:
        recorded = json.loads(marker.read_text())
    except (OSError, ValueError):  # none yet, or a marker half written: convert again
        return False
    return recorded == wanted and all(p.exists() for p in written)


def _fingerprint(files: list[Path]) -> list:
    """Each source file's name, size and modification time: a regenerated archive is converted again (a reference
    to files rewritten since would name byte ranges that hold other bytes now)."""
    return [[p.name, p.stat().st_size, p.stat().st_mtime_ns] for p in files]


def ensure_grib(archive: Path, directory: Path) -> list[Path]:
    """Each NetCDF file of the archive as a GRIB 2 file of the same name (``.grib2``), written once (cached)."""
    files = datasets.input_files(archive)
    wanted = {"from": str(archive), "files": _fingerprint(files), "bits": BITS_PER_VALUE}
    marker = directory.parent / f"{directory.name}.{_MARKER}"
    paths = [directory / f"{path.stem}.grib2" for path in files]
    if _cached(marker, wanted, paths):
        return paths
    print(f"[inputs] writing GRIB 2 files into {directory} from {archive} ...", flush=True)
    marker.unlink(missing_ok=True)  # an interrupted conversion is redone, never reused
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    for source, path in zip(files, paths):
        _write_grib(source, path)
    marker.write_text(json.dumps(wanted))
    return paths


def _write_grib(source: Path, path: Path) -> Path:
    """A message per time step, variable and level, on the file's regular lat/lon grid (ecCodes' own sample)."""
    import eccodes
    import pandas as pd
    import xarray as xr

    with xr.open_dataset(source) as ds:
        lat, lon = ds["lat"].values, ds["lon"].values
        grid = {
            "Ni": lon.size,
            "Nj": lat.size,
            "latitudeOfFirstGridPointInDegrees": float(lat[0]),
            "latitudeOfLastGridPointInDegrees": float(lat[-1]),
            "longitudeOfFirstGridPointInDegrees": float(lon[0]),
            "longitudeOfLastGridPointInDegrees": float(lon[-1]),
            "iDirectionIncrementInDegrees": float(lon[1] - lon[0]),
            "jDirectionIncrementInDegrees": float(abs(lat[1] - lat[0])),
        }
        temporary = path.with_suffix(".tmp")
        with open(temporary, "wb") as stream:
            for step, when in enumerate(pd.DatetimeIndex(ds["time"].values)):
                for name in ds.data_vars:
                    values = ds[name].isel(time=step).values
                    for index, level in enumerate(ds["level"].values):
                        handle = eccodes.codes_grib_new_from_samples("regular_ll_pl_grib2")
                        try:
                            for key, value in grid.items():
                                eccodes.codes_set(handle, key, value)
                            for key, value in (
                                ("dataDate", int(f"{when:%Y%m%d}")),
                                ("dataTime", int(f"{when:%H%M}")),
                                ("typeOfLevel", "isobaricInhPa"),
                                ("level", int(level)),
                                ("shortName", name),
                                ("step", 0),
                                ("bitsPerValue", BITS_PER_VALUE),
                            ):
                                eccodes.codes_set(handle, key, value)
                            eccodes.codes_set_values(handle, values[index].astype(np.float64).ravel())
                            eccodes.codes_write(handle, stream)
                        finally:
                            eccodes.codes_release(handle)
    return temporary.rename(path)


def ensure_references(archive: Path, path: Path) -> Path:
    """One kerchunk JSON reference over the archive's NetCDF-4 files along time, written once (cached): every chunk
    a byte range of its file, none inlined, as ``SingleHdf5ToZarr`` and ``MultiZarrToZarr`` make them."""
    from kerchunk.combine import MultiZarrToZarr
    from kerchunk.hdf import SingleHdf5ToZarr

    files = datasets.input_files(archive)
    wanted = {"from": str(archive), "files": _fingerprint(files), "inline_threshold": 0}
    marker = path.parent / f"{path.name}.{_MARKER}"
    if _cached(marker, wanted, [path]):
        return path
    print(f"[inputs] writing the kerchunk reference {path} over {archive} ...", flush=True)
    marker.unlink(missing_ok=True)
    singles = [SingleHdf5ToZarr(str(p), inline_threshold=0).translate() for p in files]
    combined = MultiZarrToZarr(singles, concat_dims=["time"], identical_dims=["level", "lat", "lon"]).translate()
    path.write_text(json.dumps(combined))
    marker.write_text(json.dumps(wanted))
    return path


def _grib_settings(settings: dict, files: list[Path]) -> dict:
    """The NetCDF build's config for the GRIB files: cfgrib's names of the same dims, the pressure levels picked."""
    renamed = {"lat": "latitude", "lon": "longitude", "level": "isobaricInhPa"}
    sample = settings["sample"]
    sample["window"] = {renamed.get(dim, dim): window for dim, window in sample["window"].items()}
    sample["keep"] = [renamed.get(dim, dim) for dim in sample.get("keep", [])]
    settings["input"]["paths"] = str(files[0].parent / "*.grib2")
    settings["input"]["grib"] = {"filter_by_keys": {"typeOfLevel": "isobaricInhPa"}}
    return settings


def _fetched(output: str) -> tuple[float, float] | None:
    """(MB fetched, MB of chunks needed) from the build's summary, None if it printed none."""
    found = _FETCHED.search(output)
    return None if found is None else tuple(float(found.group(i).replace(",", "")) for i in (1, 2))


def _samples(output: Path) -> int:
    from schemas import load_schema

    return load_schema(str(output)).num_examples()


def run(workdir: Path, quick: bool, rounds: int = 1, timeout: float = 3600) -> dict:
    """Build the patches set from each input (each build the fastest of ``rounds``): the results as JSON."""
    workdir = Path(workdir).resolve()
    spec = datasets.patches(1, quick)
    archive = datasets.ensure_archive(workdir, spec)
    grib = ensure_grib(archive, workdir / "data" / f"{spec.name}.grib")
    references = ensure_references(archive, workdir / "data" / f"{spec.name}.refs.json")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    netcdf = datasets.input_files(archive)
    stored = {
        "NetCDF files": sum(p.stat().st_size for p in netcdf),
        "GRIB 2 files": sum(p.stat().st_size for p in grib),
        # the reference file itself, and the files whose byte ranges it names
        "kerchunk reference": references.stat().st_size + sum(p.stat().st_size for p in netcdf),
    }
    warm = {"NetCDF files": netcdf, "GRIB 2 files": grib, "kerchunk reference": [references, *netcdf]}
    results: dict = {
        "dataset": spec.name,
        "quick": quick,
        "started": time.strftime("%Y-%m-%dT%H:%M"),
        "load_at_start": os.getloadavg()[0],
        "rows": {},
        "failed": [],
    }
    for name in INPUTS:
        key = name.split()[0].lower()
        output = workdir / "out" / spec.name / f"inputs-{key}"
        config = datasets.write_config(workdir, spec, archive, output)
        settings = json.loads(json.dumps(datasets.load_config(config)))
        if name == "GRIB 2 files":
            settings = _grib_settings(settings, grib)
        elif name == "kerchunk reference":
            settings["input"]["paths"] = str(references)
        config.write_text(json.dumps(settings))  # JSON is YAML
        result = workdir / "results" / f"inputs-{key}.json"
        result.parent.mkdir(parents=True, exist_ok=True)
        best = None
        for _ in range(rounds):
            warm_files(warm[name])
            command = [sys.executable, "-m", "benchmarks.inputs_vs_netcdf", "--child-build", str(config), str(result)]
            measured = run_measured(command, str(REPO), env, timeout)
            if not measured.ok:
                print(measured.output_tail, file=sys.stderr)
                best = {"ok": False, "error": measured.output_tail[-2000:]}
                break
            if best is None or measured.wall_seconds < best["wall"]:
                fetched = _fetched(measured.output_tail)
                best = {
                    "ok": True,
                    "wall": measured.wall_seconds,
                    "peak_rss": measured.peak_rss_bytes,
                    "rchar": json.loads(result.read_text())["rchar"],
                    "fetched_mb": fetched and fetched[0],
                    "needed_mb": fetched and fetched[1],
                }
        best.update(stored_bytes=stored[name], samples=_samples(output) if best["ok"] else None)
        results["rows"][name] = best
        if not best["ok"]:
            results["failed"].append(f"inputs: {name}")
    outputs = {name: workdir / "out" / spec.name / f"inputs-{name.split()[0].lower()}" for name in INPUTS}
    results["reference_identical"] = same_shards(outputs["kerchunk reference"], outputs["NetCDF files"])
    if results["reference_identical"] is not True:
        results["failed"].append("inputs: kerchunk reference shards not byte-identical to NetCDF's")
    counts = {name: row.get("samples") for name, row in results["rows"].items() if row["ok"]}
    if len(counts) == len(INPUTS) and len(set(counts.values())) != 1:
        results["failed"].append("inputs: sample counts differ: " + ", ".join(f"{n} {c:,}" for n, c in counts.items()))
    for output in outputs.values():  # its own alone: the folder may hold other benchmarks' outputs
        shutil.rmtree(output, ignore_errors=True)
    return results


def _ratio(row: dict, base: dict, key: str) -> str:
    if not (row.get("ok") and base.get("ok")) or not base.get(key) or row.get(key) is None:
        return "-"
    return f"{row[key] / base[key]:.2f}x"


def render(results: dict, *, for_docs: bool = False) -> str:
    """The section as printed: a row per input, one of its ratios against NetCDF's, and the shards compared."""
    rows, base = [], results["rows"].get("NetCDF files", {})
    for name, row in results["rows"].items():
        if not row.get("ok"):
            rows.append([name, f"{row.get('stored_bytes', 0) / 1e6:,.1f}", "FAILED", "-", "-", "-", "-"])
            continue
        fetched = "-" if row["fetched_mb"] is None else f"{row['fetched_mb']:,.1f} / {row['needed_mb']:,.1f}"
        rows.append(
            [
                name,
                f"{row['stored_bytes'] / 1e6:,.1f}",
                f"{row['wall']:.2f}",
                f"{row['peak_rss'] / 1e9:.2f}",
                f"{row['rchar'] / 1e6:,.1f}",
                fetched,
                f"{row['samples']:,}" if row["samples"] is not None else "-",
            ]
        )
    for name, row in results["rows"].items():
        if name != "NetCDF files":
            ratios = [_ratio(row, base, key) for key in ("wall", "peak_rss", "rchar")]
            rows.append([f"{name} / NetCDF", "", *ratios, "", ""])
    headers = ("input", "stored MB", "wall s", "peak RSS GB", "read MB (rchar)", "MB fetched / needed", "samples")
    quick = " QUICK (tiny data: a smoke test, not a measurement)" if results["quick"] else ""
    when = "" if for_docs else f" -- {results['started']}, load {results['load_at_start']:.2f}"
    identical = results.get("reference_identical")
    lines = [
        f"== {results['dataset']} as GRIB 2 files and a kerchunk reference vs NetCDF files{quick}{when} ==",
        table(headers, rows),
        "  stored MB: the kerchunk reference's is its JSON and the NetCDF files it refers to; MB fetched / needed: "
        "the build's own count of the byte ranges it fetched against the stored bytes of the chunks it needed",
        f"  kerchunk reference: shards byte-identical to NetCDF's: {identical}",
        f"  GRIB 2 files: values packed to {BITS_PER_VALUE} bits and keys named as cfgrib names them "
        "(latitude, isobaricInhPa): shards differ by packing, not compared byte for byte; samples above",
    ]
    if results.get("failed"):
        lines.append("FAILED: " + ", ".join(results["failed"]))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.inputs_vs_netcdf", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny data: a smoke test, not a measurement")
    parser.add_argument("--rounds", type=int, default=1, help="builds of each (the fastest is kept)")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds before a build is stopped")
    parser.add_argument("--workdir", default=str(Path(tempfile.gettempdir()) / "xtf-bench"))
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--child-build", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child_build:
        build_child(*args.child_build)
        return 0
    results = run(Path(args.workdir), args.quick, max(1, args.rounds), args.timeout)
    print()
    print(render(results))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 1 if results["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
