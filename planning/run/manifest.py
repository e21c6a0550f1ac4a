"""The record of what builds wrote into an output: the only files ``--overwrite`` may ever delete.

Ownership is decided by this record, never by a name alone (another tool's
``train-00000-of-00010.tfrecord`` has a name like ours). A build writes its manifest into the
output before anything else, listing every final name it may write and its run id; a file is
the tool's if the manifest lists it, if it is a temporary of a listed file (``<name>.tmp-*``),
or if it lies in the working directory of a listed run (``_tmp/<run id>/``). An output written
before manifests existed is recognised by its ``schema.json``, which lists its shards.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable

from planning.run.names import INVENTORY_FILE, MANIFEST_FILE, TEMPORARY_MARK, TMP_DIR
from schemas.schema import FORMAT as SCHEMA_FORMAT
from schemas.schema import PARSER_FILE, SCHEMA_FILE, STATS_FILE

FORMAT = "xarray-tfrecords-manifest/1"
#: What a build keeps for the next one (not its output): their presence alone asks no --overwrite.
BOOKKEEPING = frozenset({MANIFEST_FILE, INVENTORY_FILE})
_METADATA = (SCHEMA_FILE, STATS_FILE, PARSER_FILE)


@dataclasses.dataclass(frozen=True)
class Manifest:
    files: frozenset[str]  # final names, relative to the output (no "/": every one is at its top)
    runs: frozenset[str]  # run ids whose working directory and temporaries may be left

    def owns(self, relative_path: str) -> bool:
        """Whether a file (relative to the output) was written by one of these runs."""
        if relative_path in self.files:
            return True
        final, mark, _ = relative_path.rpartition(TEMPORARY_MARK)
        if mark and "/" not in relative_path and final in self.files:
            return True
        parts = relative_path.split("/")
        return len(parts) > 2 and parts[0] == TMP_DIR and parts[1] in self.runs

    def dumps(self) -> str:
        return json.dumps({"format": FORMAT, "runs": sorted(self.runs), "files": sorted(self.files)}, indent=1)

    @classmethod
    def loads(cls, text: str) -> Manifest | None:
        """The manifest in ``text``, or None if it is not one of ours."""
        try:
            document = json.loads(text)
            if document.get("format") != FORMAT:
                return None
            return cls(frozenset(map(str, document["files"])), frozenset(map(str, document["runs"])))
        except (ValueError, KeyError, TypeError, AttributeError):
            return None


def build_manifest(run_id: str, shard_names: Iterable[str]) -> Manifest:
    """What one build may write: its shards, metadata and bookkeeping, and its working directory."""
    return Manifest(frozenset([*shard_names, *_METADATA, *BOOKKEEPING]), frozenset([run_id]))


def manifest_from_schema(text: str) -> Manifest | None:
    """The record of an output written before manifests existed: what its schema.json lists."""
    try:
        document = json.loads(text)
        if document.get("format") != SCHEMA_FORMAT:
            return None
        shards = [str(shard["file"]) for entry in document.get("splits", {}).values() for shard in entry["shards"]]
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    return Manifest(frozenset([*shards, *_METADATA, *BOOKKEEPING]), frozenset())
