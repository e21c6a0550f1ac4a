"""Which input.paths name a Zarr store, and the layout a store is planned with (no zarr import: for NetCDF runs)."""

from __future__ import annotations

import dataclasses
import glob
import os
from collections.abc import Sequence

import fsspec

from schemas.errors import UserError
from schemas.urls import is_remote

#: Files only a Zarr store holds at its root: v3's zarr.json, v2's group and consolidated metadata.
MARKERS = ("zarr.json", ".zgroup", ".zmetadata")

#: Names that say kerchunk references: a JSON file, or a Parquet directory (kerchunk's and VirtualiZarr's writers).
REFERENCE_SUFFIXES = (".json", ".parq", ".parquet")


def is_reference(path: str) -> bool:
    """Whether an input path names a kerchunk reference file (taken at its name's word, as ``.zarr`` is): read as
    a Zarr store whose chunks are byte ranges of other files (planning.formats.store_sources)."""
    return path.rstrip("/").lower().endswith(REFERENCE_SUFFIXES)


def is_icechunk(path: str) -> bool:
    """Whether a local directory is an Icechunk repository (its refs and snapshots; opened by
    planning.formats.store_sources)."""
    return not is_remote(path) and all(os.path.isdir(os.path.join(path, part)) for part in ("refs", "snapshots"))


def is_store(path: str) -> bool:
    """Whether an input path names a Zarr store rather than NetCDF files (a glob never does).

    A name with ".zarr" in it is taken at its word, as is a kerchunk reference file's (.json, .parq).
    Otherwise a local directory is looked into;
    a remote path only when its last part has no extension, so a list of NetCDF URLs costs no request.
    """
    name = path.rstrip("/").rsplit("/", 1)[-1]
    if ".zarr" in name.lower():
        return True
    if glob.has_magic(path):
        return False
    if is_reference(path):
        return True
    if is_remote(path) and "." in name:
        return False
    if not is_remote(path):
        return os.path.isdir(path) and (
            any(os.path.exists(os.path.join(path, m)) for m in MARKERS) or is_icechunk(path)
        )
    fs, root = fsspec.core.url_to_fs(path.rstrip("/"))
    if any(fs.exists(f"{root}/{marker}") for marker in MARKERS):
        return True
    if all(fs.isdir(f"{root}/{part}") for part in ("refs", "snapshots")):
        # Icechunk reads object storage through its own client, not fsspec; only local repositories are read.
        raise UserError(
            f"{path}: an Icechunk repository on object storage is not read yet; copy it to a local path "
            "(gcloud storage cp -r ...) and list that path in input.paths"
        )
    return False


def store_input(paths: Sequence[str]) -> str | None:
    """The store input.paths names, or None for NetCDF globs; a store is read alone, never in a list."""
    stores = [p for p in paths if is_store(p)]
    if not stores:
        return None
    if len(paths) > 1:
        other = next((p for p in paths if p not in stores), stores[-1])
        what = "another Zarr store" if other in stores else "NetCDF input"
        raise UserError(
            f"input.paths: {stores[0]} is a Zarr store but {other} is {what}; a store is read alone: "
            "list only the store (or only NetCDF globs)"
        )
    return stores[0].rstrip("/")


@dataclasses.dataclass(frozen=True)
class StoreLayout:
    """A store planned as one source: its URL and each data variable's chunk shape."""

    url: str
    chunks: dict[str, tuple[int, ...]]
    snapshot: str | None = None  # an Icechunk repository's: the snapshot planned, which workers read
