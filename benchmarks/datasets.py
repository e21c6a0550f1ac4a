"""The benchmark's datasets: synthetic ERA5-like archives cached in the work directory, and their build configs."""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
from pathlib import Path

import yaml

from pipelines.demo import ArchiveShape, write_archive

VARIABLES = ("t", "u", "v", "q", "z")
PATCH = 9
SERIES = 32
#: Shards of about this size, as the pipeline's default target_shard_mb chooses; written into
#: every config so the floor and the naive peer write the same number of shards.
SHARD_BYTES = 256e6
_MARKER = "archive.json"


@dataclasses.dataclass(frozen=True)
class DatasetSpec:
    """An archive to generate and the samples to cut from it."""

    name: str
    shape: ArchiveShape
    variables: tuple[str, ...]
    sample: dict
    num_samples: int
    num_shards: int
    seed: int = 0
    examples_per_record: int = 1

    @property
    def input_bytes(self) -> int:
        return self.shape.bytes


def _patch_sample() -> dict:
    window = {"size": PATCH, "stride": PATCH}
    return {"window": {"lat": dict(window), "lon": dict(window)}, "keep": ["level"]}


def _shards(shape: ArchiveShape, minimum: int) -> int:
    return max(minimum, math.ceil(shape.bytes / SHARD_BYTES))


def patches(scale: int, quick: bool = False, num_files: int | None = None) -> DatasetSpec:
    """9x9 lat/lon patches of five variables on every level, one time step each (~44 KB a sample)."""
    if quick:
        base = ArchiveShape(num_files=4, steps_per_file=2, levels=3, lat=18, lon=18)
    else:
        base = ArchiveShape(num_files=48, steps_per_file=4, levels=27, lat=64, lon=128)
    files = num_files if num_files is not None else base.num_files * scale
    shape = dataclasses.replace(base, num_files=files)
    samples = files * shape.steps_per_file * (shape.lat // PATCH) * (shape.lon // PATCH)
    name = f"{'quick-' if quick else ''}patches-{files}f"
    return DatasetSpec(name, shape, VARIABLES, _patch_sample(), samples, _shards(shape, 2 if quick else 1))


def points(quick: bool = False, examples_per_record: int = 1) -> DatasetSpec:
    """Point time series: 32 consecutive steps of ``t`` at one grid point and level (~0.4 KB a sample).

    Its own archive, small on disk, so the set has >100k samples yet builds in seconds.
    ``examples_per_record`` > 1 packs that many series into each record (output.examples_per_record).
    """
    if quick:
        shape = ArchiveShape(num_files=2, steps_per_file=16, levels=2, lat=8, lon=8)
    else:
        shape = ArchiveShape(num_files=8, steps_per_file=16, levels=4, lat=64, lon=128)
    steps = shape.num_files * shape.steps_per_file
    samples = (steps // SERIES) * shape.levels * shape.lat * shape.lon
    sample = {"window": {"time": {"size": SERIES, "stride": SERIES}}}
    name = f"{'quick-' if quick else ''}points"
    spec = DatasetSpec(name, shape, ("t",), sample, samples, 2 if quick else 4)
    return dataclasses.replace(spec, examples_per_record=examples_per_record) if examples_per_record > 1 else spec


def ensure_archive(workdir: Path, spec: DatasetSpec) -> Path:
    """The spec's archive under ``workdir/data``, generated unless an identical one is cached there."""
    directory = workdir / "data" / spec.name
    wanted = {"shape": dataclasses.asdict(spec.shape), "seed": spec.seed}
    marker = directory / _MARKER
    if marker.exists() and json.loads(marker.read_text()) == wanted:
        return directory
    if directory.exists():
        shutil.rmtree(directory)
    write_archive(directory, spec.shape, seed=spec.seed)
    # Written last: a generation that was interrupted is regenerated, never reused.
    marker.write_text(json.dumps(wanted))
    return directory


def input_files(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.nc"))


def write_config(workdir: Path, spec: DatasetSpec, archive: Path, output: Path) -> Path:
    """A build config like configs/era5_patches.yaml, pointed at the archive and ``output``."""
    config = {
        "input": {"paths": str(archive / "*.nc"), "concat_dim": "time"},
        "variables": list(spec.variables),
        "sample": spec.sample,
        "shuffle": {"seed": spec.seed},
        "output": {"path": str(output), "num_shards": spec.num_shards},
    }
    if spec.examples_per_record > 1:
        config["output"]["examples_per_record"] = spec.examples_per_record
    path = workdir / "configs" / f"{spec.name}-{output.name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def load_config(path: str | Path) -> dict:
    return yaml.safe_load(Path(path).read_text())
