"""Many small files against the same data in one file: build and planning time (``python -m benchmarks.scale``).

1. Builds (``python -m pipelines.build --quiet --overwrite``) and driver planning (``make_plan``
   alone) on archives of N small NetCDF-4 files (one step each) and on N netCDF-3 files, each
   against the same values in one file (concatenated along time); a rerun into the same output
   (the probe cache ``_inventory.json`` reused) as rows of their own.
2. How unit planning (``planning.plan._plan_units``) and the rest of ``make_plan`` after the
   inventory grow from 2,000 to 4,000 files.
3. Planning over gs:// files on the storage emulator: ms per file and bytes the driver read
   per file, against planning the same files locally; and the launcher's peak memory while it
   plans 300, 2,100 and 10,000 such files, as KB per file between sizes (the slope: what each
   more file costs, the interpreter and its imports aside).
4. Zarr reads at ARCO-ERA5's real chunking (benchmarks.zarr_reads): bytes fetched per stored
   byte of the chunks needed, all levels and 3 selected levels, and the builds' peak RSS; part
   ``nc4chunks``: the same of a NetCDF-4 copy of the store chunked alike.
5. The job graph's size, the dry run's wall and the launcher's peak RSS for one month, 100k, 1M,
   10M and 30M work units and 1940-2024 of an ARCO-ERA5-shaped store of metadata only (benchmarks.job_graph).
6. A Dask LocalCluster (2 single-threaded worker processes) against the local runner at ~200
   and ~2,000 units of the 12-file patches archive (benchmarks.dask_vs_local, smaller unit
   budgets; medians of --repeat alternating builds): wall ratio, Dask tasks a unit, shards
   byte-identical.

Every build and every planning run is its own fresh interpreter, so import costs count as they
do for a user; only ratios between runs of one invocation are meant to be compared. Archives
are generated once into the work directory and reused (a marker file says what each holds).
"""

from __future__ import annotations

import argparse
import dataclasses
import filecmp
import json
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import datasets, job_graph, zarr_reads
from benchmarks.measure import Measurement, run_measured
from benchmarks.outputs import warm_files
from benchmarks.tables import table
from benchmarks.targets import (
    MAX_PLAN_UNITS_SCALING,
    MAX_REMOTE_PLAN_BYTES_PER_FILE,
    MAX_REMOTE_PLAN_KIB_PER_FILE,
    MAX_REMOTE_PLAN_MS_PER_FILE,
    MAX_SMALL_FILES_BUILD_RATIO,
    SMALL_FILES_TARGET_COUNT,
    Target,
)
from benchmarks.targets import target_cells as _target_cells

REPO = Path(__file__).resolve().parents[1]
#: Every file: one 6-hourly step of the demo's five variables on 2 levels x 18 x 18 (~28 KB as NetCDF-4).
LEVELS, LAT, LON = 2, 18, 18
VARIABLES = ("t", "q")
SAMPLE = {"window": {"lat": {"size": 9, "stride": 9}, "lon": {"size": 9, "stride": 9}}, "keep": ["level"]}
SAMPLES_PER_STEP = (LAT // 9) * (LON // 9)
NUM_SHARDS = 2
FORMATS = {"nc4": "NetCDF-4", "nc3": "netCDF-3 (CDF-2)"}
DEFAULT_SIZES = (1_000, 5_000)
CLASSIC_FILES = 1_000
UNIT_SIZES = (2_000, 4_000)
REMOTE_FILES = 1_000
#: NetCDF-4 files planned on gs:// for the launcher's peak memory (more than one batch of probes from 2,100 on).
REMOTE_MEMORY_SIZES = (300, 2_100, 10_000)
#: Unit budgets (bytes) that cut the 12-file patches archive into ~200 and ~2,000 units, for the Dask rows.
DASK_FILES = 12
DASK_BUDGETS = (6.5e6, 0.6e6)
#: --quick: the tiniest archives that print every row, a smoke test (not a measurement).
QUICK = {
    "sizes": (4,),
    "classic": 4,
    "units": (2, 4),
    "remote": 4,
    "remote_memory": (2, 4),
    "graph_units": job_graph.QUICK_UNITS,
    "dask_budgets": (0.1e6,),
}
FULL = {
    "sizes": DEFAULT_SIZES,
    "classic": CLASSIC_FILES,
    "units": UNIT_SIZES,
    "remote": REMOTE_FILES,
    "remote_memory": REMOTE_MEMORY_SIZES,
    "graph_units": job_graph.DEFAULT_UNITS,
    "dask_budgets": DASK_BUDGETS,
}
PARTS = ("local", "units", "remote", "zarr", "nc4chunks", "graph", "dask")
#: Repeats of the unit planning call (the fastest is kept): one call takes well under a millisecond.
UNIT_REPEATS = 50
BUCKET = "xtf-scale"
_MARKER = "archive.json"
KIB = 1024
MIB = 1024 * KIB


# -- archives ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Archive:
    """N files of one step each and one file holding the same steps."""

    fmt: str
    files: int
    directory: Path

    @property
    def many(self) -> Path:
        return self.directory / "files"

    @property
    def one(self) -> Path:
        return self.directory / "one"

    @property
    def label(self) -> str:
        return f"{self.files:,} {FORMATS[self.fmt]} files"

    def paths(self, which: str) -> list[Path]:
        return sorted((self.many if which == "many" else self.one).glob("*.nc"))

    def nbytes(self, which: str) -> int:
        return sum(p.stat().st_size for p in self.paths(which))


def ensure_archive(workdir: Path, fmt: str, files: int) -> Archive:
    """The archive under ``workdir/data``, generated unless an identical one is cached there."""
    from pipelines.demo import ArchiveShape

    shape = ArchiveShape(num_files=1, steps_per_file=files, levels=LEVELS, lat=LAT, lon=LON)
    archive = Archive(fmt, files, workdir / "data" / f"scale-{fmt}-{files}f")
    wanted = {"shape": dataclasses.asdict(shape), "format": fmt, "seed": 0}
    marker = archive.directory / _MARKER
    if marker.exists() and json.loads(marker.read_text()) == wanted:
        return archive
    needed = files * 60e3
    if shutil.disk_usage(workdir).free < 2 * needed:
        sys.exit(f"{workdir}: too little free disk for {files:,} files (~{needed / 1e6:,.0f} MB); use --workdir")
    print(f"[scale] generating {archive.label} and the same data in one file ...", flush=True)
    started = time.perf_counter()
    shutil.rmtree(archive.directory, ignore_errors=True)
    _write_split(archive, shape)
    # Written last: a generation that was interrupted is regenerated, never reused.
    marker.write_text(json.dumps(wanted))
    print(f"[scale]   {time.perf_counter() - started:.0f} s", flush=True)
    return archive


def _write_split(archive: Archive, shape) -> None:
    """One file of every step (the demo's generator), then each step as a file of its own."""
    import pandas as pd
    import xarray as xr

    from pipelines.demo import write_archive

    staging = archive.directory / "staging"
    [written] = write_archive(staging, shape)
    dataset = xr.load_dataset(written)
    encoding = {"time": {key: dataset.time.encoding[key] for key in ("units", "dtype", "calendar")}}
    options = {"format": "NETCDF3_64BIT", "unlimited_dims": ["time"]} if archive.fmt == "nc3" else {}
    archive.one.mkdir(parents=True)
    dataset.to_netcdf(archive.one / written.name, encoding=encoding, **options)
    archive.many.mkdir()
    for index in range(archive.files):
        step = dataset.isel(time=slice(index, index + 1))
        name = f"era5_{pd.Timestamp(step.time.values[0]):%Y%m%dT%H}.nc"
        step.to_netcdf(archive.many / name, encoding=encoding, **options)
    shutil.rmtree(staging)


def write_config(workdir: Path, name: str, paths: str, output: Path | str) -> Path:
    import yaml

    config = {
        "input": {"paths": paths, "concat_dim": "time"},
        "variables": list(VARIABLES),
        "sample": SAMPLE,
        "shuffle": {"seed": 0},
        "output": {"path": str(output), "num_shards": NUM_SHARDS},
    }
    path = workdir / "configs" / f"scale-{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


# -- one planning run (in its own process) ----------------------------------------------------


def _count_received_bytes() -> list[int]:
    """Count every byte this process receives on a socket (the driver's side of its HTTP requests)."""
    import socket

    counter = [0]
    recv, recv_into = socket.socket.recv, socket.socket.recv_into

    def counted_recv(self, *args, **kwargs):
        data = recv(self, *args, **kwargs)
        counter[0] += len(data)
        return data

    def counted_recv_into(self, *args, **kwargs):
        received = recv_into(self, *args, **kwargs)
        counter[0] += received
        return received

    socket.socket.recv, socket.socket.recv_into = counted_recv, counted_recv_into
    return counter


def plan_child(config_path: str, cache: str | None, result_path: str) -> None:
    """Time ``make_plan`` (and its inventory and unit planning) in this fresh process; write the figures."""
    received = _count_received_bytes()
    started = time.perf_counter()
    import planning.plan as plan_module
    from planning.config import load_config
    from planning.inputs.probe_cache import load_probes
    from transforms.compat import patches, xarray_dask

    # As a build does before it plans: xarray's checks for dask arrays would import dask (~1 s).
    patches.put_in(xarray_dask.DEFER_DASK)
    imported = time.perf_counter()
    phases = {"inventory": 0.0, "plan_units": 0.0}
    calls: list[tuple] = []
    take_inventory, plan_units = plan_module.take_inventory, plan_module._plan_units

    def timed_inventory(*args, **kwargs):
        begin = time.perf_counter()
        try:
            return take_inventory(*args, **kwargs)
        finally:
            phases["inventory"] += time.perf_counter() - begin

    def timed_plan_units(*args, **kwargs):
        calls.append((args, kwargs))
        begin = time.perf_counter()
        try:
            return plan_units(*args, **kwargs)
        finally:
            phases["plan_units"] += time.perf_counter() - begin

    plan_module.take_inventory, plan_module._plan_units = timed_inventory, timed_plan_units
    config = load_config(config_path)
    begin = time.perf_counter()
    cached = load_probes(cache, config.input.concat_dim) if cache else None
    plan = plan_module.make_plan(config, cached_probes=cached)
    seconds = time.perf_counter() - begin
    # One call is well under a millisecond: the fastest of many says how it grows with the files.
    fastest = phases["plan_units"]
    for _ in range(UNIT_REPEATS):
        begin = time.perf_counter()
        plan_units(*calls[0][0], **calls[0][1])
        fastest = min(fastest, time.perf_counter() - begin)
    probed = [probe.bytes_read for _, probe in plan.probes if probe.bytes_read is not None]
    result = {
        # the process's peak resident memory (Linux: KiB), imports included: the launcher's while it plans
        "max_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * KIB,
        "import_seconds": imported - started,
        "plan_seconds": seconds,
        "inventory_seconds": phases["inventory"],
        "plan_units_seconds": phases["plan_units"],
        "plan_units_fastest": fastest,
        "after_inventory_seconds": seconds - phases["inventory"],
        "files": len(plan.sources),
        "cached_probes": len(cached or {}),
        "units": len(plan.units),
        "samples": plan.num_samples,
        "probes": len(plan.probes),
        "probe_bytes": sum(probed),
        "probes_with_bytes": len(probed),
        "socket_bytes": received[0],
    }
    Path(result_path).write_text(json.dumps(result))


# -- the orchestrator -------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Bench:
    workdir: Path
    repeat: int
    timeout: float

    @property
    def env(self) -> dict[str, str]:
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
        return env

    def measure(self, command: list[str], warm: list[Path] = ()) -> Measurement:
        """The fastest of ``repeat`` runs (a failed run is returned at once)."""
        best = None
        for _ in range(self.repeat):
            warm_files(list(warm))
            measurement = run_measured([sys.executable, *command], str(REPO), self.env, self.timeout)
            if not measurement.ok:
                print(measurement.output_tail, file=sys.stderr)
                return measurement
            if best is None or measurement.wall_seconds < best.wall_seconds:
                best = measurement
        return best

    def build(self, config: Path, warm: list[Path]) -> dict:
        command = ["-m", "pipelines.build", "--config", str(config), "--quiet", "--overwrite"]
        measurement = self.measure(command, warm)
        return _row(measurement, wall=measurement.wall_seconds, peak_rss=measurement.peak_rss_bytes)

    def plan(self, config: Path, warm: list[Path], cache: Path | str | None = None) -> dict:
        """make_plan alone, in a fresh process: the fastest of ``repeat`` runs by planning time."""
        result = self.workdir / "results" / "scale-plan.json"
        command = ["-m", "benchmarks.scale", "--child-plan", str(config), "--result", str(result)]
        command += ["--cache", str(cache)] if cache else []
        best = None
        for _ in range(self.repeat):
            result.unlink(missing_ok=True)
            warm_files(list(warm))
            measurement = run_measured([sys.executable, *command], str(REPO), self.env, self.timeout)
            if not measurement.ok or not result.exists():
                print(measurement.output_tail, file=sys.stderr)
                return _row(measurement)
            row = _row(measurement, process_wall=measurement.wall_seconds, **json.loads(result.read_text()))
            if best is None or row["plan_seconds"] < best["plan_seconds"]:
                best = row
        return best


def _row(measurement: Measurement, **values) -> dict:
    row = {"ok": measurement.ok, "load": measurement.load_before, **values}
    if not measurement.ok:
        row["error"] = measurement.output_tail
    return row


def same_shards(left: Path, right: Path) -> bool | None:
    names = sorted(p.name for p in left.glob("*.tfrecord"))
    if not names or names != sorted(p.name for p in right.glob("*.tfrecord")):
        return None if not names else False
    return all(filecmp.cmp(left / n, right / n, shallow=False) for n in names)


def run_local(bench: Bench, archive: Archive) -> dict:
    """Build twice (cold, then a rerun reusing the probe cache) and plan twice, N files and one file each."""
    section = {"fmt": archive.fmt, "files": archive.files, "samples": archive.files * SAMPLES_PER_STEP}
    outputs = {}
    for which in ("many", "one"):
        output = bench.workdir / "out" / "scale" / f"{archive.directory.name}-{which}"
        shutil.rmtree(output, ignore_errors=True)
        folder = archive.many if which == "many" else archive.one
        config = write_config(bench.workdir, f"{archive.directory.name}-{which}", str(folder / "*.nc"), output)
        warm = archive.paths(which)
        name = archive.label if which == "many" else f"the same data in 1 {FORMATS[archive.fmt]} file"
        print(f"[scale] {name}: build, rerun, planning, planning a rerun ...", flush=True)
        rows = {
            "input_bytes": archive.nbytes(which),
            "build": bench.build(config, warm),
            "rebuild": bench.build(config, warm),
            "plan": bench.plan(config, warm),
            "replan": bench.plan(config, warm, cache=output / "_inventory.json"),
        }
        section[which] = rows
        outputs[which] = output
        print(
            f"[scale]   build {_seconds(rows['build'], 'wall')}, rerun {_seconds(rows['rebuild'], 'wall')}, "
            f"planning {_seconds(rows['plan'], 'plan_seconds')}, rerun {_seconds(rows['replan'], 'plan_seconds')}",
            flush=True,
        )
    section["identical_shards"] = same_shards(outputs["many"], outputs["one"])
    for output in outputs.values():
        shutil.rmtree(output, ignore_errors=True)
    return section


def run_units(bench: Bench, archives: list[Archive]) -> dict:
    rows = {}
    for archive in archives:
        print(f"[scale] unit planning on {archive.label} ...", flush=True)
        config = write_config(bench.workdir, f"units-{archive.files}", str(archive.many / "*.nc"), "unused")
        rows[str(archive.files)] = bench.plan(config, archive.paths("many"))
    return rows


def upload(gcs, archive: Archive, folder: str) -> tuple[float, int]:
    """The archive's files put into ``folder`` on gs://: (seconds, objects whose size differs from their file)."""
    paths = archive.paths("many")
    print(f"[scale] uploading {archive.label} to the storage emulator ...", flush=True)
    started = time.perf_counter()
    gcs.put([str(p) for p in paths], [f"{folder}/{p.name}" for p in paths])
    seconds = time.perf_counter() - started
    stored = {Path(info["name"]).name: int(info["size"]) for info in gcs.ls(folder, detail=True)}
    return seconds, sum(stored.get(p.name) != p.stat().st_size for p in paths)


def run_remote(bench: Bench, gcs, archives: list[Archive], local_plans: dict[str, dict]) -> dict:
    """Plan over each archive's files on gs:// (the storage emulator), uploaded once per run."""
    section = {}
    for archive in archives:
        folder = f"{BUCKET}/{archive.directory.name}"
        seconds, mismatched = upload(gcs, archive, folder)
        config = write_config(bench.workdir, f"remote-{archive.directory.name}", f"gs://{folder}/*.nc", "unused")
        print(f"[scale] planning {archive.label} on gs:// ...", flush=True)
        row = bench.plan(config, [])
        row.update(
            upload_seconds=seconds,
            size_mismatches=mismatched,
            file_bytes=archive.nbytes("many") / archive.files,
            local=local_plans.get(archive.fmt),
        )
        section[archive.fmt] = row
        gcs.rm(folder, recursive=True)
    return section


def run_remote_memory(bench: Bench, gcs, archives: list[Archive]) -> dict:
    """The launcher's peak RSS while it plans each archive's files on gs:// (the storage emulator)."""
    rows = {}
    for archive in archives:
        folder = f"{BUCKET}/memory-{archive.directory.name}"
        seconds, mismatched = upload(gcs, archive, folder)
        config = write_config(bench.workdir, f"memory-{archive.directory.name}", f"gs://{folder}/*.nc", "unused")
        print(f"[scale] planning {archive.label} on gs:// (peak memory) ...", flush=True)
        rows[str(archive.files)] = {**bench.plan(config, []), "upload_seconds": seconds, "size_mismatches": mismatched}
        gcs.rm(folder, recursive=True)
    return rows


def memory_slopes(rows: dict) -> list[tuple[int, int, float | None]]:
    """(smaller, larger, KiB of peak RSS per file between them) for each pair of consecutive sizes."""
    sizes = sorted(map(int, rows))
    slopes = []
    for small, large in zip(sizes, sizes[1:]):
        low, high = _value(rows[str(small)], "max_rss"), _value(rows[str(large)], "max_rss")
        slope = None if low is None or high is None else (high - low) / (large - small) / KIB
        slopes.append((small, large, slope))
    return slopes


def run(
    workdir: Path,
    quick: bool = False,
    sizes: tuple[int, ...] | None = None,
    classic: int | None = None,
    remote: int | None = None,
    parts: tuple[str, ...] | None = None,
    repeat: int = 1,
    timeout: float = 3600,
    remote_memory: tuple[int, ...] | None = None,
) -> dict:
    """Every measurement this benchmark makes, as one JSON-ready dict (None: the default, or --quick's)."""
    defaults = QUICK if quick else FULL
    sizes = tuple(sizes or defaults["sizes"])
    classic = defaults["classic"] if classic is None else classic
    remote = defaults["remote"] if remote is None else remote
    remote_memory = defaults["remote_memory"] if remote_memory is None else tuple(remote_memory)
    unit_sizes = defaults["units"]
    parts = tuple(parts or PARTS)
    workdir = Path(workdir).resolve()
    (workdir / "results").mkdir(parents=True, exist_ok=True)
    bench = Bench(workdir, max(1, repeat), timeout)
    results: dict = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "cpus": os.cpu_count(),
        "load_at_start": os.getloadavg(),
        "quick": quick,
        "target_files": max(sizes) if quick else SMALL_FILES_TARGET_COUNT,
        "local": {},
    }
    if "local" in parts:
        cases = [("nc4", n) for n in sizes] + ([("nc3", classic)] if classic else [])
        for fmt, files in cases:
            results["local"][f"{fmt}-{files}"] = run_local(bench, ensure_archive(workdir, fmt, files))
    if "units" in parts:
        results["units"] = run_units(bench, [ensure_archive(workdir, "nc4", n) for n in unit_sizes])
    if "remote" in parts and (remote or remote_memory):
        archives = [ensure_archive(workdir, fmt, remote) for fmt in ("nc4", "nc3")] if remote else []
        local_plans = {}
        for archive in archives:
            known = results["local"].get(f"{archive.fmt}-{remote}")
            if known is None:  # the same files planned locally, if the local part did not already
                config = write_config(workdir, f"local-{archive.directory.name}", str(archive.many / "*.nc"), "unused")
                known = {"many": {"plan": bench.plan(config, archive.paths("many"))}}
            local_plans[archive.fmt] = known["many"]["plan"]
        memory_archives = [ensure_archive(workdir, "nc4", n) for n in remote_memory]
        import fsspec

        from benchmarks.unit_memory import storage_emulator

        with storage_emulator(BUCKET):  # one emulator for both: an emulator starts in a few seconds
            gcs = fsspec.filesystem("gs", skip_instance_cache=True)
            if archives:
                results["remote"] = run_remote(bench, gcs, archives, local_plans)
            if memory_archives:
                results["remote_memory"] = run_remote_memory(bench, gcs, memory_archives)
    if "zarr" in parts:
        results["zarr"] = zarr_reads.run_zarr(workdir, REPO, bench.env, quick, timeout)
    if "nc4chunks" in parts:  # the same store copied into a NetCDF-4 file chunked alike
        results["nc4chunks"] = zarr_reads.run_zarr(workdir, REPO, bench.env, quick, timeout, netcdf=True)
    if "graph" in parts:
        (workdir / "job-graph").mkdir(exist_ok=True)
        results["job_graph"] = []
        for units in defaults["graph_units"]:
            print(f"[scale] dry run of ~{units:,} units (job graph, launcher memory) ...", flush=True)
            results["job_graph"].append(job_graph.dry_run(workdir / "job-graph", units))
    if "dask" in parts:
        from benchmarks import dask_vs_local  # on demand: it imports dask

        spec = datasets.patches(1, quick, num_files=None if quick else DASK_FILES)
        print("[scale] Dask LocalCluster against the local runner ...", flush=True)
        rounds = max(1, repeat)
        budgets = defaults["dask_budgets"]
        results["dask"] = dask_vs_local.compare(workdir, spec, budgets, rounds=rounds, warm=not quick, timeout=timeout)
    results["targets"] = [t.to_json() for t in targets(results)]
    results["failed"] = failed(results)
    shutil.rmtree(workdir / "out" / "scale", ignore_errors=True)
    return results


# -- the report -------------------------------------------------------------------------------


def _seconds(row: dict | None, key: str) -> str:
    if not row or not row.get("ok"):
        return "FAILED"
    return f"{row[key]:.2f} s"


def _value(row: dict | None, key: str) -> float | None:
    return row[key] if row and row.get("ok") and row.get(key) is not None else None


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    return None if numerator is None or not denominator else numerator / denominator


def targets(results: dict) -> list[Target]:
    found = []
    for section in results["local"].values():
        if section["fmt"] == "nc4" and section["files"] == results["target_files"]:
            ratio = _ratio(_value(section["many"]["build"], "wall"), _value(section["one"]["build"], "wall"))
            found.append(
                Target(
                    f"build {section['files']:,} small files / same data in 1 file",
                    ratio,
                    MAX_SMALL_FILES_BUILD_RATIO,
                    True,
                )
            )
    units = results.get("units")
    if units and len(units) == 2:
        small, large = (units[k] for k in sorted(units, key=int))
        found.append(
            Target(
                f"_plan_units {max(map(int, units)):,} / {min(map(int, units)):,} files",
                _ratio(_value(large, "plan_units_fastest"), _value(small, "plan_units_fastest")),
                MAX_PLAN_UNITS_SCALING,
                True,
            )
        )
    nc4 = (results.get("remote") or {}).get("nc4")
    if nc4:
        files = nc4.get("files") or None
        per_file = _ratio(_value(nc4, "plan_seconds"), files)
        found.append(
            Target(
                "gs:// planning per NetCDF-4 file",
                None if per_file is None else per_file * 1e3,
                MAX_REMOTE_PLAN_MS_PER_FILE,
                True,
                "ms",
            )
        )
        per_file_bytes = _ratio(_value(nc4, "socket_bytes"), files)
        found.append(
            Target(
                "gs:// bytes the driver received per NetCDF-4 file",
                None if per_file_bytes is None else per_file_bytes / KIB,
                MAX_REMOTE_PLAN_BYTES_PER_FILE / KIB,
                True,
                "KiB",
            )
        )
    found += zarr_reads.targets(results.get("zarr") or {})
    found += zarr_reads.targets(results.get("nc4chunks") or {})
    found += job_graph.targets(results.get("job_graph") or [])
    if results.get("dask"):
        from benchmarks import dask_vs_local

        found += dask_vs_local.targets(results["dask"])
    slopes = memory_slopes(results.get("remote_memory") or {})
    if slopes:
        small, large, _ = slopes[-1]
        found.append(
            Target(
                f"gs:// planning: launcher peak RSS per file, {small:,} to {large:,} files",
                slopes[-1][2],
                MAX_REMOTE_PLAN_KIB_PER_FILE,
                True,
                "KiB",
            )
        )
    return found


def failed(results: dict) -> list[str]:
    names = []
    for key, section in results["local"].items():
        for which in ("many", "one"):
            names += [
                f"{key} {which} {run}"
                for run in ("build", "rebuild", "plan", "replan")
                if not section[which][run]["ok"]
            ]
    names += [f"units {k}" for k, row in (results.get("units") or {}).items() if not row["ok"]]
    names += [f"remote {k}" for k, row in (results.get("remote") or {}).items() if not row["ok"]]
    names += [f"zarr {k}" for k, row in (results.get("zarr") or {}).items() if not row["ok"]]
    names += [f"nc4chunks {k}" for k, row in (results.get("nc4chunks") or {}).items() if not row["ok"]]
    names += [f"remote memory {k}" for k, row in (results.get("remote_memory") or {}).items() if not row["ok"]]
    names += [f"dry run of {row['steps']:,} steps" for row in results.get("job_graph") or [] if not row["ok"]]
    dask = results.get("dask") or []
    names += [f"dask {row['units']:,} units" for row in dask if not (row["ok"] and row["identical_shards"])]
    return names


def render(results: dict, *, for_docs: bool = False) -> str:
    """The section as printed; ``for_docs``: its title without the run's date and load."""
    by_name = {t.name: t for t in targets(results)}
    rows = []
    for section in results["local"].values():
        many, one = section["many"], section["one"]
        what = f"{section['files']:,} {FORMATS[section['fmt']]} files / same data in 1 file"
        build_target = by_name.get(f"build {section['files']:,} small files / same data in 1 file")
        for label, run, key, target in (
            ("build", "build", "wall", build_target),
            ("build, rerun", "rebuild", "wall", None),
            ("planning (make_plan)", "plan", "plan_seconds", None),
            ("planning a rerun (probe cache)", "replan", "plan_seconds", None),
        ):
            left, right = _value(many[run], key), _value(one[run], key)
            rows.append(
                [
                    f"{label}: {what}",
                    "FAILED" if left is None else f"{left:.2f}",
                    "FAILED" if right is None else f"{right:.2f}",
                    _fmt_ratio(_ratio(left, right)),
                    *_target_cells(target),
                ]
            )
    units = results.get("units") or {}
    if len(units) == 2:
        small_key, large_key = sorted(units, key=int)
        small, large = units[small_key], units[large_key]
        name = f"_plan_units {int(large_key):,} / {int(small_key):,} files"
        for label, key, target in (
            (f"{name} (ms, fastest of {UNIT_REPEATS + 1})", "plan_units_fastest", by_name.get(name)),
            (
                f"make_plan after the inventory, {int(large_key):,} / {int(small_key):,} files (ms)",
                "after_inventory_seconds",
                None,
            ),
            (f"make_plan, {int(large_key):,} / {int(small_key):,} files (ms)", "plan_seconds", None),
        ):
            left, right = _value(large, key), _value(small, key)
            rows.append(
                [
                    label,
                    "FAILED" if left is None else f"{left * 1e3:.2f}",
                    "FAILED" if right is None else f"{right * 1e3:.2f}",
                    _fmt_ratio(_ratio(left, right)),
                    *_target_cells(target),
                ]
            )
    for fmt, row in (results.get("remote") or {}).items():
        rows += _remote_rows(fmt, row, by_name if fmt == "nc4" else {})
    rows += zarr_reads.report_rows(results.get("zarr") or {}, by_name)
    rows += zarr_reads.report_rows(results.get("nc4chunks") or {}, by_name)
    rows += _memory_rows(results.get("remote_memory") or {}, by_name)
    rows += job_graph.report_rows(results.get("job_graph") or [], by_name)
    if results.get("dask"):
        from benchmarks import dask_vs_local

        rows += dask_vs_local.report_rows(results["dask"], by_name)
    headers = ("what", "wall s", "against s", "ratio", "target", "result")
    quick = " QUICK (tiny data: a smoke test, not a measurement)" if results["quick"] else ""
    load = ", ".join(f"{x:.2f}" for x in results["load_at_start"])
    when = f"{results['cpus']} CPUs" if for_docs else f"{results['started']}, {results['cpus']} CPUs, load {load}"
    lines = [
        f"== many small files vs one file{quick} -- {when} ==",
        table(headers, rows),
        f"  files: one step each, {len(VARIABLES)} of 5 variables cut into 9x9 patches with every level "
        f"({LEVELS} x {LAT} x {LON}: {SAMPLES_PER_STEP} samples a step); 'against': the same data in one file, "
        "or the smaller archive, or the same files planned locally",
        "  build: process wall of python -m pipelines.build; planning: make_plan alone in a fresh process "
        "(the rerun's includes loading _inventory.json)",
    ]
    for section in results["local"].values():
        same = section.get("identical_shards")
        if same is not None:
            words = "byte-identical" if same else "DIFFERENT"
            lines.append(f"  {section['files']:,} {FORMATS[section['fmt']]} files: shards {words} to the one file's")
    for section in results["local"].values():
        many, one = section["many"], section["one"]
        plan = many["plan"]
        if not (plan.get("ok") and many["build"]["ok"] and one["build"]["ok"] and one["plan"]["ok"]):
            continue
        rest = many["build"]["wall"] - plan["plan_seconds"], one["build"]["wall"] - one["plan"]["plan_seconds"]
        per_file = plan["plan_seconds"] / section["files"] * 1e3
        lines.append(
            f"  {section['files']:,} {FORMATS[section['fmt']]} files: planning {per_file:.2f} ms a file "
            f"(the inventory {plan['inventory_seconds']:.2f} s of {plan['plan_seconds']:.2f} s), "
            f"{plan['units']} unit(s); build less planning {rest[0]:.2f} s (1 file: {rest[1]:.2f} s)"
        )
    for fmt, row in (results.get("remote") or {}).items():
        if row.get("size_mismatches"):
            lines.append(f"  gs:// {FORMATS[fmt]}: {row['size_mismatches']} object(s) differ in size from the file")
    for files, row in (results.get("remote_memory") or {}).items():
        if row.get("size_mismatches"):
            lines.append(f"  gs:// {int(files):,} files: {row['size_mismatches']} object(s) of another size")
    remote_rows = [row for key in ("remote", "remote_memory") for row in (results.get(key) or {}).values()]
    uploads = [row["upload_seconds"] for row in remote_rows if "upload_seconds" in row]
    if uploads:
        lines.append(f"  uploads to the storage emulator: {sum(uploads):.0f} s (not measured)")
    if results.get("failed"):
        lines.append("FAILED: " + ", ".join(results["failed"]))
    return "\n".join(lines)


def _remote_rows(fmt: str, row: dict, by_name: dict) -> list[list[str]]:
    name = FORMATS[fmt]
    local = row.get("local")
    files = row.get("files") or 0
    if not row.get("ok") or not files:
        return [[f"planning {name} files on gs://", "FAILED", "-", "-", "-", ""]]
    remote_s, local_s = row["plan_seconds"], _value(local, "plan_seconds")
    rows = [
        [
            f"planning {files:,} {name} files: gs:// / local",
            f"{remote_s:.2f}",
            "FAILED" if local_s is None else f"{local_s:.2f}",
            _fmt_ratio(_ratio(remote_s, local_s)),
            "-",
            "",
        ],
        [
            "  per file on gs:// (ms) / locally",
            f"{remote_s / files * 1e3:.2f}",
            "-" if local_s is None else f"{local_s / files * 1e3:.2f}",
            _fmt_ratio(_ratio(remote_s, local_s)),
            *_target_cells(by_name.get("gs:// planning per NetCDF-4 file")),
        ],
        [
            "  KiB the driver received per file / file size",
            f"{row['socket_bytes'] / files / KIB:.1f}",
            f"{row['file_bytes'] / KIB:.1f}",
            _fmt_ratio(row["socket_bytes"] / files / row["file_bytes"]),
            *_target_cells(by_name.get("gs:// bytes the driver received per NetCDF-4 file")),
        ],
    ]
    if row.get("probes_with_bytes"):
        rows.append(
            [
                f"  KiB probes fetched per file ({row['probes_with_bytes']:,} probed) / file size",
                f"{row['probe_bytes'] / row['probes_with_bytes'] / KIB:.1f}",
                f"{row['file_bytes'] / KIB:.1f}",
                _fmt_ratio(row["probe_bytes"] / row["probes_with_bytes"] / row["file_bytes"]),
                "-",
                "",
            ]
        )
    return rows


def _memory_rows(rows: dict, by_name: dict) -> list[list[str]]:
    """Peak RSS planning N files on gs://, and its growth per file between sizes (KiB a file)."""
    found = []
    for files in sorted(rows, key=int):
        rss = _value(rows[files], "max_rss")
        found.append(
            [
                f"launcher peak RSS planning {int(files):,} NetCDF-4 files on gs:// (MiB)",
                "FAILED" if rss is None else f"{rss / MIB:.1f}",
                "-",
                "-",
                "-",
                "",
            ]
        )
    for small, large, slope in memory_slopes(rows):
        name = f"gs:// planning: launcher peak RSS per file, {small:,} to {large:,} files"
        found.append(
            [
                f"  KiB per file between {small:,} and {large:,} files",
                "FAILED" if slope is None else f"{slope:.2f}",
                "-",
                "-",
                *_target_cells(by_name.get(name)),
            ]
        )
    return found


def _fmt_ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.scale", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--sizes",
        type=int,
        nargs="+",
        help=f"NetCDF-4 archive sizes in files (default: {' '.join(map(str, DEFAULT_SIZES))}; e.g. 1000 5000 20000)",
    )
    parser.add_argument("--classic", type=int, help=f"files of the netCDF-3 archive (default {CLASSIC_FILES}; 0: none)")
    parser.add_argument("--remote", type=int, help=f"files planned on gs:// (default {REMOTE_FILES}; 0: none)")
    parser.add_argument(
        "--remote-memory",
        type=int,
        nargs="+",
        help=f"files planned on gs:// for peak memory (default {' '.join(map(str, REMOTE_MEMORY_SIZES))}; 0: none)",
    )
    parser.add_argument("--parts", nargs="+", choices=list(PARTS), help="run only these parts")
    parser.add_argument("--quick", action="store_true", help="tiny archives: a smoke test, not a measurement")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each case; the fastest is kept")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds before a run is stopped")
    parser.add_argument(
        "--workdir", default=str(Path(tempfile.gettempdir()) / "xtf-bench"), help="archives (kept) and outputs"
    )
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--child-plan", help=argparse.SUPPRESS)
    parser.add_argument("--cache", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child_plan:
        plan_child(args.child_plan, args.cache, args.result)
        return 0
    memory_sizes = None if args.remote_memory is None else tuple(n for n in args.remote_memory if n)
    results = run(
        Path(args.workdir),
        args.quick,
        args.sizes,
        args.classic,
        args.remote,
        args.parts,
        args.repeat,
        args.timeout,
        memory_sizes,
    )
    print()
    print(render(results))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2, default=str))
    return 1 if results["failed"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
