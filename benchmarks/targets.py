"""The project's performance targets, evaluated on a benchmark's results (PASS/FAIL beside each ratio)."""

from __future__ import annotations

import dataclasses
import statistics

GB = 1e9
#: pipeline wall / floor wall allowed at 1x and from 4x on
FLOOR_RATIO = {1: 1.3, 4: 1.0}
#: pipeline wall / the I/O limit's (read, write and sync the same bytes) allowed from 4x on
IO_LIMIT_RATIO = 1.25
#: the demo build's wall (python -m pipelines.build, its data already written), in seconds
MAX_DEMO_SECONDS = 1.5
MIN_SPEEDUP_OVER_NAIVE = 40.0
#: peak RSS at every scale: the default runner's (threads), and 2 worker processes' (each imports everything)
MAX_RSS_BYTES = {"pipeline": 0.5 * GB, "2-worker pipeline": 1.0 * GB}
MAX_RSS_GROWTH = 1.2  # peak RSS at 4x / at 1x
SCALING_SLACK = 1.1  # time at Nx <= 1.1 N x time at 1x, start-up subtracted
MIN_PARSER_VS_EXPERT = 0.95
MAX_HELP_SECONDS = 2.0
#: the streaming shard writer's peak RSS above the interpreter's, as a multiple of its budget
MAX_WRITER_RSS_OVER_BUDGET = 1.3
#: build of this many small files / the same data in one file (benchmarks.scale)
SMALL_FILES_TARGET_COUNT = 5_000
MAX_SMALL_FILES_BUILD_RATIO = 2.0
#: unit planning time at 4,000 files / at 2,000 (linear, with some slack)
MAX_PLAN_UNITS_SCALING = 2.2
#: planning over gs:// NetCDF-4 files: driver time and bytes received, per file
MAX_REMOTE_PLAN_MS_PER_FILE = 10.0
MAX_REMOTE_PLAN_BYTES_PER_FILE = 64 * 1024
#: Zarr at ARCO-ERA5's chunking: bytes fetched per stored byte of the chunks needed; a build's peak RSS on 2 steps.
MAX_ZARR_FETCHED_PER_STORED = 1.1
MAX_ZARR_BUILD_RSS = 1.5 * GB
#: the launcher's peak RSS planning gs:// NetCDF-4 files: KiB more per file (benchmarks.scale, 2,100 to 10,000 files)
MAX_REMOTE_PLAN_KIB_PER_FILE = 8.0
#: planning 2,100 gs:// NetCDF-4 files: wall with 1 core / with 2 (benchmarks.remote_planning: the probes' pool)
MIN_REMOTE_PLAN_PARALLEL = 1.6
#: the job graph (a dry run's pipeline proto) from one month to 1940-2024; its largest / its smallest; the largest run's
#: dry-run wall and launcher peak RSS (benchmarks.job_graph)
MAX_JOB_GRAPH_MB = 1.0
MAX_JOB_GRAPH_GROWTH = 1.1
MAX_DRY_RUN_SECONDS = 180.0
MAX_DRY_RUN_RSS = 1.0 * GB
#: a Dask LocalCluster of 2 single-threaded worker processes against the local runner (benchmarks.dask_vs_local)
MAX_DASK_OVER_LOCAL = 1.3
MAX_DASK_TASKS_PER_UNIT = 10
#: the largest single merge on Dask and on the local runner: the larger over the smaller (benchmarks.merge_memory)
MAX_MERGE_MEMORY_DASK_OVER_LOCAL = 1.2


@dataclasses.dataclass(frozen=True)
class Target:
    """One target: a measured value against a limit, passing below (``at_most``) or above it."""

    name: str
    value: float | None
    limit: float
    at_most: bool
    unit: str = "x"

    @property
    def status(self) -> str:
        if self.value is None:
            return "n/a"
        passed = self.value <= self.limit if self.at_most else self.value >= self.limit
        return "PASS" if passed else "FAIL"

    def to_json(self) -> dict:
        return {**dataclasses.asdict(self), "status": self.status}


def target_cells(target: Target | None) -> list[str]:
    """A report table's last two cells for a target: its limit and PASS/FAIL (none: "-" and blank)."""
    if target is None:
        return ["-", ""]
    return [f"<= {target.limit:g}{'x' if target.unit == 'x' else ' ' + target.unit}", target.status]


def _ok(results: dict, scale: str, name: str) -> dict | None:
    competitor = results["scales"].get(scale, {}).get("competitors", {}).get(name)
    return competitor if competitor and competitor["ok"] else None


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or not denominator:
        return None
    return numerator / denominator


def _get(competitor: dict | None, key: str) -> float | None:
    return competitor.get(key) if competitor else None  # (a failed run holds no figures)


def wall_ratio(numerator: dict | None, denominator: dict | None) -> float | None:
    """One competitor's wall over another's: the median of their rounds' ratios when they ran in rounds
    (benchmarks.run --repeat: both met the same spells of a shared machine), else of their walls."""
    if numerator is None or denominator is None:
        return None
    pairs = list(zip(numerator.get("walls", []), denominator.get("walls", [])))
    if len(pairs) > 1:
        return statistics.median(a / b for a, b in pairs)
    return _ratio(numerator["wall"], denominator["wall"])


def scale_targets(results: dict, scale: str) -> list[Target]:
    """Targets measured within one scale: against the floor, the naive peer, 2 workers, the reader."""
    floor, pipeline = _ok(results, scale, "floor"), _ok(results, scale, "pipeline")
    two, naive = _ok(results, scale, "pipeline-2w"), _ok(results, scale, "naive")
    io_limit = _ok(results, scale, "io-limit")
    limit = FLOOR_RATIO[1] if int(scale) < 4 else FLOOR_RATIO[4]
    targets = [
        Target(f"pipeline wall / floor wall ({scale}x)", wall_ratio(pipeline, floor), limit, True),
        Target(f"2-worker wall / default wall ({scale}x)", wall_ratio(two, pipeline), 1.0, True),
        Target(
            f"pipeline samples/s / naive peer's ({scale}x)",
            _ratio(_get(pipeline, "samples_per_second"), _get(naive, "samples_per_second")),
            MIN_SPEEDUP_OVER_NAIVE,
            False,
        ),
    ]
    if int(scale) >= 4:
        ratio = wall_ratio(pipeline, io_limit)
        targets.append(Target(f"pipeline wall / I/O limit wall ({scale}x)", ratio, IO_LIMIT_RATIO, True))
    for name, competitor in (("pipeline", pipeline), ("2-worker pipeline", two)):
        rss = _get(competitor, "peak_rss")
        limit = MAX_RSS_BYTES[name] / GB
        targets.append(Target(f"{name} peak RSS ({scale}x)", rss / GB if rss else None, limit, True, "GB"))
    read = results["scales"].get(scale, {}).get("read")
    targets.append(
        Target(f"parser / expert examples/s (patches, {scale}x)", _get(read, "ratio"), MIN_PARSER_VS_EXPERT, False)
    )
    return targets


def scaling_targets(results: dict) -> list[Target]:
    """Targets comparing each larger scale with 1x: memory growth and time after start-up."""
    if "1" not in results["scales"]:
        return []
    base = _ok(results, "1", "pipeline")
    startup = results.get("startup", {}).get("pipeline")
    startup_wall = startup["wall"] if startup and startup["ok"] else None
    targets = []
    for scale in (s for s in results["scales"] if s != "1"):
        larger = _ok(results, scale, "pipeline")
        growth = _ratio(_get(larger, "peak_rss"), _get(base, "peak_rss"))
        targets.append(Target(f"pipeline peak RSS {scale}x / 1x", growth, MAX_RSS_GROWTH, True))
        adjusted = None
        if larger and base and startup_wall is not None:
            adjusted = _ratio(larger["wall"] - startup_wall, base["wall"] - startup_wall)
        limit = SCALING_SLACK * int(scale)
        targets.append(Target(f"pipeline wall {scale}x / 1x, start-up subtracted", adjusted, limit, True))
    return targets
