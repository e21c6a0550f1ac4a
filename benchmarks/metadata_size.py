"""An output's metadata as its shards grow: schema.json's size, shards.npz's, and the time to open it with a Reader.

Writes a synthetic output's schema.json and shards.npz (no shards: opening reads neither them nor the sidecar)
for 4, 50,000 and 2,000,000 shards, two splits (train 90%, val 10%), counts varying shard to shard as a build's
do, and opens each with ``schemas.Reader`` (the median of several opens, each a fresh process-wide read). The
first format (every shard listed in schema.json) is measured beside it where it is cheap to write.

    python -m benchmarks.metadata_size [--quick] [--result out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from schemas.reader import Reader
from schemas.schema import SCHEMA_FILE, Feature, Schema
from schemas.shards import COUNTS, Generation, ShardTable

#: schema.json at 50,000 shards, at most (issue 43's target), and the open time at any shard count / at 4 shards.
MAX_SCHEMA_BYTES = 64 * 1024
MAX_OPEN_RATIO = 2.0
SHARD_COUNTS = (4, 50_000, 2_000_000)
QUICK_SHARD_COUNTS = (4, 5_000)
#: The first format is written up to this many shards (2M listed shards are ~0.4 GB of JSON).
LISTED_UP_TO = 50_000
_OPENS = 7


def _features() -> tuple[Feature, ...]:
    """An ERA5-like sample: five variables at 13 levels on a 32 x 32 patch, its time and position."""
    variables = tuple(
        Feature(name, "float32", (13, 32, 32), ("level", "lat", "lon"), "variable")
        for name in ("t", "u", "v", "q", "z")
    )
    return (*variables, Feature("index/time", "int64", (), (), "index"), Feature("index/lat", "int64", (), (), "index"))


def _table(shards: int, seed: int = 0) -> ShardTable:
    """Two splits' shards of one generation, ~336 records of ~0.5 MB each a shard (varying by a few)."""
    generator = np.random.default_rng(seed)
    val = max(1, shards // 10)
    rules = {
        "train": (Generation(0, shards - val, None, True, 0, 0, 0),),
        "val": (Generation(0, val, None, True, 0, 0, 0),),
    }
    records = generator.integers(330, 342, size=shards)
    sizes = records * 532_496 + generator.integers(0, 4096, size=shards)
    return ShardTable.from_arrays(rules, dict(zip(COUNTS, (records, records, sizes))))


def _write(directory: Path, shards: int, listed: bool) -> Schema:
    table = _table(shards)
    schema = Schema(_features(), {name: table.split(name) for name in table.rules}, seed=7)
    directory.mkdir(parents=True)
    if listed:
        (directory / SCHEMA_FILE).write_text(schema.dumps(listed=True))
    else:
        for name, data in schema.files().items():
            (directory / name).write_bytes(data)
    return schema


def _open_seconds(directories: list[Path]) -> list[float]:
    """The median wall of opening each output's train split with a Reader, the outputs opened in turn (so that
    what the machine does meanwhile falls on all alike)."""
    Reader(str(directories[0]), "train")  # (warm: the first open of a process imports and caches what all use)
    walls: list[list[float]] = [[] for _ in directories]
    for _ in range(_OPENS):
        for directory, spent in zip(directories, walls):
            started = time.perf_counter()
            reader = Reader(str(directory), "train")
            spent.append(time.perf_counter() - started)
            assert len(reader.shards) > 0
    return [statistics.median(spent) for spent in walls]


def measure(shard_counts: tuple[int, ...], root: Path) -> list[dict]:
    rows, ruled, listed = [], [], []
    for shards in shard_counts:
        ruled.append(root / f"ruled-{shards}")
        _write(ruled[-1], shards, listed=False)
        row = {
            "shards": shards,
            "schema_bytes": (ruled[-1] / SCHEMA_FILE).stat().st_size,
            "sidecar_bytes": (ruled[-1] / "shards.npz").stat().st_size,
        }
        started = time.perf_counter()
        counts = Reader(str(ruled[-1]), "train").shards.counts("records")
        row["counts_seconds"] = time.perf_counter() - started  # the sidecar read, checked, when asked for
        assert len(counts) == shards - max(1, shards // 10)
        if shards <= LISTED_UP_TO:
            listed.append(root / f"listed-{shards}")
            _write(listed[-1], shards, listed=True)
            row["listed_schema_bytes"] = (listed[-1] / SCHEMA_FILE).stat().st_size
        rows.append(row)
    for row, seconds in zip(rows, _open_seconds(ruled)):
        row["open_seconds"] = seconds
    for row, seconds in zip(rows, _open_seconds(listed)):
        row["listed_open_seconds"] = seconds
    base = rows[0]["open_seconds"]
    for row in rows:
        row["open_ratio"] = row["open_seconds"] / base
        row["sidecar_bytes_per_shard"] = row["sidecar_bytes"] / row["shards"]
    return rows


def report(rows: list[dict]) -> list[str]:
    lines = [
        "shards      schema.json  shards.npz  B/shard  open (ms)  x 4 shards  counts read (ms)  listed: size, open"
    ]
    for row in rows:
        listed = (
            f"{row['listed_schema_bytes'] / 1e6:,.2f} MB, {row['listed_open_seconds'] * 1e3:,.1f} ms"
            if "listed_schema_bytes" in row
            else "-"
        )
        lines.append(
            f"{row['shards']:>9,}  {row['schema_bytes'] / 1024:>8.1f} KB  {row['sidecar_bytes'] / 1e6:>7.2f} MB  "
            f"{row['sidecar_bytes_per_shard']:>7.1f}  {row['open_seconds'] * 1e3:>9.2f}  {row['open_ratio']:>10.2f}x  "
            f"{row['counts_seconds'] * 1e3:>16.1f}  {listed}"
        )
    at_50k = [row for row in rows if row["shards"] >= 50_000]
    for row in at_50k:
        verdict = "PASS" if row["schema_bytes"] <= MAX_SCHEMA_BYTES else "FAIL"
        lines.append(
            f"schema.json at {row['shards']:,} shards: {row['schema_bytes']:,} B <= {MAX_SCHEMA_BYTES:,} B: {verdict}"
        )
    worst = max(rows[1:] or rows, key=lambda row: row["open_ratio"])
    verdict = "PASS" if worst["open_ratio"] <= MAX_OPEN_RATIO else "FAIL"
    lines.append(
        f"open time at {worst['shards']:,} shards / at 4: {worst['open_ratio']:.2f}x <= {MAX_OPEN_RATIO}x: {verdict}"
    )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_SHARD_COUNTS} shards only (a smoke test)")
    parser.add_argument("--result", help="write the measurements here as JSON")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="metadata-size-") as root:
        rows = measure(QUICK_SHARD_COUNTS if args.quick else SHARD_COUNTS, Path(root))
    print("\n".join(report(rows)))
    if args.result:
        Path(args.result).write_text(json.dumps({"rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
