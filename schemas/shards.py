"""Each split's shards by a naming rule in schema.json, their per-shard counts in shards.npz beside it.

schema.json holds, per split, its totals, where its shards start in the sidecar and one rule per generation
(how many shards, compressed or not, with a .tfindex beside each or not, and that generation's totals): its
size does not grow with the shards.
What does, each shard's records, examples and bytes, goes to ONE sidecar, shards.npz (schemas.sidecar):
little-endian integer arrays in the order of the splits, then generations, then shard numbers, 4 bytes a
value where every value fits (8 otherwise), ``examples`` left out where it equals ``records``. Loading a
schema reads none of it; a reader asking for a shard's counts reads it once, checked against schema.json's
size and sha256, then every count against the rules' totals, before any is used.
"""

from __future__ import annotations

import dataclasses
import re
import threading
import zipfile
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from schemas.errors import UserError
from schemas.npy_files import npz_arrays
from schemas.schema_checks import SchemaError, count, expect, file_name, shown
from schemas.shard_index import index_name
from schemas.sidecar import digest, npz_bytes, read_sidecar

#: The sidecar of per-shard counts, beside schema.json.
SHARDS_FILE = "shards.npz"
#: The most shards an output holds: a shard's number is an int32 in tf.data, and a schema.json stating more
#: (2**40) would make a reader allocate without end.
MAX_SHARDS = 2**31 - 1
#: The sidecar's arrays; ``examples`` may be left out (then equal to ``records``).
COUNTS = ("records", "examples", "bytes")
_COMPRESSIONS = (None, "gzip")


def shard_name(split: str, index: int, count: int, compression: str | None = None, generation: int = 0) -> str:
    """File name of shard ``index`` of ``count`` in a split, e.g. train-00003-of-00016.tfrecord.gz.

    Shards an append adds (``generation`` 1, 2, ...) say so, so that no name repeats across generations:
    train-g001-00000-of-00002.tfrecord.
    """
    marked = f"{split}-g{generation:03d}" if generation else split
    return f"{marked}-{index:05d}-of-{count:05d}.tfrecord" + (".gz" if compression == "gzip" else "")


#: What names a shard (shard_name), its index or a temporary of either, and the generation it states (none: 0).
#: Numbers are five digits or more: a generation of 100,000 shards or more writes them wider.
_SHARD_IN_NAME = re.compile(r"-(?:g(\d{3,})-)?\d{5,}-of-\d{5,}\.tfrecord")


def is_shard_name(name: str) -> bool:
    """Whether a file's name is a shard's as shard_name makes them (or its index's, or a temporary's)."""
    return _SHARD_IN_NAME.search(name) is not None


def generation_of_name(name: str) -> int:
    """The generation a shard file's name (or its index's, or a temporary's) states (0 where it states none)."""
    found = _SHARD_IN_NAME.search(name)
    return int(found.group(1)) if found and found.group(1) else 0


@dataclasses.dataclass(frozen=True)
class Shard:
    """One written TFRecord file of a split: its TFRecord records and the samples they hold.

    ``examples`` equals ``records`` unless samples are packed several to a record.
    """

    file: str
    records: int
    bytes: int
    examples: int | None = None
    #: the shard's record index beside it (schemas.shard_index); None: none (gzip shards cannot have one)
    index: str | None = None
    #: the build that wrote it: 0, or the append (1, 2, ...) that added it (pipelines.build --append)
    generation: int = 0

    def __post_init__(self):
        if self.examples is None:
            object.__setattr__(self, "examples", self.records)

    @classmethod
    def from_json(cls, obj: Any, where: str) -> Shard:
        """The shard ``obj`` describes (schema.json's first format), its names and counts checked."""
        expect(obj, dict, where, "an object")
        fields = {field.name for field in dataclasses.fields(cls)}
        unknown = sorted(set(obj) - fields)
        if unknown:
            raise SchemaError(f"{where}: unknown key {unknown[0]!r}")
        file_name(obj.get("file"), f"{where}.file")
        if obj.get("index") is not None:
            file_name(obj["index"], f"{where}.index")
        for key in ("records", "bytes"):
            count(obj.get(key), f"{where}.{key}")
        for key in ("examples", "generation"):
            if obj.get(key) is not None:
                count(obj[key], f"{where}.{key}")
        return cls(**obj)


@dataclasses.dataclass(frozen=True)
class Generation:
    """One generation's shards of a split: named by shard_name, numbered 0 to ``shards`` - 1, and their totals."""

    generation: int
    shards: int
    compression: str | None
    #: whether each shard has its record index (schemas.shard_index) beside it
    index: bool
    records: int
    examples: int
    bytes: int

    def file(self, split: str, number: int) -> str:
        return shard_name(split, number, self.shards, self.compression, self.generation)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, obj: Any, split: str, where: str) -> Generation:
        """The rule ``obj`` describes, checked: counts, a shard count below MAX_SHARDS, names inside the output."""
        expect(obj, dict, where, "an object")
        unknown = sorted(set(obj) - {field.name for field in dataclasses.fields(cls)})
        if unknown:
            raise SchemaError(f"{where}: unknown key {unknown[0]!r}")
        for key in ("generation", "shards", "records", "examples", "bytes"):
            count(obj.get(key), f"{where}.{key}")
        if obj["shards"] > MAX_SHARDS:
            raise SchemaError(f"{where}.shards: {obj['shards']:,} is more shards than an output can hold")
        if "compression" not in obj:  # (null is a value a rule states; a rule without the key was edited)
            raise SchemaError(f"{where}.compression: missing")
        if obj["compression"] not in _COMPRESSIONS:
            raise SchemaError(f"{where}.compression: {shown(obj.get('compression'))} is not null or 'gzip'")
        expect(obj.get("index"), bool, f"{where}.index", "true or false")
        rule = cls(**obj)
        if rule.shards:  # the split's name is in every shard's: one that leaves the folder is refused here
            file_name(rule.file(split, 0), f"{where} (its shards' names)")
        return rule


class ShardTable:
    """Every split's shards: the rules schema.json holds and the per-shard counts of its sidecar, read when asked.

    Args:
        rules: per split, its generations in order.
        reference: schema.json's ``shards`` entry: the sidecar's ``file``, ``bytes``, ``sha256`` and ``count``.
        counts: the per-shard counts where already in memory (a build's own), else None: read from ``folder``.
        folder: the output's folder the sidecar is read from.
    """

    def __init__(
        self,
        rules: Mapping[str, tuple[Generation, ...]],
        reference: dict[str, Any],
        counts: dict[str, np.ndarray] | None = None,
        folder: str = "",
    ):
        self.rules = dict(rules)
        self.reference = reference
        self.folder = folder
        self._counts = counts
        self._data: bytes | None = None
        self._lock = threading.Lock()
        starts, start = {}, 0
        for split, generations in self.rules.items():
            starts[split] = start
            start += sum(rule.shards for rule in generations)
        self._starts = starts

    @classmethod
    def from_arrays(
        cls, rules: Mapping[str, tuple[Generation, ...]], counts: dict[str, np.ndarray], folder: str = ""
    ) -> ShardTable:
        """The table of a build: its rules and per-shard counts (concatenated in the rules' order), its sidecar made.

        The rules' totals are taken from ``counts``; whatever totals ``rules`` held are replaced.
        """
        records, examples, sizes = (np.asarray(counts[key], dtype=np.int64) for key in COUNTS)
        totalled, start = {}, 0
        for split, generations in rules.items():
            totalled[split] = []
            for rule in generations:
                part = slice(start, start + rule.shards)
                sums = {key: int(array[part].sum()) for key, array in zip(COUNTS, (records, examples, sizes))}
                totalled[split].append(dataclasses.replace(rule, **sums))
                start += rule.shards
        if start != len(records):
            raise ValueError(f"the rules name {start} shards, the counts hold {len(records)}")
        stored = {"records": _narrow(records), "bytes": _narrow(sizes)}
        if not np.array_equal(examples, records):
            stored["examples"] = _narrow(examples)
        data = npz_bytes({key: stored[key] for key in COUNTS if key in stored})
        reference = {"file": SHARDS_FILE, "bytes": len(data), "sha256": digest(data), "count": start}
        table = cls({split: tuple(generations) for split, generations in totalled.items()}, reference, folder=folder)
        table._counts = {"records": records, "examples": examples, "bytes": sizes}
        table._data = data
        return table

    @classmethod
    def from_shards(cls, splits: Mapping[str, Sequence[Shard]]) -> ShardTable | None:
        """The table of shards listed one by one (schema.json's first format); None where any is named otherwise
        than its generation's rule says (then only a list says where they are)."""
        rules: dict[str, tuple[Generation, ...]] = {}
        columns: dict[str, list[int]] = {key: [] for key in COUNTS}
        for split, shards in splits.items():
            if isinstance(shards, ShardList):
                shards = tuple(shards)
            generations, start = [], 0
            while start < len(shards):
                first = shards[start]
                stop = start
                while stop < len(shards) and shards[stop].generation == first.generation:
                    stop += 1
                compression = "gzip" if first.file.endswith(".gz") else None
                rule = Generation(first.generation, stop - start, compression, first.index is not None, 0, 0, 0)
                for number, shard in enumerate(shards[start:stop]):
                    name = rule.file(split, number)
                    if shard.file != name or shard.index != (index_name(name) if rule.index else None):
                        return None
                    for key in COUNTS:
                        columns[key].append(getattr(shard, key))
                generations.append(rule)
                start = stop
            rules[split] = tuple(generations)
        return cls.from_arrays(rules, {key: np.asarray(values, dtype=np.int64) for key, values in columns.items()})

    @classmethod
    def from_json(cls, splits: dict[str, Any], reference: Any) -> ShardTable:
        """The table schema.json describes (its second format); SchemaError where its rules or totals are malformed."""
        expect(reference, dict, "shards", "an object")
        file_name(reference.get("file"), "shards.file")
        for key in ("bytes", "count"):
            count(reference.get(key), f"shards.{key}")
        if not (isinstance(reference.get("sha256"), str) and re.fullmatch(r"[0-9a-f]{64}", reference["sha256"])):
            raise SchemaError(f"shards.sha256: {shown(reference.get('sha256'))} is not a sha256 in hex")
        rules, start = {}, 0
        for split, entry in splits.items():
            where = f"splits.{split}"
            expect(entry, dict, where, "an object")
            listed = expect(entry.get("generations"), list, f"{where}.generations", "a list")
            rules[split] = tuple(
                Generation.from_json(rule, split, f"{where}.generations[{i}]") for i, rule in enumerate(listed)
            )
            for key in ("records", "examples", "bytes", "shards"):
                stated = count(entry.get(key), f"{where}.{key}")
                summed = sum(getattr(rule, key) for rule in rules[split])
                if stated != summed:
                    raise SchemaError(f"{where}.{key}: {stated:,}, but its generations' add up to {summed:,}")
            if count(entry.get("start"), f"{where}.start") != start:
                raise SchemaError(f"{where}.start: {entry['start']:,}, but the splits before it hold {start:,} shards")
            start += entry["shards"]
        shards = sum(rule.shards for generations in rules.values() for rule in generations)
        if shards != reference["count"] or shards > MAX_SHARDS:
            raise SchemaError(f"shards.count: {reference['count']:,}, but the splits' rules name {shards:,} shards")
        return cls(rules, dict(reference))

    def __getstate__(self) -> dict[str, Any]:
        # Pickled small (a reader sent to workers): one read from its folder has the counts again.
        state = {**self.__dict__, "_lock": None}
        if self.folder:
            state.update(_counts=None, _data=None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _lock=threading.Lock())

    def bound(self, folder: str) -> ShardTable:
        """The same table, its sidecar read from ``folder`` (the output's)."""
        table = ShardTable(self.rules, self.reference, self._counts, folder)
        table._data = self._data
        return table

    def split(self, name: str) -> ShardList:
        return ShardList(self, name)

    def shard_count(self, split: str) -> int:
        return sum(rule.shards for rule in self.rules[split])

    def total(self, split: str, key: str) -> int:
        """A split's total of ``records``, ``examples`` or ``bytes``, from schema.json (the sidecar is not read)."""
        return sum(getattr(rule, key) for rule in self.rules[split])

    def to_json(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """schema.json's ``splits`` and ``shards`` entries."""
        splits = {
            split: {
                **{key: self.total(split, key) for key in ("examples", "records", "bytes")},
                "shards": self.shard_count(split),
                # (the sidecar's order is the splits' here; a reader that sorts them finds its shards by this)
                "start": self._starts[split],
                "generations": [rule.to_json() for rule in generations],
            }
            for split, generations in self.rules.items()
        }
        return splits, dict(self.reference)

    def data(self) -> bytes:
        """The sidecar's bytes (read and checked once, where this table was loaded from schema.json)."""
        if self._data is None:
            self._data = self._read()
        return self._data

    def _read(self) -> bytes:
        if not self.folder:
            raise UserError(
                f"schema.json keeps its shards' counts in {self.reference['file']}, and this schema was not loaded "
                "from an output's folder; load it with schemas.load_schema(output) so they can be read"
            )
        what = "each shard's record count and size"
        size = self.reference["bytes"]
        return read_sidecar(self.folder, self.reference["file"], self.reference["sha256"], what, size)

    def counts(self) -> dict[str, np.ndarray]:
        """Every shard's ``records``, ``examples`` and ``bytes`` (int64, read-only), in the rules' order, checked."""
        with self._lock:
            if self._counts is None:
                self._counts = self._checked(self.data())
            return self._counts

    def _checked(self, data: bytes) -> dict[str, np.ndarray]:
        url = f"{self.folder.rstrip('/')}/{self.reference['file']}"
        fix = "build the output again"
        try:
            with npz_arrays(data) as archive:
                stored = {key: archive[key] for key in COUNTS if key in archive.files}
        except (ValueError, OSError, zipfile.BadZipFile) as error:
            raise UserError(f"{url}: not an .npz of shard counts ({error}); {fix}") from None
        for key in ("records", "bytes"):
            if key not in stored:
                raise UserError(f"{url}: holds no array {key!r}; {fix}")
        stored.setdefault("examples", stored["records"])
        total = self.reference["count"]
        out = {}
        for key in COUNTS:
            array = stored[key]
            if array.ndim != 1 or array.dtype.kind not in "iu" or array.dtype.itemsize > 8 or len(array) != total:
                raise UserError(
                    f"{url}: array {key!r} holds {array.dtype} {array.shape} where schema.json names {total:,} "
                    f"shards' whole numbers; {fix}"
                )
            if (array.dtype == np.uint64 and len(array) and array.max() > np.iinfo(np.int64).max) or (array < 0).any():
                raise UserError(f"{url}: array {key!r} holds a negative count; {fix}")
            array = array.astype(np.int64)
            array.flags.writeable = False
            out[key] = array
        for split, generations in self.rules.items():
            start = self._starts[split]
            for rule in generations:
                part = slice(start, start + rule.shards)
                for key in COUNTS:
                    summed = int(out[key][part].sum())
                    if summed != getattr(rule, key):
                        raise UserError(
                            f"{url}: split {split!r} generation {rule.generation}: its shards' {key} add up to "
                            f"{summed:,}, but schema.json says {getattr(rule, key):,}; {fix}"
                        )
                start += rule.shards
        return out

    def locate(self, split: str, number: int) -> tuple[Generation, int]:
        """The rule of a split's shard ``number`` (counted across generations) and its number within it."""
        for rule in self.rules[split]:
            if number < rule.shards:
                return rule, number
            number -= rule.shards
        raise IndexError(number)


def _narrow(values: np.ndarray) -> np.ndarray:
    """Counts as 4-byte little-endian words where every one fits (nearly always), else 8-byte ones."""
    fits = not len(values) or (int(values.min()) >= 0 and int(values.max()) < 2**32)
    return values.astype("<u4" if fits else "<i8")


class ShardList(Sequence[Shard]):
    """One split's shards as a sequence of Shard, made as they are asked for from its table (see ShardTable).

    ``len`` and the totals come from schema.json; a shard's counts read the sidecar (once). Code that needs a
    count of every shard takes it as an array (``counts``) rather than making millions of Shard objects.
    """

    def __init__(self, table: ShardTable, split: str):
        self.table = table
        self.split = split
        self._start = table._starts[split]
        self._len = table.shard_count(split)

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, item):
        if isinstance(item, slice):
            return tuple(self[i] for i in range(*item.indices(self._len)))
        number = item + self._len if item < 0 else item
        if not 0 <= number < self._len:
            raise IndexError(item)
        rule, within = self.table.locate(self.split, number)
        counts = self.table.counts()
        name = rule.file(self.split, within)
        at = self._start + number
        records, examples, size = (int(counts[key][at]) for key in COUNTS)
        return Shard(name, records, size, examples, index_name(name) if rule.index else None, rule.generation)

    def __iter__(self) -> Iterator[Shard]:
        counts = self.table.counts()
        at = self._start
        for rule in self.table.rules[self.split]:
            for within in range(rule.shards):
                name = rule.file(self.split, within)
                records, examples, size = (int(counts[key][at]) for key in COUNTS)
                yield Shard(name, records, size, examples, index_name(name) if rule.index else None, rule.generation)
                at += 1

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ShardList) and other.table.reference == self.table.reference:
            return other.split == self.split
        return isinstance(other, Sequence) and len(other) == len(self) and all(a == b for a, b in zip(self, other))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"ShardList({self.split!r}, {self._len} shards)"

    def files(self) -> Iterator[str]:
        """The shards' file names, in order (the sidecar is not read)."""
        for rule in self.table.rules[self.split]:
            for within in range(rule.shards):
                yield rule.file(self.split, within)

    def counts(self, key: str) -> np.ndarray:
        """Every shard's ``records``, ``examples`` or ``bytes`` (int64, read-only), read from the sidecar once."""
        return self.table.counts()[key][self._start : self._start + self._len]


def shard_counts(shards: Sequence[Shard], key: str) -> np.ndarray:
    """Every shard's ``records``, ``examples`` or ``bytes`` as an int64 array, from a table where it has one."""
    if isinstance(shards, ShardList):
        return shards.counts(key)
    return np.fromiter((getattr(shard, key) for shard in shards), dtype=np.int64, count=len(shards))


def listed_files(splits: Mapping[str, Sequence[Shard]]) -> set[str]:
    """Every shard's file and record index, by name (by rule without reading the sidecar)."""
    names = set()
    for shards in splits.values():
        if isinstance(shards, ShardList):
            for rule in shards.table.rules[shards.split]:
                files = [rule.file(shards.split, number) for number in range(rule.shards)]
                names.update(files)
                if rule.index:
                    names.update(index_name(name) for name in files)
        else:
            names.update(name for shard in shards for name in (shard.file, shard.index) if name)
    return names


def generation_totals(splits: Mapping[str, Sequence[Shard]], generation: int) -> dict[str, int]:
    """A generation's ``shards``, ``records``, ``examples`` and ``bytes`` in all splits (by rule: no sidecar read)."""
    totals = dict.fromkeys(("shards", *COUNTS), 0)
    for shards in splits.values():
        if isinstance(shards, ShardList):
            for rule in shards.table.rules[shards.split]:
                if rule.generation == generation:
                    totals["shards"] += rule.shards
                    for key in COUNTS:
                        totals[key] += getattr(rule, key)
            continue
        for shard in shards:
            if shard.generation == generation:
                totals["shards"] += 1
                for key in COUNTS:
                    totals[key] += getattr(shard, key)
    return totals
