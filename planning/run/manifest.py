"""The record of what builds wrote into an output: the only files ``--overwrite`` may ever delete.

Ownership is decided by this record, never by a name alone (another tool's
``train-00000-of-00010.tfrecord`` has a name like ours). A build writes its manifest into the
output before anything else: its run id, the few fixed names of the metadata and bookkeeping,
and one naming rule per split and generation (its shard count, compression, and whether each
shard has an index beside it), so the manifest's size does not grow with the shards. A file is
the tool's if it is a listed name, if its name parses as a shard (or a shard's index) that a
rule makes exactly, if it is a temporary of either (``<name>.tmp-*``), or if it lies in the
working directory of a listed run (``_tmp/<run id>/``). An output written before manifests
existed is recognised by its ``schema.json``, which lists its shards.

Format 1 manifests listed every file; they are still read (as the set of names they list: reading
2.19M shards' names as rules took 13 times as long), and an append to such an output rewrites its
manifest in format 2, each complete list of a rule's names recorded as that rule.

A manifest is read from disk, where anyone may have edited it: its runs must be run ids as the
tool draws them, its files plain names at the output's top and its rules values the tool writes,
or it is refused (a run ``../../x`` would otherwise name a directory far from the output to delete).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import json
import re
from collections.abc import Iterable

from planning.run.generations import GENERATIONS_FILE
from planning.run.names import INVENTORY_FILE, MANIFEST_FILE, TEMPORARY_MARK, TMP_DIR, is_run_id, is_temporary_of
from schemas.errors import UserError
from schemas.schema import FORMAT as SCHEMA_FORMAT_RULES
from schemas.schema import FORMAT_LISTED as SCHEMA_FORMAT  # (outputs from before manifests list their shards)
from schemas.schema import GRID_FILE, PARSER_FILE, SCHEMA_FILE, SHARDS_FILE, STATS_FILE, Schema
from schemas.shard_index import INDEX_SUFFIX

FORMAT = "xarray-tfrecords-manifest/2"
#: Manifests that list every file by name (still read; rewritten in FORMAT when an append adds to the output).
FORMAT_1 = "xarray-tfrecords-manifest/1"
#: What a build keeps for the next one (not its output): their presence alone asks no --overwrite.
BOOKKEEPING = frozenset({MANIFEST_FILE, INVENTORY_FILE})
METADATA = (SCHEMA_FILE, STATS_FILE, PARSER_FILE, GENERATIONS_FILE, GRID_FILE, SHARDS_FILE)
#: More shards in one split than any build writes (ARCO-ERA5 1940-2024 takes about 2.2 million): a rule
#: counting more was edited.
MAX_SHARDS = 10**8
#: More appends than any output takes.
MAX_GENERATION = 10**6
#: A split's name as a config may give it (an identifier) and a bound on its length: it names files.
_MAX_SPLIT = 200
_DOCUMENT_KEYS = frozenset({"format", "runs", "files", "shards"})
_RULE_KEYS = frozenset({"split", "count", "generation", "compression", "index"})
#: A shard's name (schemas.schema.shard_name), or its index's: parsed, then made again from the parts to compare.
_SHARD_NAME = re.compile(
    r"(?P<split>[^-/]+?)(?:-g(?P<generation>[0-9]{3,}))?-(?P<number>[0-9]{5,})-of-(?P<count>[0-9]{5,})"
    r"\.tfrecord(?P<gzip>\.gz)?(?P<index>" + re.escape(INDEX_SUFFIX) + r")?"
)


@dataclasses.dataclass(frozen=True, order=True)
class ShardRule:
    """The shards of one split of one generation: ``shard_name(split, i, count, compression, generation)`` for
    ``i < count``, each with its index file beside it when ``index``."""

    split: str
    count: int
    generation: int = 0
    compression: str | None = None
    index: bool = True

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @property
    def key(self) -> tuple[str, int, int, str | None]:
        return (self.split, self.count, self.generation, self.compression)


@dataclasses.dataclass(frozen=True)
class ShardName:
    """What a shard's (or its index's) name says: the parameters of shard_name, and whether it is the index."""

    split: str
    number: int
    count: int
    generation: int
    compression: str | None
    index: bool

    @property
    def key(self) -> tuple[str, int, int, str | None]:
        return (self.split, self.count, self.generation, self.compression)


def parse_shard_name(name: str) -> ShardName | None:
    """The parts of a name shard_name makes (or its index's), or None: a name it would not make exactly."""
    parsed = _parsed(name)
    if parsed is None:
        return None
    (split, count, generation, compression), number, index = parsed
    return ShardName(split, number, count, generation, compression, index)


def _parsed(name: str) -> tuple[tuple[str, int, int, str | None], int, bool] | None:
    """(rule key, shard number, whether it is the index) of a name shard_name makes exactly (its padding too)."""
    found = _SHARD_NAME.fullmatch(name)
    if found is None:
        return None
    split, generation, number, count, gzip, index = found.groups()
    if not split.isidentifier() or len(split) > _MAX_SPLIT:
        return None  # (no split of a config's: a rule never names it)
    if not (_padded(number, 5) and _padded(count, 5) and (generation is None or _padded(generation, 3))):
        return None
    if generation is not None and int(generation) == 0:
        return None  # (shard_name states no generation 0)
    key = (split, int(count), int(generation) if generation else 0, "gzip" if gzip else None)
    return key, int(number), index is not None


def _padded(digits: str, width: int) -> bool:
    """Whether a number is written as ``f"{n:0{width}d}"`` writes it: zero-padded to ``width``, no wider with zeros."""
    return len(digits) == width or digits[0] != "0"


@dataclasses.dataclass(frozen=True)
class Manifest:
    """What builds wrote into an output: names, naming rules and runs; ``owns`` decides by them alone."""

    files: frozenset[str]  # names relative to the output (no "/": every one is at its top): metadata, bookkeeping
    runs: frozenset[str]  # run ids whose working directory and temporaries may be left
    shards: frozenset[ShardRule] = frozenset()  # the shards (and indexes) written, by naming rule

    @functools.cached_property
    def _rules(self) -> dict[tuple[str, int, int, str | None], bool]:
        """Each rule's key and whether its shards have indexes (any rule with the key saying so)."""
        rules: dict[tuple[str, int, int, str | None], bool] = {}
        for rule in self.shards:
            rules[rule.key] = rules.get(rule.key, False) or rule.index
        return rules

    def owns_final(self, name: str) -> bool:
        """Whether a final name (no temporary, at the output's top) is one these builds write."""
        if name in self.files:
            return True
        parsed = _parsed(name) if self.shards else None
        if parsed is None:
            return False
        key, number, is_index = parsed
        index = self._rules.get(key)
        return index is not None and number < key[1] and (index or not is_index)

    def owns(self, relative_path: str) -> bool:
        """Whether a file (relative to the output) was written by one of these runs."""
        if self.owns_final(relative_path):
            return True
        final, mark, _ = relative_path.rpartition(TEMPORARY_MARK)
        if mark and self.owns_final(final) and is_temporary_of(relative_path, final):
            return True
        parts = relative_path.split("/")
        return len(parts) > 2 and parts[0] == TMP_DIR and parts[1] in self.runs

    def union(self, other: Manifest, runs: Iterable[str]) -> Manifest:
        """What both record, with these runs; names that rules make exactly (a format 1 list) recorded as the rules."""
        merged = compacted(self.files | other.files)
        return Manifest(merged.files, frozenset(runs), self.shards | other.shards | merged.shards)

    def dumps(self) -> str:
        document = {
            "format": FORMAT,
            "runs": sorted(self.runs),
            "files": sorted(self.files),
            "shards": [rule.to_json() for rule in sorted(self.shards, key=_rule_order)],
        }
        return json.dumps(document, indent=1)

    @classmethod
    def loads(cls, text: str, source: str = MANIFEST_FILE) -> Manifest | None:
        """The manifest in ``text``, or None if it is not one of ours; UserError if it names what the tool never writes.

        ``source``: where the text was read, named in the error.
        """
        try:
            document = json.loads(text)
            version = document.get("format")
            if version not in (FORMAT, FORMAT_1):
                return None
            files, runs = document["files"], document["runs"]
            if not isinstance(files, list) or not isinstance(runs, list):
                if version == FORMAT_1:
                    return None
                raise _edited(source, "holds files or runs that are not lists")
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError):  # not a document of ours
            return None
        for run in runs:
            if not is_run_id(run):
                raise _foreign_entry(source, "run", run)
        if version == FORMAT_1:  # (compacted into rules only when written again: an append's union)
            return cls(frozenset(_checked_files(files, source)), frozenset(runs))
        unknown = sorted(map(str, set(document) - _DOCUMENT_KEYS))
        if unknown:
            raise _edited(source, f"holds the key {_shown(unknown[0])}")
        rules = document.get("shards", [])
        if not isinstance(rules, list):
            raise _edited(source, "holds shards that are not a list")
        return cls(
            frozenset(_checked_files(files, source)), frozenset(runs), frozenset(_rule(r, source) for r in rules)
        )


def compacted(files: frozenset[str]) -> Manifest:
    """A manifest of these names (no runs), each complete set of a rule's names (every shard, with or without
    every index) recorded as that rule; the other names stay names. It owns exactly the same files."""
    # Names are a set: each (rule, number, index or not) once, so counting them is enough to see a rule's every name.
    shards: collections.Counter = collections.Counter()
    indexes: collections.Counter = collections.Counter()
    for name in files:
        parsed = _parsed(name)
        if parsed is not None and parsed[1] < parsed[0][1]:
            (indexes if parsed[2] else shards)[parsed[0]] += 1
    rules = {
        key: ShardRule(*key, index=bool(indexes[key]))
        for key, found in shards.items()
        # Every name the rule makes (a gzip shard has no index), else they are kept as names.
        if found == key[1] and indexes[key] in (0, found if key[3] is None else 0)
    }
    rest = frozenset(name for name in files if not _made_by(_parsed(name), rules))
    return Manifest(rest, frozenset(), frozenset(rules.values()))


def _made_by(parsed: tuple | None, rules: dict) -> bool:
    return parsed is not None and parsed[0] in rules and parsed[1] < parsed[0][1]


def _rule_order(rule: ShardRule) -> tuple:
    return (rule.generation, rule.split, rule.count, rule.compression or "", rule.index)


def build_manifest(run_id: str, shards: Iterable[ShardRule] = ()) -> Manifest:
    """What one build may write: its shards (by rule), metadata and bookkeeping, and its working directory."""
    return Manifest(frozenset([*METADATA, *BOOKKEEPING]), frozenset([run_id]), frozenset(shards))


def manifest_from_schema(text: str, source: str = SCHEMA_FILE) -> Manifest | None:
    """The record of an output without a manifest (written before manifests existed, or its manifest deleted): the
    shards its schema.json lists, or names by rule."""
    try:
        document = json.loads(text)
        if document.get("format") == SCHEMA_FORMAT_RULES:
            return _manifest_from_rules(Schema.loads(text))
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


def _manifest_from_rules(schema: Schema) -> Manifest | None:
    """What a schema.json of shards by rule names (its rules checked as it was loaded)."""
    table = schema.shard_table
    if table is None:
        return None
    rules = [
        ShardRule(split, rule.shards, rule.generation, rule.compression, rule.index)
        for split, generations in table.rules.items()
        for rule in generations
        if rule.shards
    ]
    return Manifest(frozenset([*METADATA, *BOOKKEEPING]), frozenset(), frozenset(rules))


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


def _rule(entry: object, source: str) -> ShardRule:
    """The rule an entry of ``shards`` states, checked to be one a build writes (UserError naming it otherwise)."""
    if not isinstance(entry, dict) or set(entry) != _RULE_KEYS:
        raise _foreign_entry(source, "shard rule", entry)
    split, count, generation = entry["split"], entry["count"], entry["generation"]
    compression, index = entry["compression"], entry["index"]
    valid = (
        isinstance(split, str)
        and split.isidentifier()  # as the config's splits must be: no "/", "..", "-" or "\0"
        and len(split) <= _MAX_SPLIT
        and _whole(count, 1, MAX_SHARDS)
        and _whole(generation, 0, MAX_GENERATION)
        and compression in (None, "gzip")
        and isinstance(index, bool)
        and not (index and compression)  # (a gzip shard has no index)
    )
    if not valid:
        raise _foreign_entry(source, "shard rule", entry)
    return ShardRule(split, count, generation, compression, index)


def _whole(value: object, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def _shown(entry: object) -> str:
    shown = repr(entry)
    return shown if len(shown) <= 200 else shown[:197] + "..."


def _foreign_entry(source: str, kind: str, entry: object) -> UserError:
    return _edited(source, f"lists the {kind} {_shown(entry)}")


def _edited(source: str, what: str) -> UserError:
    return UserError(
        f"output: {source} {what}, which this tool never writes; it may have been edited: "
        f"check the output's files, then delete {source} by hand to build there again"
    )
