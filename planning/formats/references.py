"""Virtual references as input: a kerchunk reference file (JSON, or a Parquet directory; what VirtualiZarr writes too)
read as a Zarr store whose chunks are byte ranges of the original files, each fetched where a read needs it."""

from __future__ import annotations

import os

import fsspec
from zarr.storage import FsspecStore

from schemas.errors import UserError
from schemas.urls import is_remote


def reference_filesystem(url: str):
    """The references at ``url`` as an async fsspec filesystem (what zarr's FsspecStore reads through)."""
    if not is_remote(url) and not os.path.exists(url):
        raise UserError(f"{url}: no such reference file (not found); check input.paths")
    try:
        return fsspec.filesystem("reference", fo=url, asynchronous=True, skip_instance_cache=True)
    except FileNotFoundError:
        raise UserError(f"{url}: no such reference file (not found); check input.paths") from None
    except Exception as error:
        reason = str(error).splitlines()[0][:200] if str(error) else type(error).__name__
        raise UserError(
            f"{url}: cannot be read as kerchunk references ({reason}); write them with kerchunk or VirtualiZarr "
            "(JSON or Parquet), or check input.paths"
        ) from None


def target_of(fs, key: str) -> str | None:
    """The file a reference's key points into; None for a key held inline (or absent)."""
    try:
        value = fs.references[key]
    except (KeyError, FileNotFoundError):
        return None
    if isinstance(value, list | tuple) and value and isinstance(value[0], str):
        return value[0]
    return None


def missing_target(url: str, key: str, target: str) -> UserError:
    """The error for a chunk whose referenced file cannot be read (zarr alone would read it as fill values)."""
    return UserError(
        f"{url}: chunk {key!r} refers to {target}, which is not found or cannot be read; if the files moved or "
        "were deleted, regenerate the references, or restore the files"
    )


def check_targets(url: str, fs) -> None:
    """Refuse references to files that do not exist, before any worker reads them: a missing file's chunks would
    read as fill values. One check per referenced file."""
    targets = dict.fromkeys(t for t in (target_of(fs, key) for key in fs.references) if t)
    for target in targets:
        try:
            found = fsspec.core.url_to_fs(target)[0].exists(target) if is_remote(target) else os.path.isfile(target)
        except Exception:  # an unknown protocol or an unreachable service: reading it would fail the same way
            found = False
        if not found:
            raise UserError(
                f"{url}: refers to {target}, which is not found; the references point at files that moved or were "
                "deleted: regenerate the references, or restore the files"
            )


def open_reference_store(url: str) -> tuple[FsspecStore, object]:
    """The references at ``url`` as a read-only Zarr store, and their filesystem."""
    fs = reference_filesystem(url)
    return FsspecStore(fs, read_only=True, path=""), fs
