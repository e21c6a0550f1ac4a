"""What the benchmarks' competitors share about inputs and outputs: the checkout, warm inputs, sizes, equal shards."""

from __future__ import annotations

import filecmp
from pathlib import Path

from benchmarks import datasets

REPO = Path(__file__).resolve().parents[1]


def warm_files(paths: list[Path]) -> None:
    """Read each file once, so that it is in the page cache."""
    for path in paths:
        with open(path, "rb") as stream:
            while stream.read(1 << 24):
                pass


def warm_page_cache(source: Path) -> None:
    """Read the inputs once (an archive's NetCDF files, or a Zarr store's every file), so every competitor starts
    with them in the page cache alike."""
    if source.suffix == ".zarr":
        warm_files(sorted(p for p in source.rglob("*") if p.is_file()))
    else:
        warm_files(datasets.input_files(source))


def input_bytes(archive: Path) -> int:
    return sum(p.stat().st_size for p in datasets.input_files(archive))


def same_shards(left: Path, right: Path) -> bool | None:
    """Whether two outputs hold byte-identical shards; None if either is missing."""
    names = sorted(p.name for p in right.glob("data-*.tfrecord"))
    if not names or not left.exists():
        return None
    if sorted(p.name for p in left.glob("data-*.tfrecord")) != names:
        return False
    return all(filecmp.cmp(left / n, right / n, shallow=False) for n in names)
