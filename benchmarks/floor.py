"""The floor: one process, no framework: read every file, cut patches with numpy, encode, shuffle in memory, write.

It does the pipeline's work as directly as plain Python and numpy can, with the same encoder,
the same shuffle keys and the same framing, so its shards are byte-identical to the
pipeline's (the orchestrator checks). It handles the benchmark's patch config only.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from collections import defaultdict
from glob import glob
from pathlib import Path

import netCDF4
import numpy as np

from benchmarks.datasets import load_config
from planning.keys import sample_keys, shard_of
from schemas.example_codec import ExampleEncoder
from schemas.schema import Feature


class Phases:
    """Seconds spent per phase, so the report can say where the floor's time goes."""

    def __init__(self):
        self.seconds: dict[str, float] = defaultdict(float)
        self._last = time.perf_counter()

    def done(self, name: str) -> None:
        now = time.perf_counter()
        self.seconds[name] += now - self._last
        self._last = now


def patch_features(variables: list[str], levels: int, size: int) -> list[Feature]:
    """The features the pipeline writes for this config, in its order (so the bytes match)."""
    features = [
        Feature(name, "float32", (levels, size, size), ("level", "lat", "lon"), "variable") for name in variables
    ]
    features += [Feature(f"index/{dim}", "int64", (), (), "index") for dim in ("time", "lat", "lon")]
    features.append(Feature("coord/time", "int64", (), (), "coord"))
    features += [Feature(f"coord/{dim}", "float32", (size,), (dim,), "coord") for dim in ("lat", "lon")]
    return features


def read_file(path: str, variables: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """Seconds since 1970 of each step, lat, lon and every variable's values of one file."""
    with netCDF4.Dataset(path) as nc:
        # Masked arrays cost a full extra pass; the fill value of these floats is NaN anyway.
        nc.set_auto_mask(False)
        time_var = nc.variables["time"]
        dates = netCDF4.num2date(
            time_var[:], time_var.units, getattr(time_var, "calendar", "standard"), only_use_python_datetimes=True
        )
        seconds = np.array(dates, dtype="datetime64[s]").astype(np.int64)
        fields = {name: nc.variables[name][:] for name in variables}
        return seconds, nc.variables["lat"][:], nc.variables["lon"][:], fields


def cut_patches(values: np.ndarray, size: int) -> np.ndarray:
    """(time, level, lat, lon) -> (time * lat patches * lon patches, level, size, size), row-major."""
    steps, levels, rows, cols = values.shape
    ny, nx = rows // size, cols // size
    tiles = values[:, :, : ny * size, : nx * size].reshape(steps, levels, ny, size, nx, size)
    return tiles.transpose(0, 2, 4, 1, 3, 5).reshape(steps * ny * nx, levels, size, size)


def position_columns(first_step: int, steps: int, ny: int, nx: int, size: int) -> dict[str, np.ndarray]:
    """Grid position of every patch of a file: global time index, patch row and column."""
    per_step = ny * nx
    return {
        "time": np.repeat(first_step + np.arange(steps), per_step),
        "row": np.tile(np.repeat(np.arange(ny), nx), steps),
        "col": np.tile(np.arange(nx), steps * ny),
    }


class Moments:
    """float64 count, mean, M2, min, max per variable, merged with Chan et al.'s update."""

    def __init__(self):
        self.count, self.mean, self.m2 = 0, 0.0, 0.0
        self.minimum, self.maximum, self.nan_count = math.inf, -math.inf, 0

    def add(self, values: np.ndarray) -> None:
        x = values.astype(np.float64).reshape(-1)
        finite = np.isfinite(x)
        if not finite.all():
            self.nan_count += int(np.isnan(x).sum())
            x = x[finite]
        if not len(x):
            return
        mean = float(x.mean())
        centred = x - mean
        count = self.count + len(x)
        delta = mean - self.mean
        self.m2 += float(np.dot(centred, centred)) + delta * delta * self.count * len(x) / count
        self.mean += delta * len(x) / count
        self.count = count
        self.minimum = min(self.minimum, float(x.min()))
        self.maximum = max(self.maximum, float(x.max()))

    def to_json(self) -> dict:
        return {"count": self.count, "mean": self.mean, "variance": self.m2 / max(self.count, 1)}


def write_shards(output: Path, records: list[bytes], keys: np.ndarray, num_shards: int) -> list[int]:
    """Records in shuffled order: by shard, then by key within each shard. Returns bytes per shard.

    Each shard reaches the disk (fsync) before the next, as the pipeline's commit syncs its shards:
    both write a durable output.
    """
    shards = shard_of(keys, num_shards)
    order = np.lexsort((keys, shards))
    bounds = np.searchsorted(shards[order], np.arange(num_shards + 1))
    output.mkdir(parents=True, exist_ok=True)
    written = []
    for shard in range(num_shards):
        chosen = order[bounds[shard] : bounds[shard + 1]].tolist()
        with open(output / f"data-{shard:05d}-of-{num_shards:05d}.tfrecord", "wb") as stream:
            stream.writelines(records[i] for i in chosen)
            written.append(stream.tell())
            stream.flush()
            os.fsync(stream.fileno())
    return written


def patch_columns(
    fields: dict[str, np.ndarray], seconds: np.ndarray, lat: np.ndarray, lon: np.ndarray, first_step: int, size: int
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Every feature's column for one file's patches, and each patch's sample id on the whole grid."""
    steps, _, rows, cols = next(iter(fields.values())).shape
    ny, nx = rows // size, cols // size
    columns = {name: cut_patches(values, size) for name, values in fields.items()}
    pos = position_columns(first_step, steps, ny, nx, size)
    window = np.arange(size)
    columns["index/time"] = pos["time"]
    columns["index/lat"] = pos["row"] * size
    columns["index/lon"] = pos["col"] * size
    columns["coord/time"] = seconds[pos["time"] - first_step]
    columns["coord/lat"] = lat[(pos["row"] * size)[:, None] + window]
    columns["coord/lon"] = lon[(pos["col"] * size)[:, None] + window]
    return columns, (pos["time"] * ny + pos["row"]) * nx + pos["col"]


def build(config: dict, phases: Phases) -> dict:
    """Do the whole build in memory; returns counts and statistics for the result file."""
    variables = list(config["variables"])
    size = config["sample"]["window"]["lat"]["size"]
    paths = sorted(glob(config["input"]["paths"]))
    records: list[bytes] = []
    keys: list[np.ndarray] = []
    moments = {name: Moments() for name in variables}
    encoder, first_step = None, 0
    for path in paths:
        seconds, lat, lon, fields = read_file(path, variables)
        phases.done("read")
        levels = fields[variables[0]].shape[1]
        encoder = encoder or ExampleEncoder(patch_features(variables, levels, size))
        columns, sample_ids = patch_columns(fields, seconds, lat, lon, first_step, size)
        first_step += len(seconds)
        phases.done("cut")
        for name in variables:
            moments[name].add(columns[name])
        phases.done("stats")
        # A step's patches at a time, as the pipeline encodes a block at a time: each record is copied out of
        # a small rows array, not left in one array of the whole file's (fresh memory that numpy asks the
        # kernel to back with huge pages: compacting for them stalled this loop, 3x its time, measured).
        per_step = len(sample_ids) // len(seconds)
        for start in range(0, len(sample_ids), per_step):
            step = {name: column[start : start + per_step] for name, column in columns.items()}
            records.extend(map(bytes, encoder.rows(step).in_order()))
        keys.append(sample_keys(sample_ids, config["shuffle"]["seed"]))
        phases.done("encode+frame")
    written = write_shards(
        Path(config["output"]["path"]), records, np.concatenate(keys), config["output"]["num_shards"]
    )
    phases.done("shuffle+write")
    return {
        "samples": len(records),
        "files": len(paths),
        "input_bytes": sum(Path(p).stat().st_size for p in paths),
        "output_bytes": sum(written),
        "stats": {name: m.to_json() for name, m in moments.items()},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="the generated build config (patches)")
    parser.add_argument("--result", required=True, help="where to write the result JSON")
    args = parser.parse_args(argv)
    phases = Phases()
    result = build(load_config(args.config), phases)
    result["phases"] = dict(phases.seconds)
    Path(args.result).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
