"""The output directory on the driver: refusing or clearing an existing output, removing a failed run's files.

What may be deleted is decided by the output's manifest (planning.run.manifest), never by file
names alone. All I/O goes through Beam's ``FileSystems``, so local paths and ``gs://`` behave
the same.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Iterator

from apache_beam.io.filesystems import FileSystems

from planning.config.model import json_default
from planning.inputs.probe_cache import FORMAT as INVENTORY_FORMAT
from planning.run import generations
from planning.run.generations import GENERATIONS_FILE, Held, check_config, held_of
from planning.run.manifest import (
    BOOKKEEPING,
    METADATA,
    Manifest,
    is_bookkeeping,
    manifest_from_schema,
    parse_shard_name,
)
from planning.run.names import (
    INVENTORY_FILE,
    MANIFEST_FILE,
    TMP_DIR,
    join,
    new_temporary_token,
    run_dir,
    temporary_path,
)
from schemas.errors import UserError
from schemas.schema import SCHEMA_FILE, Schema
from schemas.urls import is_remote
from transforms.bulk_files import list_remote
from transforms.files import delete_files, read_bytes, remove_if_empty, remove_tree, write_atomically
from transforms.finalize import check_owns_output, owns_output, restore_committed

logger = logging.getLogger(__name__)
#: Foreign files named in a refusal.
_NAMED = 3


def _is_file(path: str) -> bool:
    if not is_remote(path):
        return os.path.isfile(path)
    return any(m.path == path for m in FileSystems.match([path])[0].metadata_list)


def _walk(path: str) -> Iterator[tuple[str, bool]]:
    """Every file under ``path``, relative to it, and whether it is a link (locally: never followed, so never ours).

    An object store's listing is streamed a page at a time (an output of millions of shards is never held whole).
    """
    if is_remote(path):
        yield from ((name, False) for name in list_remote(path))
        return
    if os.path.isdir(path):
        yield from _walk_local(path, "")


def _walk_local(path: str, directory: str) -> Iterator[tuple[str, bool]]:
    """``_walk`` of a local folder: each directory read whole before its entries are handed out (they may be deleted
    meanwhile), a link never followed, no second system call per entry."""
    with os.scandir(os.path.join(path, directory)) as listing:
        entries = [(entry.name, entry.is_symlink(), entry.is_dir(follow_symlinks=False)) for entry in listing]
    for name, link, folder in entries:
        relative_name = f"{directory}/{name}" if directory else name
        if folder:
            yield from _walk_local(path, relative_name)
        else:
            yield relative_name, link


def _text(path: str) -> str | None:
    try:
        return read_bytes(path).decode("utf-8", errors="replace")
    except Exception:  # missing or unreadable: then it records nothing
        return None


def _record(path: str) -> Manifest | None:
    """The record of what earlier builds wrote here: the manifest, else an older output's schema.json.

    UserError if it names a run or a file this tool never makes (it was edited).
    """
    source = join(path, MANIFEST_FILE)
    if (text := _text(source)) is not None and (manifest := Manifest.loads(text, source)):
        return manifest
    source = join(path, SCHEMA_FILE)
    if (text := _text(source)) is not None:
        return manifest_from_schema(text, source)
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


def _foreign(path: str, record: Manifest | None) -> tuple[list[str], int, bool]:
    """The first few files under ``path`` that no recorded build wrote (links included), how many there are, and
    whether any file is an output's (not bookkeeping alone): one listing, streamed."""
    named, count, written = [], 0, False
    for name, link in _walk(path):
        if link or not _ours(path, name, record):
            count += 1
            if len(named) < _NAMED or name < named[-1]:  # the first few in order, wherever the listing meets them
                named = sorted([*named, name])[:_NAMED]
        written = written or (not _kept(name) and not _stale(name))
    return named, count, written


def _refusal(named: list[str], count: int) -> str:
    return ", ".join(named) + (f" and {count - len(named)} more" if count > len(named) else "")


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
    count, written, record = len(foreign), False, None
    if not foreign:
        record = _record(path)
        foreign, count, written = _foreign(path, record)
    if foreign:
        raise UserError(
            f"output: {path} holds files this tool did not write ({_refusal(foreign, count)}); "
            "--overwrite only replaces an earlier output of this tool: choose an empty or new directory"
        )
    if written and not overwrite:
        raise UserError(f"output: {path} already exists; pass --overwrite to replace it, or choose another path")
    delete_files(path, [SCHEMA_FILE])  # first (one already gone is no error): no half output looks complete
    # A second listing, streamed into the deletes; each name checked again (a file added since is not deleted).
    delete_files(path, (n for n, link in _walk(path) if not link and n != SCHEMA_FILE and _removable(path, n, record)))
    for run in record.runs if record else ():
        remove_tree(run_dir(path, run), inside=path)
    remove_if_empty(join(path, TMP_DIR))
    write_atomically(join(path, MANIFEST_FILE), [manifest.dumps().encode()])


def _removable(path: str, name: str, record: Manifest | None) -> bool:
    """What clearing an output deletes: what a recorded build wrote, its bookkeeping aside."""
    return not _kept(name) and _ours(path, name, record)


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
    whole = owned
    if owned:
        for run in manifest.runs:
            try:
                restore_committed(output, run_dir(output, run))
            except Exception as error:  # cleaning up must not hide why the run failed
                whole = False
                logger.warning("could not put back the committed metadata of %s: %s", output, error)
        # An append stopped after its commit: its shards are the output's now (and the manifest naming them stays).
        committed = _committed_generations(output) if SCHEMA_FILE not in manifest.files else 0
        kept = []

        def removed(name: str) -> bool:
            if not manifest.owns(name) or name in BOOKKEEPING:
                return False
            shard = parse_shard_name(name)
            if shard is not None and shard.generation < committed:
                kept.append(name)
                return False
            return True

        try:
            if removed(SCHEMA_FILE):
                delete_files(output, [SCHEMA_FILE])  # first: no half output looks complete
            delete_files(output, (name for name, _ in _walk(output) if name != SCHEMA_FILE and removed(name)))
        except Exception as error:  # cleaning up must not hide why the run failed (--overwrite removes the rest)
            whole = False
            logger.warning("could not remove the files the run wrote into %s: %s", output, error)
        whole = whole and not kept
    paths = [run_dir(output, run) for run in manifest.runs]
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


def _committed_generations(output: str) -> int:
    """The generations the output's schema.json says are committed (0: none, or a file this tool cannot read)."""
    try:
        count = json.loads(_text(join(output, SCHEMA_FILE)) or "")["sources"].get("generations", 1)
    except Exception:  # (no schema.json, or not one of ours: it holds nothing to keep)
        return 0
    return count if isinstance(count, int) and not isinstance(count, bool) else 0


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
    record = _record(path)
    foreign, count, _ = _foreign(path, record)
    if foreign or record is None:
        raise UserError(
            f"output: {path} holds files this tool did not write ({_refusal(foreign, count) or 'no manifest'}); "
            "--append adds to an output of this tool only: remove them, or rebuild"
        )
    generations = int(committed.sources.get("generations", 1))

    def uncommitted(name: str) -> bool:
        """What an earlier append that never committed wrote: no metadata, no shard of a committed generation."""
        shard = parse_shard_name(name)
        kept = name in METADATA or name in BOOKKEEPING or (shard is not None and shard.generation < generations)
        return not kept and not _stale(name) and _ours(path, name, record)

    delete_files(path, (name for name, link in _walk(path) if not link and uncommitted(name)))
    for run in record.runs:
        remove_tree(run_dir(path, run), inside=path)
    remove_if_empty(join(path, TMP_DIR))
    earlier = _bytes(join(path, MANIFEST_FILE))
    union = record.union(manifest, manifest.runs)  # (an earlier version's list of files: compacted into rules)
    write_atomically(join(path, MANIFEST_FILE), [union.dumps().encode()])
    return union, earlier


def _bytes(path: str) -> bytes | None:
    try:
        return read_bytes(path)
    except Exception:  # missing: there is nothing to put back
        return None
