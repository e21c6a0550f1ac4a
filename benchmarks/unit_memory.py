"""Worker memory and remote reads per unit (``python -m benchmarks.unit_memory``): prints ratios.

1. Peak RSS of a process that plans and cuts one unit of an ERA5-shaped NetCDF-4 file (3
   variables x 37 levels x 721 x 1440 float32, 2 steps: 0.92 GB, written once into the work
   directory), with the default unit budget, against a unit of one whole step (what units were
   when they split along the concat dim only).
2. Bytes read per stored byte of the units' slabs on gs:// (the storage emulator), for NetCDF-4
   (contiguous and chunked) and classic files, at several HDF5 block sizes, against the
   whole-file copies workers made before.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from benchmarks.measure import run_captured

REPO = Path(__file__).resolve().parents[1]
#: The storage emulator as the tests start it (benchmarks read and write gs:// through it).
EMULATOR = REPO / "tests" / "gcs_emulator.py"
ERA5_SAMPLE = {"window": {"lat": {"size": 9, "stride": 9}, "lon": {"size": 9, "stride": 9}}, "keep": ["level"]}
TARGET_PEAK_BYTES = 1e9
BLOCK_SIZES = (4 * 1024, 8 * 1024, 16 * 1024, 64 * 1024, 256 * 1024)


# -- 1. one unit of ERA5-shaped data ------------------------------------------------------------


def ensure_era5_file(directory: Path, steps: int, levels: int, lat: int, lon: int) -> Path:
    """Three float32 variables (time, level, lat, lon), contiguous NetCDF-4, written once."""
    import netCDF4

    path = directory / f"era5_shaped_{steps}x{levels}x{lat}x{lon}.nc"
    if path.exists():
        return path
    directory.mkdir(parents=True, exist_ok=True)
    needed = 3 * steps * levels * lat * lon * 4
    free = shutil.disk_usage(directory).free
    if free < 2 * needed:
        sys.exit(
            f"{directory}: {free / 1e9:.1f} GB free, the ERA5-shaped file needs {needed / 1e9:.1f} GB; use --workdir"
        )
    rng = np.random.default_rng(0)
    partial = path.with_suffix(".tmp")
    with netCDF4.Dataset(partial, "w", format="NETCDF4") as nc:
        for dim, size in [("time", steps), ("level", levels), ("lat", lat), ("lon", lon)]:
            nc.createDimension(dim, size)
        nc.createVariable("time", "i4", ("time",))[:] = np.arange(steps)
        nc["time"].units = "hours since 2020-01-01"
        nc.createVariable("level", "i4", ("level",))[:] = np.linspace(1000, 1, levels).astype("i4")
        nc.createVariable("lat", "f4", ("lat",))[:] = np.linspace(90, -90, lat)
        nc.createVariable("lon", "f4", ("lon",))[:] = np.linspace(0, 360, lon, endpoint=False)
        for name, mean in [("t", 250.0), ("u", 5.0), ("v", 0.0)]:
            variable = nc.createVariable(name, "f4", ("time", "level", "lat", "lon"))
            for step in range(steps):  # one step at a time: 150 MB each
                variable[step] = mean + rng.standard_normal((levels, lat, lon), dtype=np.float32)
    return partial.rename(path)


def _peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def cut_one_unit(path: str, whole_step: bool) -> dict:
    """In this process: plan with the default budget, cut one unit; the process's peak RSS before and after."""
    from planning.config import parse_config
    from planning.plan import make_plan
    from planning.sampling import Unit
    from planning.specs import cut_spec
    from transforms.cut import cut_unit

    config = parse_config({"input": {"paths": path}, "sample": ERA5_SAMPLE, "output": {"path": "unused"}})
    plan = make_plan(config)
    unit = plan.units[0]
    if whole_step:
        unit = Unit(0, tuple((0, 1) if a.dim == "time" else (0, a.count) for a in plan.grid.grid_axes))
    import psutil

    before = psutil.Process().memory_info().rss
    block = cut_unit(cut_spec(plan), plan.sources, unit)
    return {
        "units": len(plan.units),
        "samples": block.num_samples,
        "box": {d: list(r) for d, r in plan.grid.source_box(unit).items()},
        "rss_before_cut": before,
        "peak": _peak_rss(),
    }


def _growth(result: dict) -> float:
    return max(result["peak"] - result["rss_before_cut"], 1)


def measure_unit_memory(workdir: Path, quick: bool) -> list[str]:
    shape = (2, 4, 73, 144) if quick else (2, 37, 721, 1440)
    path = ensure_era5_file(workdir / "unit_memory", *shape)
    results = {}
    for mode in ("planned", "whole-step"):
        command = [sys.executable, "-m", "benchmarks.unit_memory", "--cut-one", str(path), mode]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p))
        done = run_captured(command, str(REPO), env)  # a fresh interpreter (forked warm in a smoke run)
        if done.returncode != 0:
            sys.exit(f"cutting one unit ({mode}) failed:\n{done.stderr[-3000:]}")
        results[mode] = json.loads(done.stdout.strip().splitlines()[-1])
    planned, whole = results["planned"], results["whole-step"]
    step_bytes = 3 * math.prod(shape[1:]) * 4
    lines = [
        f"ERA5-shaped file: 3 variables x {' x '.join(map(str, shape[1:]))} float32, {shape[0]} steps "
        f"({os.path.getsize(path) / 1e9:.2f} GB); one step is {step_bytes / 64e6:.1f}x the unit budget",
        f"  default budget: {planned['units']} units; one unit reads {planned['box']}",
        f"  peak RSS of the process, one planned unit: {planned['peak'] / 1e6:.0f} MB "
        f"({planned['peak'] / TARGET_PEAK_BYTES:.2f}x the 1 GB target; RSS before the cut "
        f"{planned['rss_before_cut'] / 1e6:.0f} MB)",
        f"  peak RSS, one whole step as one unit (before): {whole['peak'] / 1e6:.0f} MB "
        f"(planned / whole step: {planned['peak'] / whole['peak']:.2f}; "
        f"growth over RSS before the cut: {_growth(planned) / _growth(whole):.2f})",
    ]
    return lines


# -- 2. remote reads --------------------------------------------------------------------------


def _free_port() -> int:
    with contextlib.closing(socket.socket()) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def storage_emulator(bucket: str, request_log: Path | None = None) -> Iterator[subprocess.Popen]:
    """gcp-storage-emulator in memory as the tests run it (tests/gcs_emulator.py: a listen queue deep enough for
    concurrent range requests, GCS's moveTo, no metadata file rewritten at each upload); yields its process.

    ``request_log``: a file the emulator appends each request it answers to, one JSON line each.
    """
    import fsspec

    port = _free_port()
    arguments = ["start", "--host=127.0.0.1", f"--port={port}", "--in-memory", f"--default-bucket={bucket}", "--quiet"]
    env = dict(os.environ, XTF_EMULATOR_REQUEST_LOG=str(request_log)) if request_log is not None else None
    # Its own log (planning closes some reads early: broken pipes) says nothing about what is measured.
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    process = subprocess.Popen([sys.executable, str(EMULATOR), *arguments], env=env, **quiet)
    saved = {k: os.environ.get(k) for k in ("STORAGE_EMULATOR_HOST", "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT")}
    try:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
                break
            if time.monotonic() > deadline or process.poll() is not None:
                sys.exit("the storage emulator did not start")
            time.sleep(0.05)
        os.environ["STORAGE_EMULATOR_HOST"] = f"http://127.0.0.1:{port}"
        os.environ["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] = "false"
        fsspec.config.conf.pop("gs", None)
        yield process
    finally:
        process.terminate()
        process.wait(timeout=10)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _write_formats(directory: Path, quick: bool) -> dict[str, list[Path]]:
    """The same ERA5-like archive as contiguous NetCDF-4, chunked and compressed NetCDF-4, and classic files."""
    import xarray as xr

    from pipelines.demo import ArchiveShape, write_archive

    shape = ArchiveShape(
        num_files=2, steps_per_file=2 if quick else 4, levels=4 if quick else 37, lat=31 if quick else 61, lon=120
    )
    contiguous = write_archive(directory / "netcdf4", shape)
    formats = {"NetCDF-4, contiguous": contiguous, "NetCDF-4, chunked + zlib": [], "classic (CDF-2, records)": []}
    for path in contiguous:
        with xr.open_dataset(path) as ds:
            chunks = (1, 1, shape.lat // 2 + 1, shape.lon // 2)  # per level, a quarter of the globe
            encoding = {v: {"zlib": True, "complevel": 1, "chunksizes": chunks} for v in ds.data_vars}
            (directory / "chunked").mkdir(exist_ok=True)
            ds.to_netcdf(directory / "chunked" / path.name, encoding=encoding)
            (directory / "classic").mkdir(exist_ok=True)
            ds.to_netcdf(directory / "classic" / path.name, format="NETCDF3_64BIT", unlimited_dims=["time"])
        formats["NetCDF-4, chunked + zlib"].append(directory / "chunked" / path.name)
        formats["classic (CDF-2, records)"].append(directory / "classic" / path.name)
    return formats


def _stored_bytes(local: Path, variables, box: dict[str, tuple[int, int]], concat_range: tuple[int, int]) -> int:
    """Bytes ``local`` stores for the box: the chunks it overlaps (chunked HDF5) or its elements."""
    import h5py

    lows = {**{d: a for d, (a, _) in box.items()}, "time": concat_range[0]}
    highs = {**{d: b for d, (_, b) in box.items()}, "time": concat_range[1]}
    total = 0
    if not h5py.is_hdf5(local):
        import xarray as xr

        with xr.open_dataset(local) as ds:
            for v in variables:
                itemsize = ds[v.name].encoding["dtype"].itemsize
                total += itemsize * math.prod(highs[d] - lows[d] for d in v.dims)
        return total
    with h5py.File(local) as f:
        for v in variables:
            dataset = f[v.name]
            low = np.array([lows[d] for d in v.dims])
            high = np.array([highs[d] for d in v.dims])
            if dataset.chunks is None:
                total += dataset.dtype.itemsize * int(np.prod(high - low))
                continue
            for i in range(dataset.id.get_num_chunks()):
                info = dataset.id.get_chunk_info(i)
                start = np.array(info.chunk_offset)
                if np.all(start < high) and np.all(start + np.array(dataset.chunks) > low):
                    total += info.size
    return total


def measure_remote_reads(workdir: Path, quick: bool, budget: float) -> list[str]:
    import fsspec

    import planning.formats.remote_files as remote_files
    from planning.config import parse_config
    from planning.plan import make_plan
    from planning.specs import cut_spec
    from transforms.cut import read_unit

    bucket = "xtf-bench"
    with tempfile.TemporaryDirectory(dir=workdir) as tmp, storage_emulator(bucket):
        formats = _write_formats(Path(tmp), quick)
        gcs = fsspec.filesystem("gs", skip_instance_cache=True)
        lines = [f"gs:// reads (storage emulator), unit budget {budget / 1e6:g} MB (a step is several units):"]
        header = f"  {'format':<28}{'HDF5 block':>11}{'units':>7}{'read / stored':>15}{'requests/unit':>15}"
        lines.append(header + f"{'round trips/unit':>18}{'whole-file copies (before)':>28}")
        default = remote_files.HDF5_BLOCK_BYTES
        for label, paths in formats.items():
            folder = f"{bucket}/{paths[0].parent.name}"
            for path in paths:
                gcs.put(str(path), f"{folder}/{path.name}")
            config = parse_config(
                {"input": {"paths": f"gs://{folder}/*.nc"}, "sample": ERA5_SAMPLE, "output": {"path": "unused"}}
            )
            plan = make_plan(config, unit_budget_bytes=budget)
            spec = cut_spec(plan)
            stored = copies = 0
            for unit in plan.units:
                box = plan.grid.source_box(unit)
                for source, local in zip(plan.sources, paths):
                    begin, end = max(box["time"][0], source.start), min(box["time"][1], source.stop)
                    if begin < end:
                        stored += _stored_bytes(local, plan.variables, box, (begin - source.start, end - source.start))
                        copies += source.nbytes
            sizes = BLOCK_SIZES if label.startswith("NetCDF-4") and not quick else (default,)
            for block in sizes:
                remote_files.HDF5_BLOCK_BYTES = block
                try:
                    reads = [read_unit(spec, plan.sources, unit) for unit in plan.units]
                finally:
                    remote_files.HDF5_BLOCK_BYTES = default
                fetched = sum(r.bytes_read for r in reads)
                requests = sum(r.requests for r in reads) / len(reads)
                round_trips = sum(r.round_trips for r in reads) / len(reads)
                shown = (
                    f"{block // 1024} KiB" + (" *" if block == default else "") if label.startswith("NetCDF-4") else "-"
                )
                lines.append(
                    f"  {label:<28}{shown:>11}{len(plan.units):>7}{fetched / stored:>14.3f}x{requests:>15.1f}"
                    f"{round_trips:>18.1f}{copies / stored:>27.2f}x"
                )
        lines.append("  (* the default block size; stored: the elements of each slab, or the chunks holding them)")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", default=str(Path(tempfile.gettempdir()) / "xtf-bench"), help="the cached file")
    parser.add_argument("--quick", action="store_true", help="tiny data: a smoke test, not a measurement")
    parser.add_argument("--budget", type=float, default=4e6, help="unit budget of the gs:// reads (bytes)")
    parser.add_argument("--only", choices=["memory", "remote"], help="run one of the two measurements")
    parser.add_argument("--cut-one", nargs=2, metavar=("PATH", "MODE"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.cut_one:
        path, mode = args.cut_one
        print(json.dumps(cut_one_unit(path, whole_step=mode == "whole-step")))
        return 0
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    if args.only in (None, "memory"):
        print("\n".join(measure_unit_memory(workdir, args.quick)), flush=True)
    if args.only in (None, "remote"):
        print("\n".join(measure_remote_reads(workdir, args.quick, args.budget)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
