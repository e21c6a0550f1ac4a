"""The output directory on the driver: refusing or clearing an existing output, removing a failed run's files.

What may be deleted is decided by the output's manifest (planning.run.manifest), never by file
names alone. All I/O goes through Beam's ``FileSystems``, so local paths and ``gs://`` behave
the same.
"""

from __future__ import annotations

import dataclasses
import logging
import os

from apache_beam.io.filesystems import FileSystems

from planning.inputs.probe_cache import FORMAT as INVENTORY_FORMAT
from planning.run.manifest import BOOKKEEPING, Manifest, manifest_from_schema
from planning.run.names import INVENTORY_FILE, MANIFEST_FILE, TMP_DIR, join, relative, run_dir
from schemas.errors import UserError
from schemas.schema import SCHEMA_FILE
from schemas.urls import is_remote
from transforms.shards import read_bytes, remove_if_empty, remove_tree, write_atomically

logger = logging.getLogger(__name__)
#: Foreign files named in a refusal.
_NAMED = 3


def _is_file(path: str) -> bool:
    if not is_remote(path):
        return os.path.isfile(path)
    return any(m.path == path for m in FileSystems.match([path])[0].metadata_list)


def _files(path: str) -> list[str]:
    """Every file under ``path``, relative to it."""
    return sorted(relative(path, m.path) for m in FileSystems.match([join(path, "**")])[0].metadata_list)


def _text(path: str) -> str | None:
    try:
        return read_bytes(path).decode("utf-8", errors="replace")
    except Exception:  # missing or unreadable: then it records nothing
        return None


def _record(path: str, files: list[str]) -> Manifest | None:
    """The record of what earlier builds wrote here: the manifest, else an older output's schema.json."""
    if MANIFEST_FILE in files and (manifest := Manifest.loads(_text(join(path, MANIFEST_FILE)) or "")):
        return manifest
    if SCHEMA_FILE in files:
        return manifest_from_schema(_text(join(path, SCHEMA_FILE)) or "")
    return None


def _ours(path: str, name: str, record: Manifest | None) -> bool:
    if record is not None and record.owns(name):
        return True
    # A failed build of an older version left its inventory cache alone: it says whose it is.
    return name == INVENTORY_FILE and INVENTORY_FORMAT.split("/")[0] in (_text(join(path, name)) or "")[:200]


def prepare_output(path: str, overwrite: bool, manifest: Manifest) -> None:
    """Refuse an existing output unless ``overwrite``; remove what earlier builds wrote; record ``manifest``.

    Only files an earlier build recorded are deleted (the old schema.json first, so an
    interrupted clean-up never leaves a directory that looks complete); any other file is an
    error that names it. A directory holding only an earlier failed build's bookkeeping needs
    no --overwrite.
    """
    if _is_file(path):
        raise UserError(f"output: {path} is an existing file; choose a directory path for the output")
    files = _files(path)
    record = _record(path, files)
    foreign = [name for name in files if not _ours(path, name, record)]
    if foreign:
        named = ", ".join(foreign[:_NAMED]) + (f" and {len(foreign) - _NAMED} more" if len(foreign) > _NAMED else "")
        raise UserError(
            f"output: {path} holds files this tool did not write ({named}); "
            "--overwrite only replaces an earlier output of this tool: choose an empty or new directory"
        )
    written = [name for name in files if name not in BOOKKEEPING]
    if written and not overwrite:
        raise UserError(f"output: {path} already exists; pass --overwrite to replace it, or choose another path")
    if SCHEMA_FILE in written:
        FileSystems.delete([join(path, SCHEMA_FILE)])
    rest = [join(path, name) for name in written if name != SCHEMA_FILE]
    if rest:
        FileSystems.delete(rest)
    for run in record.runs if record else ():
        remove_tree(run_dir(path, run))
    remove_if_empty(join(path, TMP_DIR))
    write_atomically(join(path, MANIFEST_FILE), [manifest.dumps().encode()])


def record_complete(output: str, manifest: Manifest) -> None:
    """Once the output is complete: its manifest lists its files only (no run left anything else behind).

    So a finished output holds nothing that changes from run to run, and hashes the same.
    """
    write_atomically(join(output, MANIFEST_FILE), [dataclasses.replace(manifest, runs=frozenset()).dumps().encode()])


def remove_run_files(output: str, manifest: Manifest, work_dir: str | None) -> None:
    """Delete what a failed run wrote (shards, metadata, temporaries, its working directory); keep bookkeeping.

    A run killed outright cannot do this; the next run with --overwrite does (prepare_output).
    """
    try:
        files = [name for name in _files(output) if manifest.owns(name) and name not in BOOKKEEPING]
    except Exception as error:  # cleaning up must not hide why the run failed
        logger.warning("could not list %s: %s", output, error)
        files = []
    ordered = [SCHEMA_FILE] if SCHEMA_FILE in files else []
    paths = [join(output, name) for name in [*ordered, *(f for f in files if f != SCHEMA_FILE)]]
    paths += [run_dir(output, run) for run in manifest.runs]
    for path in [*paths, work_dir]:
        if path is None:
            continue
        try:
            remove_tree(path)
        except Exception as error:  # cleaning up must not hide why the run failed
            logger.warning("could not remove %s: %s", path, error)
    remove_if_empty(join(output, TMP_DIR))
