"""The record of what builds wrote into an output: the only files ``--overwrite`` may ever delete.

Ownership is decided by this record, never by a name alone (another tool's
``train-00000-of-00010.tfrecord`` has a name like ours). A build writes its manifest into the
output before anything else, listing every final name it may write and its run id; a file is
the tool's if the manifest lists it, if it is a temporary of a listed file (``<name>.tmp-*``),
or if it lies in the working directory of a listed run (``_tmp/<run id>/``). An output written
before manifests existed is recognised by its ``schema.json``, which lists its shards.

A manifest is read from disk, where anyone may have edited it: its runs must be run ids as the
tool draws them and its files plain names at the output's top, or it is refused (a run
``../../x`` would otherwise name a directory far from the output to delete).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable

from planning.run.generations import GENERATIONS_FILE
from planning.run.names import INVENTORY_FILE, MANIFEST_FILE, TEMPORARY_MARK, TMP_DIR, is_run_id, is_temporary_of
from schemas.errors import UserError
from schemas.schema import FORMAT_LISTED as SCHEMA_FORMAT  # (outputs from before manifests list their shards)
from schemas.schema import GRID_FILE, PARSER_FILE, SCHEMA_FILE, SHARDS_FILE, STATS_FILE

FORMAT = "xarray-tfrecords-manifest/1"
#: What a build keeps for the next one (not its output): their presence alone asks no --overwrite.
BOOKKEEPING = frozenset({MANIFEST_FILE, INVENTORY_FILE})
METADATA = (SCHEMA_FILE, STATS_FILE, PARSER_FILE, GENERATIONS_FILE, GRID_FILE, SHARDS_FILE)


@dataclasses.dataclass(frozen=True)
class Manifest:
    files: frozenset[str]  # final names, relative to the output (no "/": every one is at its top)
    runs: frozenset[str]  # run ids whose working directory and temporaries may be left

    def owns(self, relative_path: str) -> bool:
        """Whether a file (relative to the output) was written by one of these runs."""
        if relative_path in self.files:
            return True
        final, mark, _ = relative_path.rpartition(TEMPORARY_MARK)
        if mark and final in self.files and is_temporary_of(relative_path, final):
            return True
        parts = relative_path.split("/")
        return len(parts) > 2 and parts[0] == TMP_DIR and parts[1] in self.runs

    def dumps(self) -> str:
        return json.dumps({"format": FORMAT, "runs": sorted(self.runs), "files": sorted(self.files)}, indent=1)

    @classmethod
    def loads(cls, text: str, source: str = MANIFEST_FILE) -> Manifest | None:
        """The manifest in ``text``, or None if it is not one of ours; UserError if it names what the tool never writes.

        ``source``: where the text was read, named in the error.
        """
        try:
            document = json.loads(text)
            if document.get("format") != FORMAT:
                return None
            files, runs = document["files"], document["runs"]
            if not isinstance(files, list) or not isinstance(runs, list):
                return None
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError):  # not a document of ours
            return None
        for run in runs:
            if not is_run_id(run):
                raise _foreign_entry(source, "run", run)
        return cls(frozenset(_checked_files(files, source)), frozenset(runs))


def build_manifest(run_id: str, shard_names: Iterable[str]) -> Manifest:
    """What one build may write: its shards, metadata and bookkeeping, and its working directory."""
    return Manifest(frozenset([*shard_names, *METADATA, *BOOKKEEPING]), frozenset([run_id]))


def manifest_from_schema(text: str, source: str = SCHEMA_FILE) -> Manifest | None:
    """The record of an output written before manifests existed: what its schema.json lists."""
    try:
        document = json.loads(text)
        if document.get("format") != SCHEMA_FORMAT:
            return None
        shards = [
            name
            for entry in document.get("splits", {}).values()
            for shard in entry["shards"]
            for name in (shard["file"], shard.get("index"))  # the shard, and its index where it has one
            if name is not None
        ]
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError):  # not a document of ours
        return None
    return Manifest(frozenset([*_checked_files(shards, source), *METADATA, *BOOKKEEPING]), frozenset())


def is_bookkeeping(name: str) -> bool:
    """Whether a file (relative to the output) is bookkeeping, or a temporary a crash left while writing it."""
    return name in BOOKKEEPING or any(is_temporary_of(name, kept) for kept in BOOKKEEPING)


def _checked_files(names: list, source: str) -> list[str]:
    for name in names:
        # Only names at the output's top: a separator or a dot name would reach out of it.
        plain = isinstance(name, str) and name and "/" not in name and "\\" not in name and "\0" not in name
        if not plain or name.startswith(".") or name == TMP_DIR:
            raise _foreign_entry(source, "file", name)
    return names


def _foreign_entry(source: str, kind: str, entry: object) -> UserError:
    shown = repr(entry) if len(repr(entry)) <= 200 else repr(entry)[:197] + "..."
    return UserError(
        f"output: {source} lists the {kind} {shown}, which this tool never writes; it may have been edited: "
        f"check the output's files, then delete {source} by hand to build there again"
    )
