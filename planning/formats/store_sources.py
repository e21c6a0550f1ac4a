"""Zarr stores that are not a directory of chunks: kerchunk reference files (JSON or Parquet, what VirtualiZarr
writes too), whose chunks are byte ranges of the original files, and Icechunk repositories, one version of which
is opened (a branch or tag resolved to its snapshot at planning; workers open that snapshot)."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

import fsspec
from zarr.storage import FsspecStore

from schemas.errors import UserError
from schemas.urls import is_remote


def reference_filesystem(url: str):
    """The references at ``url`` as an async fsspec filesystem (what zarr's FsspecStore reads through)."""
    if not is_remote(url) and not os.path.exists(url):
        raise UserError(f"{url}: no such reference file (not found); check input.paths")
    try:
        # The referenced files' filesystems async too (gcsfs, s3fs), as zarr reads through them; local ones are
        # wrapped by fsspec.
        return fsspec.filesystem(
            "reference",
            fo=url,
            asynchronous=True,
            remote_protocol=_parquet_protocol(url) if _is_parquet(url) else None,
            remote_options={"asynchronous": True},
            skip_instance_cache=True,
        )
    except FileNotFoundError:
        raise UserError(f"{url}: no such reference file (not found); check input.paths") from None
    except Exception as error:
        reason = str(error).splitlines()[0][:200] if str(error) else type(error).__name__
        raise UserError(
            f"{url}: cannot be read as kerchunk references ({reason}); write them with kerchunk or VirtualiZarr "
            "(JSON or Parquet), or check input.paths"
        ) from None


def _is_parquet(url: str) -> bool:
    return url.rstrip("/").lower().endswith((".parq", ".parquet"))


def _parquet_protocol(url: str) -> str:
    """The protocol of the files Parquet references name ("file" for local paths), found as fsspec would, but
    skipping rows without a path: fsspec takes the first reference it meets as a path, and a Parquet row without
    one (an inline chunk, a record's padding) reads as NaN, on which it fails, depending on which variable it
    happens to look at first."""
    from fsspec.implementations.reference import LazyReferenceMapper

    fs, root = fsspec.core.url_to_fs(url)
    for value in LazyReferenceMapper(root, fs=fs).values():
        if isinstance(value, list | tuple) and value and isinstance(value[0], str) and value[0]:
            return fsspec.core.split_protocol(value[0])[0] or "file"
    return "file"


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
            if is_remote(target):
                found = fsspec.core.url_to_fs(target)[0].exists(target)
            else:  # (a FIFO or device is refused too: a read of it would block, or never end)
                found = os.path.isfile(target.removeprefix("file://"))
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


_ICECHUNK_INSTALL = 'install icechunk (pip install "xarray-tfrecords[icechunk]")'

#: icechunk warns at every open of local storage that it is not safe for concurrent commits: a build never commits.
_LOGS = "warn,icechunk::storage::object_store=error"


def _reason(error: Exception) -> str:
    """icechunk's error in a few words: its first line, without the report's decoration."""
    lines = [re.sub(r"^\s*(?:[x|]\s+|`->\s*)", "", line).strip() for line in str(error).splitlines()]
    return next((line for line in lines if line and line != "|"), type(error).__name__)[:200]


def open_icechunk(url: str, version: Mapping[str, str]):
    """A read-only session's store of the repository at ``url`` (a local path), at ``version`` (icechunk's
    readonly_session keywords: branch, tag or snapshot_id), and the snapshot id it reads."""
    try:
        import icechunk
    except ImportError:
        raise UserError(f"{url}: reading an Icechunk repository needs icechunk; {_ICECHUNK_INSTALL}") from None
    icechunk.set_logs_filter(_LOGS)
    if not os.path.isdir(url):
        raise UserError(f"{url}: no such Icechunk repository (not found); check input.paths")
    try:
        repository = icechunk.Repository.open(icechunk.local_filesystem_storage(url))
    except icechunk.IcechunkError as error:
        raise UserError(
            f"{url}: cannot be opened as an Icechunk repository ({_reason(error)}); check input.paths"
        ) from None
    ((kind, name),) = version.items()
    try:
        session = repository.readonly_session(**version)
    except icechunk.IcechunkError as error:
        what = {"branch": "branch", "tag": "tag", "snapshot_id": "snapshot"}[kind]
        known = _known(repository, what)
        raise UserError(
            f"{url}: Icechunk {what} {name!r} is not in the repository ({_reason(error)}); "
            f"set input.icechunk.{what} to one that is{known}"
        ) from None
    return session.store, session.snapshot_id


def _known(repository, what: str) -> str:
    """The branches or tags the repository has, for the error ("" for snapshots: there are too many to list)."""
    if what == "snapshot":
        return ""
    try:
        names = sorted(repository.list_branches() if what == "branch" else repository.list_tags())
    except Exception:  # listing is a courtesy: the error stands without it
        return ""
    if not names:
        return ""
    return f" ({what}es: {', '.join(names[:10])})" if what == "branch" else f" (tags: {', '.join(names[:10])})"
