"""The benchmark set as a Zarr store against the same data as NetCDF files (``python -m benchmarks.zarr_vs_netcdf``).

The 800 MB patches set (48 NetCDF-4 files) is copied once into a Zarr v3 store with ARCO-ERA5's
chunking (one time step per chunk, the grid whole), and both are built with the same config,
each ``python -m pipelines.build`` in its own process: wall time, peak RSS of the process tree,
and the bytes the build's reads passed through the kernel (``rchar`` of /proc/<pid>/io: page
cache included, imports included, alike for both). Prints their ratios and whether the shards
are byte-identical.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import runpy
import shutil
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import datasets
from benchmarks.measure import run_measured
from benchmarks.outputs import REPO, same_shards, warm_page_cache
from benchmarks.tables import table

_MARKER = "converted.json"


def ensure_store(archive: Path, store: Path) -> Path:
    """The archive's files joined along time into one Zarr store, one step per chunk (cached)."""
    import warnings

    import xarray as xr

    wanted = {"from": str(archive), "files": len(datasets.input_files(archive)), "chunks": "time=1"}
    marker = store.parent / f"{store.name}.{_MARKER}"
    if marker.exists() and json.loads(marker.read_text()) == wanted:
        return store
    print(f"[zarr] writing {store} from {archive} ...", flush=True)
    shutil.rmtree(store, ignore_errors=True)
    paths = [str(p) for p in datasets.input_files(archive)]
    with xr.open_mfdataset(paths, combine="by_coords", data_vars="minimal", coords="minimal", compat="override") as ds:
        ds = ds.chunk({"time": 1})
        encoding = {name: {"chunks": ds[name].data.chunksize} for name in ds.data_vars}
        with warnings.catch_warnings():  # zarr's note that consolidated metadata is outside the v3 spec
            warnings.simplefilter("ignore", UserWarning)
            ds.to_zarr(store, mode="w", zarr_format=3, consolidated=True, encoding=encoding)
    marker.write_text(json.dumps(wanted))
    return store


def build_child(config: str, result: str) -> None:
    """Run one build in this process and record the bytes its reads passed through (rchar)."""

    def record() -> None:
        io = dict(line.split(": ") for line in Path("/proc/self/io").read_text().splitlines())
        Path(result).write_text(json.dumps({"rchar": int(io["rchar"])}))

    # At exit: the build's module raises SystemExit, and the exit handlers run as the interpreter ends.
    atexit.register(record)
    sys.argv = ["pipelines.build", "--config", config, "--overwrite", "--quiet"]
    runpy.run_module("pipelines.build", run_name="__main__")


def _du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else path.stat().st_size


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.zarr_vs_netcdf", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny data: a smoke test, not a measurement")
    parser.add_argument("--rounds", type=int, default=1, help="builds of each (the fastest is kept)")
    parser.add_argument("--workdir", default=str(Path(tempfile.gettempdir()) / "xtf-bench"))
    parser.add_argument("--child-build", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child_build:
        build_child(*args.child_build)
        return 0

    workdir = Path(args.workdir).resolve()
    spec = datasets.patches(1, args.quick)
    archive = datasets.ensure_archive(workdir, spec)
    store = ensure_store(archive, workdir / "data" / f"{spec.name}.zarr")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    outputs, rows, found = {}, [], {}
    for name, source in (("NetCDF files", archive), ("Zarr store", store)):
        output = workdir / "out" / spec.name / name.split()[0].lower()
        config = datasets.write_config(workdir, spec, archive, output)
        settings = json.loads(json.dumps(datasets.load_config(config)))
        if source == store:
            settings["input"]["paths"] = str(store)
        config.write_text(json.dumps(settings))  # JSON is YAML
        result = workdir / "results" / f"zarr-{name.split()[0].lower()}.json"
        result.parent.mkdir(parents=True, exist_ok=True)
        best = None
        for _ in range(args.rounds):
            warm_page_cache(source)
            command = [sys.executable, "-m", "benchmarks.zarr_vs_netcdf", "--child-build", str(config), str(result)]
            measured = run_measured(command, str(REPO), env)
            if not measured.ok:
                print(measured.output_tail, file=sys.stderr)
                return 1
            if best is None or measured.wall_seconds < best[0].wall_seconds:
                best = (measured, json.loads(result.read_text())["rchar"])
        found[name] = best
        outputs[name] = output
        rows.append(
            [
                name,
                f"{_du(source) / 1e6:,.0f}",
                f"{best[0].wall_seconds:.2f}",
                f"{best[0].peak_rss_bytes / 1e9:.2f}",
                f"{best[1] / 1e6:,.0f}",
            ]
        )
    (nc, nc_read), (zarr, zarr_read) = found["NetCDF files"], found["Zarr store"]
    rows.append(
        [
            "Zarr / NetCDF",
            "",
            f"{zarr.wall_seconds / nc.wall_seconds:.2f}x",
            f"{zarr.peak_rss_bytes / nc.peak_rss_bytes:.2f}x",
            f"{zarr_read / nc_read:.2f}x",
        ]
    )
    stamp = time.strftime("%Y-%m-%dT%H:%M")
    print(f"\n== {spec.name} as a Zarr store vs NetCDF files -- {stamp}, load {os.getloadavg()[0]:.2f} ==")
    print(table(("input", "stored MB", "wall s", "peak RSS GB", "read MB (rchar)"), rows))
    identical = same_shards(outputs["NetCDF files"], outputs["Zarr store"])
    print(f"  shards byte-identical: {identical}")
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
