"""The job graph's size and the launcher's peak RSS against the plan's work units (``python -m benchmarks.job_graph``).

Each row is a dry run (``python -m pipelines.build --dry_run=True``, its own process) on an
ARCO-ERA5-shaped Zarr store of metadata and coordinates only (full resolution, 37 levels,
hourly from 1940; no chunk written, none read; chunked 128 x 128): 5 variables, 32x32 patches, 72 units a step.
The graph must stay the same few KB from one month (53,568 units) to 1940-2024 (53.6M units; Dataflow refuses
graphs over 10 MB).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import xarray as xr
import yaml
import zarr

from benchmarks.measure import run_measured
from benchmarks.targets import (
    GB,
    MAX_DRY_RUN_RSS,
    MAX_DRY_RUN_SECONDS,
    MAX_JOB_GRAPH_GROWTH,
    MAX_JOB_GRAPH_MB,
    Target,
    target_cells,
)

REPO = Path(__file__).resolve().parents[1]
#: ARCO-ERA5's pressure levels (hPa).
LEVELS = (1, 2, 3, 5, 7, 10, 20, 30, 50, 70, 100, 125, 150, 175, 200, 225, 250, 300, 350, 400, 450, 500, 550, 600,
          650, 700, 750, 775, 800, 825, 850, 875, 900, 925, 950, 975, 1000)  # fmt: skip
VARIABLES = ("temperature", "geopotential", "u_component_of_wind", "v_component_of_wind", "specific_humidity")
#: Spatial chunks of the stores' variables: units follow a store's chunks (one a chunk here, as every 128 x 128
#: x 37-level chunk of the five variables fits the unit budget), so each step makes 6 x 12 units. (With ARCO's
#: own whole-globe chunks a step is one unit, cut in pieces on its worker: 72 times fewer units.)
CHUNK = (128, 128)
UNITS_PER_STEP = 72
#: Hourly steps of one month (January) and of ARCO-ERA5's whole record, 1940-2024 (issue 20's targets compare
#: these two graphs and time the second's dry run).
MONTH_STEPS = 31 * 24
RECORD_STEPS = len(pd.date_range("1940-01-01", "2024-12-31T23:00", freq="h"))
DEFAULT_UNITS = (
    MONTH_STEPS * UNITS_PER_STEP,
    100_000,
    1_000_000,
    10_000_000,
    30_000_000,
    RECORD_STEPS * UNITS_PER_STEP,
)
#: benchmarks.scale --quick: two small stores, a smoke test of the rows (not a measurement).
QUICK_UNITS = (1_000, 10_000)


def write_metadata_store(path: Path, steps: int, lat: int = 721, lon: int = 1440, chunk=CHUNK) -> Path:
    """An ARCO-ERA5-shaped store of metadata and coordinates only: no chunk of a variable is written."""
    coords = xr.Dataset(
        coords={
            "time": ("time", pd.date_range("1940-01-01", periods=steps, freq="h").values),
            "level": ("level", np.array(LEVELS, dtype=np.int64)),
            "latitude": ("latitude", np.linspace(90, -90, lat, dtype=np.float32)),
            "longitude": ("longitude", np.linspace(0, 360, lon, endpoint=False, dtype=np.float32)),
        }
    )
    time = {"units": "hours since 1900-01-01", "dtype": "int64", "chunks": (steps,)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zarr: consolidated metadata is not in the v3 spec yet
        coords.to_zarr(path, mode="w", encoding={"time": time}, consolidated=False, zarr_format=3)
        group = zarr.open_group(path, mode="a")
        shape = (steps, len(LEVELS), lat, lon)
        dims = ("time", "level", "latitude", "longitude")
        for name in VARIABLES:
            chunks = (1, len(LEVELS), *chunk)
            group.create_array(
                name, shape=shape, chunks=chunks, dtype="float32", dimension_names=dims, fill_value=np.nan
            )
        zarr.consolidate_metadata(path)
    return path


def patches_config(store: Path, output: Path) -> dict:
    return {
        "input": {"paths": str(store)},
        "variables": list(VARIABLES),
        "sample": {"window": {"latitude": 32, "longitude": 32}, "keep": ["level"]},
        "output": {"path": str(output)},
    }


def dry_run(workdir: Path, units: int) -> dict:
    steps = math.ceil(units / UNITS_PER_STEP)
    store = workdir / f"metadata-{steps}.zarr"
    if not (store / "zarr.json").exists():
        write_metadata_store(store, steps)
    config = workdir / f"metadata-{steps}.yaml"
    config.write_text(yaml.safe_dump(patches_config(store, workdir / f"out-{steps}")))
    command = [sys.executable, "-m", "pipelines.build", "--config", str(config), "--dry_run=True"]
    measured = run_measured(command, cwd=str(REPO))
    graph = re.search(r"job graph: ([\d.,]+) MB", measured.output_tail)
    planned = re.search(r"([\d,]+) work unit\(s\)", measured.output_tail)
    return {
        "steps": steps,
        "units": int(planned.group(1).replace(",", "")) if planned else None,
        "graph_mb": float(graph.group(1).replace(",", "")) if graph else None,
        "seconds": measured.wall_seconds,
        "peak_rss_gb": measured.peak_rss_bytes / 1e9,
        "ok": measured.ok,
        "tail": None if measured.ok else measured.output_tail[-800:],
    }


def render(rows: list[dict]) -> str:
    lines = ["| work units | steps | job graph | dry run | launcher peak RSS |", "|---|---|---|---|---|"]
    for row in rows:
        units = f"{row['units']:,}" if row["units"] else "failed"
        graph = f"{row['graph_mb']:.2f} MB" if row["graph_mb"] is not None else "-"
        lines.append(f"| {units} | {row['steps']:,} | {graph} | {row['seconds']:.0f} s | {row['peak_rss_gb']:.2f} GB |")
    return "\n".join(lines)


def targets(rows: list[dict]) -> list[Target]:
    """Each graph <= 1 MB; the largest within 10% of the smallest; the largest dry run's wall and peak RSS."""
    done = [row for row in rows if row["ok"] and row["graph_mb"] is not None and row["units"]]
    found = [
        Target(f"job graph, {row['units']:,} units", row["graph_mb"], MAX_JOB_GRAPH_MB, True, "MB") for row in done
    ]
    if len(done) >= 2:
        small, large = min(done, key=lambda r: r["units"]), max(done, key=lambda r: r["units"])
        what = f"{large['units']:,} / {small['units']:,} units"
        found.append(Target(f"job graph {what}", large["graph_mb"] / small["graph_mb"], MAX_JOB_GRAPH_GROWTH, True))
    if done:
        large = max(done, key=lambda r: r["units"])
        what = f"{large['units']:,} units"
        found.append(Target(f"dry run wall, {what}", large["seconds"], MAX_DRY_RUN_SECONDS, True, "s"))
        rss = large["peak_rss_gb"]
        found.append(Target(f"launcher peak RSS, dry run of {what}", rss, MAX_DRY_RUN_RSS / GB, True, "GB"))
    return found


def report_rows(rows: list[dict], by_name: dict[str, Target]) -> list[list[str]]:
    """The rows of benchmarks.scale's table: (what, value, against, ratio, target, result)."""

    def cells(name: str) -> list[str]:
        return target_cells(by_name.get(name))

    out = []
    done = [row for row in rows if row["ok"] and row["graph_mb"] is not None and row["units"]]
    for row in rows:
        if row not in done:
            out.append([f"job graph, dry run of {row['steps']:,} steps", "FAILED", "-", "-", "-", ""])
            continue
        units = f"{row['units']:,} units"
        out.append([f"job graph (MB), {units}", f"{row['graph_mb']:.3f}", "-", "-", *cells(f"job graph, {units}")])
        rss, wall = f"launcher peak RSS, dry run of {units}", f"dry run wall, {units}"
        out.append(
            [f"  dry run of {units}: launcher peak RSS (GB)", f"{row['peak_rss_gb']:.2f}", "-", "-", *cells(rss)]
        )
        out.append([f"  dry run of {units}: wall (s)", f"{row['seconds']:.1f}", "-", "-", *cells(wall)])
    if len(done) >= 2:
        small, large = min(done, key=lambda r: r["units"]), max(done, key=lambda r: r["units"])
        name = f"job graph {large['units']:,} / {small['units']:,} units"
        ratio = large["graph_mb"] / small["graph_mb"]
        out.append([name, f"{large['graph_mb']:.3f}", f"{small['graph_mb']:.3f}", f"{ratio:.2f}", *cells(name)])
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.job_graph", description=__doc__.splitlines()[0])
    parser.add_argument("--units", type=int, nargs="+", default=list(DEFAULT_UNITS), help="about this many units")
    parser.add_argument("--workdir", default=str(Path(tempfile.gettempdir()) / "xtf-bench" / "job-graph"))
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    rows = [dry_run(workdir, units) for units in args.units]
    print(render(rows))
    for row in rows:
        if row["tail"]:
            print(row["tail"], file=sys.stderr)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0 if all(row["ok"] for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
