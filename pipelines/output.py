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

from planning.config.model import json_default
from planning.inputs.probe_cache import FORMAT as INVENTORY_FORMAT
from planning.run import generations
from planning.run.generations import GENERATIONS_FILE, Held, check_config, held_of
from planning.run.manifest import BOOKKEEPING, METADATA, Manifest, is_bookkeeping, manifest_from_schema
from planning.run.names import (
    INVENTORY_FILE,
    MANIFEST_FILE,
    TMP_DIR,
    join,
    new_temporary_token,
    relative,
    run_dir,
    temporary_path,
)
from schemas.errors import UserError
from schemas.schema import SCHEMA_FILE, Schema
from schemas.shards import listed_files
from schemas.urls import is_remote
from transforms.files import read_bytes, remove_if_empty, remove_tree, write_atomically
from transforms.finalize import check_owns_output, owns_output, restore_committed

logger = logging.getLogger(__name__)
#: Foreign files named in a refusal.
_NAMED = 3


def _is_file(path: str) -> bool:
    if not is_remote(path):
        return os.path.isfile(path)
    return any(m.path == path for m in FileSystems.match([path])[0].metadata_list)


def _raise(error: OSError) -> None:
    raise error


def _files(path: str) -> tuple[list[str], set[str]]:
    """Every file under ``path``, relative to it, and the links among them (locally: never followed, so never ours)."""
    if is_remote(path):
        return sorted(relative(path, m.path) for m in FileSystems.match([join(path, "**")])[0].metadata_list), set()
    if not os.path.isdir(path):
        return [], set()
    files, links = [], set()
    for directory, subdirectories, names in os.walk(path, onerror=_raise):
        for name in [*subdirectories, *names]:
            entry = os.path.join(directory, name)
            if os.path.islink(entry):
                links.add(relative(path, entry))
            if os.path.islink(entry) or name in names:
                files.append(relative(path, entry))
    return sorted(files), links


def _text(path: str) -> str | None:
    try:
        return read_bytes(path).decode("utf-8", errors="replace")
    except Exception:  # missing or unreadable: then it records nothing
        return None


def _record(path: str, files: list[str]) -> Manifest | None:
    """The record of what earlier builds wrote here: the manifest, else an older output's schema.json.

    UserError if it names a run or a file this tool never makes (it was edited).
    """
    if MANIFEST_FILE in files:
        source = join(path, MANIFEST_FILE)
        if manifest := Manifest.loads(_text(source) or "", source):
            return manifest
    if SCHEMA_FILE in files:
        return manifest_from_schema(_text(join(path, SCHEMA_FILE)) or "", join(path, SCHEMA_FILE))
    return None


#: The inventory's temporary name before temporaries had a token (a crash could leave it).
_OLD_INVENTORY_TEMPORARY = INVENTORY_FILE + ".tmp"


def _ours(path: str, name: str, record: Manifest | None) -> bool:
    if record is not None and record.owns(name):
        return True
    if is_bookkeeping(name) and name not in BOOKKEEPING:
        return True  # a temporary of the manifest or the inventory that a crash left: no record names it
    # A failed build of an older version left its inventory cache alone: it says whose it is.
    inventory = (INVENTORY_FILE, _OLD_INVENTORY_TEMPORARY)
    return name in inventory and INVENTORY_FORMAT.split("/")[0] in (_text(join(path, name)) or "")[:200]


def _kept(name: str) -> bool:
    """Bookkeeping a rerun keeps (its presence asks no --overwrite)."""
    return name in BOOKKEEPING


def _stale(name: str) -> bool:
    """What a crash left while writing bookkeeping: removed without --overwrite."""
    return (is_bookkeeping(name) and name not in BOOKKEEPING) or name == _OLD_INVENTORY_TEMPORARY


def _delete(output: str, names: list[str]) -> None:
    """Delete files of the output, in order; locally never through a link."""
    if not names:
        return
    if is_remote(output):
        FileSystems.delete([join(output, name) for name in names])
        return
    for name in names:
        remove_tree(join(output, name), inside=output)


def _foreign_at_top(path: str) -> list[str]:
    """A local directory without a record of a build (no manifest, no schema.json): its entries no build could have
    written, from its own listing. Such a folder (a home directory, a disk's root) is refused without walking what
    is under it, which could take minutes; an output's own files are walked whole, as ``_files`` does."""
    if is_remote(path) or not os.path.isdir(path) or os.path.islink(path):
        return []
    with os.scandir(path) as entries:
        top = sorted(entries, key=lambda entry: entry.name)
    if any(entry.name in (MANIFEST_FILE, SCHEMA_FILE) for entry in top):
        return []

    def nonempty(entry: os.DirEntry) -> bool:
        try:
            with os.scandir(entry.path) as inside:
                return next(inside, None) is not None
        except OSError:  # unreadable: not a build's either
            return True

    return [
        entry.name + ("/" if entry.is_dir(follow_symlinks=False) else "")
        for entry in top
        if entry.is_symlink()
        or (nonempty(entry) if entry.is_dir(follow_symlinks=False) else not _ours(path, entry.name, None))
    ]


def prepare_output(path: str, overwrite: bool, manifest: Manifest) -> None:
    """Refuse an existing output unless ``overwrite``; remove what earlier builds wrote; record ``manifest``.

    Only files an earlier build recorded are deleted (the old schema.json first, so an
    interrupted clean-up never leaves a directory that looks complete); any other file, and
    any link (this tool makes none), is an error that names it. A directory holding only an
    earlier failed build's bookkeeping needs no --overwrite.
    """
    if _is_file(path):
        raise UserError(f"output: {path} is an existing file; choose a directory path for the output")
    foreign = _foreign_at_top(path)
    if not foreign:
        files, links = _files(path)
        record = _record(path, files)
        foreign = [name for name in files if name in links or not _ours(path, name, record)]
    if foreign:
        named = ", ".join(foreign[:_NAMED]) + (f" and {len(foreign) - _NAMED} more" if len(foreign) > _NAMED else "")
        raise UserError(
            f"output: {path} holds files this tool did not write ({named}); "
            "--overwrite only replaces an earlier output of this tool: choose an empty or new directory"
        )
    written = [name for name in files if not _kept(name) and not _stale(name)]
    if written and not overwrite:
        raise UserError(f"output: {path} already exists; pass --overwrite to replace it, or choose another path")
    _delete(path, [SCHEMA_FILE] if SCHEMA_FILE in written else [])
    _delete(path, [name for name in files if name != SCHEMA_FILE and not _kept(name)])
    for run in record.runs if record else ():
        remove_tree(run_dir(path, run), inside=path)
    remove_if_empty(join(path, TMP_DIR))
    write_atomically(join(path, MANIFEST_FILE), [manifest.dumps().encode()])


def record_complete(output: str, manifest: Manifest) -> None:
    """Once the output is complete: its manifest lists its files only (no run left anything else behind).

    So a finished output holds nothing that changes from run to run, and hashes the same. UserError
    if another build has replaced the output meanwhile: this build must not report it as its own.
    """
    for run in manifest.runs:
        check_owns_output(output, run)
    write_atomically(join(output, MANIFEST_FILE), [dataclasses.replace(manifest, runs=frozenset()).dumps().encode()])


def remove_run_files(output: str, manifest: Manifest, work_dir: str | None, earlier: bytes | None = None) -> bool:
    """Delete what a failed run wrote (shards, metadata, temporaries, its working directory); keep bookkeeping.

    If another build has cleared the output since (its manifest names another run), the files
    named like this run's are that build's: only this run's own directories are removed then.
    Returns whether the output was still this run's. A run killed outright cannot do this; the
    next run with --overwrite does (prepare_output). An append's (``earlier``: the manifest before
    it, put back once all it wrote is gone) first puts back the committed metadata its commit
    replaced, if it was stopped during its commit.
    """
    owned = all(owns_output(output, run) for run in manifest.runs)
    files = []
    whole = owned
    if owned:
        for run in manifest.runs:
            try:
                restore_committed(output, run_dir(output, run))
            except Exception as error:  # cleaning up must not hide why the run failed
                whole = False
                logger.warning("could not put back the committed metadata of %s: %s", output, error)
        try:
            files = [name for name in _files(output)[0] if manifest.owns(name) and name not in BOOKKEEPING]
        except Exception as error:  # cleaning up must not hide why the run failed
            whole = False
            logger.warning("could not list %s: %s", output, error)
        committed = _listed(output) if SCHEMA_FILE not in manifest.files else set()
        if committed & set(files):  # an append stopped after its commit: its shards are the output's now
            whole = False  # (and the manifest naming them stays)
            files = [name for name in files if name not in committed]
    ordered = [SCHEMA_FILE] if SCHEMA_FILE in files else []
    paths = [join(output, name) for name in [*ordered, *(f for f in files if f != SCHEMA_FILE)]]
    paths += [run_dir(output, run) for run in manifest.runs]
    for path in paths:
        try:
            remove_tree(path, inside=output)
        except Exception as error:  # cleaning up must not hide why the run failed
            whole = False
            logger.warning("could not remove %s: %s", path, error)
    if whole and earlier is not None:  # (with a file left, the manifest naming it stays: --overwrite removes it)
        try:
            _put_back(join(output, MANIFEST_FILE), earlier)
        except Exception as error:  # cleaning up must not hide why the run failed
            logger.warning("could not put back %s: %s", join(output, MANIFEST_FILE), error)
    if work_dir is not None and work_dir not in paths:
        try:
            remove_tree(work_dir)
        except Exception as error:  # cleaning up must not hide why the run failed
            logger.warning("could not remove %s: %s", work_dir, error)
    remove_if_empty(join(output, TMP_DIR))
    return owned


def _listed(output: str) -> set[str]:
    """The files the output's schema.json lists (none if it has none, or one this tool cannot read)."""
    try:
        schema = Schema.loads(_text(join(output, SCHEMA_FILE)) or "")
    except Exception:  # (no schema.json, or not one of ours: it lists nothing to keep)
        return set()
    return listed_files(schema.splits)


def _put_back(path: str, data: bytes) -> None:
    """Write a file under a temporary name and rename it, as a stopped run's clean-up may (its writes are refused)."""
    temporary = temporary_path(path, new_temporary_token())
    try:
        with FileSystems.create(temporary) as stream:
            stream.write(data)
        FileSystems.rename([temporary], [path])
    finally:
        if FileSystems.exists(temporary):
            FileSystems.delete([temporary])


def committed_generations(path: str, config: dict, restore: bool = True) -> tuple[Schema, Held]:
    """The output an append adds to: its committed schema, and what its generations hold.

    UserError if there is none, if it was built before appends were recorded, or if ``config``
    (the append's, as JSON) differs from the one it was built with in anything but its input files.
    ``restore``: first put back the committed metadata an append killed during its commit replaced (not in a
    dry run, which writes nothing).
    """
    schema_path, record_path = join(path, SCHEMA_FILE), join(path, GENERATIONS_FILE)
    if restore:
        _restore_stopped_commits(path)
    text = _text(schema_path) if _is_file(schema_path) else None
    if text is None:
        raise UserError(f"output: {path} holds no complete output to append to (no {SCHEMA_FILE}); build it first")
    try:
        schema = Schema.loads(text)
    except (ValueError, KeyError, TypeError) as error:
        raise UserError(
            f"output: {schema_path} is not a schema of this tool ({error}); rebuild with --overwrite"
        ) from None
    record = _text(record_path) if _is_file(record_path) else None
    if record is None:
        raise UserError(
            f"output: {path} was built before appends were recorded (no {GENERATIONS_FILE}); rebuild it once "
            "with --overwrite, then --append adds to it"
        )
    check_config(schema.config, config, json_default)  # (keys added since it was built mean their defaults)
    built = schema.config if isinstance(schema.config, dict) else {}
    stats, sample = built.get("stats") or {}, built.get("sample") or {}
    if isinstance(stats, dict) and isinstance(sample, dict) and sample.get("roles") and "over" not in stats:
        # Its statistics counted every cut value of a variable, the steps and cells no role stores too.
        raise UserError(
            f"output: {path} was built with sample.roles before its statistics counted only the values the records "
            "store, so an append would merge two different counts; rebuild it once with --overwrite, then --append "
            "adds to it"
        )
    committed = int(schema.sources.get("generations", 1))
    entries = generations.loads(record, record_path, committed, schema.sources.get(generations.DIGEST_KEY))
    return schema, held_of(entries, record_path)


def _restore_stopped_commits(path: str) -> None:
    """Put back the committed metadata an append killed during its commit replaced (what its manifest's runs kept)."""
    manifest_path = join(path, MANIFEST_FILE)
    record = Manifest.loads(_text(manifest_path) or "", manifest_path) if _is_file(manifest_path) else None
    for run in record.runs if record else ():
        restore_committed(path, run_dir(path, run))


def prepare_append(path: str, manifest: Manifest, committed: Schema) -> tuple[Manifest, bytes | None]:
    """Before an append writes: remove what an earlier append that never committed left; record the union manifest.

    The committed shards, their indexes and the metadata stay untouched; any file this tool did not
    write is refused as prepare_output refuses it. Returns the manifest recorded (every file of the
    earlier generations and of this one) and the one it replaced, as it was (put back if the append fails).
    """
    files, links = _files(path)
    record = _record(path, files)
    foreign = [name for name in files if name in links or not _ours(path, name, record)]
    if foreign or record is None:
        named = ", ".join(foreign[:_NAMED]) + (f" and {len(foreign) - _NAMED} more" if len(foreign) > _NAMED else "")
        raise UserError(
            f"output: {path} holds files this tool did not write ({named or 'no manifest'}); "
            "--append adds to an output of this tool only: remove them, or rebuild"
        )
    listed = listed_files(committed.splits)
    kept = listed | set(METADATA) | BOOKKEEPING
    _delete(path, [name for name in files if name not in kept and not _stale(name)])
    for run in record.runs:
        remove_tree(run_dir(path, run), inside=path)
    remove_if_empty(join(path, TMP_DIR))
    earlier = read_bytes(join(path, MANIFEST_FILE)) if MANIFEST_FILE in files else None
    union = Manifest(record.files | manifest.files, manifest.runs)
    write_atomically(join(path, MANIFEST_FILE), [union.dumps().encode()])
    return union, earlier
