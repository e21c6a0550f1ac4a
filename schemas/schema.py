"""The dataset schema: each feature's name, dtype, shape, dims and provenance, and its JSON form."""

from __future__ import annotations

import dataclasses
import json
import math
import posixpath
import re
from collections.abc import Sequence
from typing import Any, Literal

from schemas.errors import UserError

FORMAT = "xarray-tfrecords/1"
SCHEMA_FILE = "schema.json"
STATS_FILE = "stats.json"
PARSER_FILE = "parser.py"
#: The values of the grid's large entries (schemas.grid_file), where the grid has any.
GRID_FILE = "grid.npz"

#: What a tf.train.Example can hold; every feature is stored as one of these.
RecordDtype = Literal["float32", "int64"]
#: variable: a data variable's values; index: a sample's start index along a dim of the
#: virtual dataset; coord: the coordinate values the sample covers along that dim; aux_coord:
#: another coordinate of the files (config ``coords``, e.g. a curvilinear grid's 2-D lat) at
#: the sample's points; count: how many samples a packed record holds; mask: 1 where a variable
#: (or stack) of the same shape, named in ``source["of"]``, was NaN and filled, else 0 (config nan_mask);
#: time_feature: the sin or cos of a step's progress through its year or day (config sample.time_features).
FeatureRole = Literal["variable", "index", "coord", "aux_coord", "count", "mask", "time_feature"]
#: The most values one record can hold: a tf.train.Example is a protocol buffer, under 2 GiB, so this many
#: 4-byte values at most; a schema.json saying more is damaged (and would make readers allocate without end).
MAX_RECORD_VALUES = 2**31 // 4


class SchemaError(ValueError):
    """A schema (schema.json's JSON) that is malformed: the message names the entry and what is wrong with it.

    ``schemas.metadata.load_schema`` adds the file and the fix.
    """


def _expect(value: Any, kind: type, where: str, what: str) -> Any:
    """``value`` if it is a ``kind`` (a bool is no int), else SchemaError naming the entry ``where``."""
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise SchemaError(f"{where}: {_shown(value)} is not {what}")
    return value


def _count(value: Any, where: str) -> int:
    """``value`` if it is a whole number of 0 or more (a record count, a size), else SchemaError."""
    if _expect(value, int, where, "a whole number") < 0:
        raise SchemaError(f"{where}: {value} is negative")
    return value


def _shown(value: Any) -> str:
    """A value for a one-line message: short however big a damaged schema.json makes it."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def plain_file_name(name: Any) -> bool:
    """True for the name of a file directly in the output folder: no folder, no ``..``, not absolute.

    Readers join the names schema.json lists to the output's path: any other name would read
    another output's shards, or any file on the machine, as this output's.
    """
    return (
        isinstance(name, str)
        and name not in ("", ".", "..")
        and not any(character in name for character in "/\\\0")
        and not posixpath.isabs(name)
    )


def _file_name(value: Any, where: str) -> str:
    if not plain_file_name(value):
        raise SchemaError(f"{where}: {_shown(value)} is not the name of a file in the output's folder")
    return value


#: The count feature of packed records ("/" cannot occur in a NetCDF variable name, so no clash).
RECORD_COUNT = "record/count"


@dataclasses.dataclass(frozen=True)
class Feature:
    """One feature of every record: fixed dtype and shape, named dims, where it came from."""

    name: str
    dtype: RecordDtype
    shape: tuple[int, ...]
    dims: tuple[str, ...]
    role: FeatureRole
    #: provenance: the source variable or coordinate, its dtype in the files, its attrs
    source: dict[str, Any] = dataclasses.field(default_factory=dict, compare=False)

    def __post_init__(self):
        if self.dtype not in ("float32", "int64"):
            raise SchemaError(f"feature {self.name!r}: dtype {self.dtype!r} is not float32 or int64")
        if len(self.shape) != len(self.dims):
            raise SchemaError(f"feature {self.name!r}: shape {self.shape} does not match dims {self.dims}")

    @property
    def size(self) -> int:
        """Number of values in one sample of this feature."""
        return math.prod(self.shape)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "dtype": self.dtype,
            "shape": list(self.shape),
            "dims": list(self.dims),
            "role": self.role,
            "source": self.source,
        }

    @classmethod
    def from_json(cls, obj: dict[str, Any], where: str = "feature") -> Feature:
        """The feature ``obj`` describes, its types and sizes checked (SchemaError names ``where``)."""
        _expect(obj, dict, where, "an object")
        for key in ("name", "dtype", "role"):
            _expect(obj.get(key), str, f"{where}.{key}", "a string")
        shape = _expect(obj.get("shape"), list, f"{where}.shape", "a list")
        for size in shape:
            _count(size, f"{where}.shape")
        dims = _expect(obj.get("dims"), list, f"{where}.dims", "a list")
        for dim in dims:
            _expect(dim, str, f"{where}.dims", "a list of strings")
        if math.prod(shape) > MAX_RECORD_VALUES:
            raise SchemaError(f"{where}.shape: {shape} is {math.prod(shape):,} values, more than a record can hold")
        return cls(
            name=obj["name"],
            dtype=obj["dtype"],
            shape=tuple(shape),
            dims=tuple(dims),
            role=obj["role"],
            source=_expect(obj.get("source", {}), dict, f"{where}.source", "an object"),
        )


SHARD_GLOB = "*-[0-9][0-9][0-9][0-9][0-9]-of-[0-9][0-9][0-9][0-9][0-9].tfrecord*"


def shard_name(split: str, index: int, count: int, compression: str | None = None, generation: int = 0) -> str:
    """File name of shard ``index`` of ``count`` in a split, e.g. train-00003-of-00016.tfrecord.gz.

    Shards an append adds (``generation`` 1, 2, ...) say so, so that no name repeats across generations:
    train-g001-00000-of-00002.tfrecord.
    """
    marked = f"{split}-g{generation:03d}" if generation else split
    return f"{marked}-{index:05d}-of-{count:05d}.tfrecord" + (".gz" if compression == "gzip" else "")


#: The generation a shard name states (shard_name); none stated: generation 0.
_GENERATION_IN_NAME = re.compile(r"-g(\d{3,})-\d{5}-of-\d{5}\.tfrecord")


def generation_of_name(name: str) -> int:
    """The generation a shard file's name (or its index's, or a temporary's) states (0 where it states none)."""
    found = _GENERATION_IN_NAME.search(name)
    return int(found.group(1)) if found else 0


def default_split(names: Sequence[str]) -> str:
    """The split to show or normalise with when none is named: train if there is one, else the first."""
    return "train" if "train" in names else names[0]


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
        """The shard ``obj`` describes, its names and counts checked (SchemaError names ``where``)."""
        _expect(obj, dict, where, "an object")
        fields = {field.name for field in dataclasses.fields(cls)}
        unknown = sorted(set(obj) - fields)
        if unknown:
            raise SchemaError(f"{where}: unknown key {unknown[0]!r}")
        _file_name(obj.get("file"), f"{where}.file")
        if obj.get("index") is not None:
            _file_name(obj["index"], f"{where}.index")
        for key in ("records", "bytes"):
            _count(obj.get(key), f"{where}.{key}")
        for key in ("examples", "generation"):
            if obj.get(key) is not None:
                _count(obj[key], f"{where}.{key}")
        return cls(**obj)


@dataclasses.dataclass(frozen=True)
class Schema:
    """Everything a reader needs: features, the shard files per split and how they were made.

    ``splits`` is empty until the shards are written; the ``schema.json`` that holds it is the
    output's commit marker, written last.
    """

    features: tuple[Feature, ...]
    splits: dict[str, tuple[Shard, ...]] = dataclasses.field(default_factory=dict)
    compression: str | None = None
    #: samples packed into one record; above 1, every feature is stored with a leading axis of
    #: this length and RECORD_COUNT says how many of those rows are real (the last record of a
    #: shard may be partly empty)
    examples_per_record: int = 1
    #: how samples were cut: the dims and their roles, the grid of sample positions
    sample: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: coordinate values of the dims kept whole in every sample
    coords: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: the files' scalar coordinates (a height of 2 m): each one's name, value, dtype and attrs
    scalar_coords: tuple[dict[str, Any], ...] = ()
    #: every sample dim's coordinate on the selected grid, exactly (schemas.grid): what reassembly puts back
    grid: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: the input: globs, file count, bytes, a fingerprint of every file's path, size and range
    #: along the concat dim, a few of those files, and the static files
    sources: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: counts beyond the per-split record counts (samples cut, dropped)
    counts: dict[str, int] = dataclasses.field(default_factory=dict)
    seed: int = 0
    config: dict[str, Any] = dataclasses.field(default_factory=dict)
    created_by: str = ""
    #: the output's folder it was loaded from (schemas.load_schema; not in schema.json): where the grid's sidecar is
    location: str = dataclasses.field(default="", compare=False, repr=False)

    def record_features(self) -> tuple[Feature, ...]:
        """The features as a record stores them (packed records add a leading axis and a count)."""
        n = self.examples_per_record
        if n == 1:
            return self.features
        packed = tuple(dataclasses.replace(f, shape=(n, *f.shape), dims=("example", *f.dims)) for f in self.features)
        return (*packed, Feature(RECORD_COUNT, "int64", (), (), "count"))

    def feature(self, name: str) -> Feature:
        for feature in self.features:
            if feature.name == name:
                return feature
        raise KeyError(name)

    @property
    def variable_features(self) -> tuple[Feature, ...]:
        return tuple(f for f in self.features if f.role == "variable")

    def check_has_samples(self, split: str, where: str) -> None:
        """UserError for a split that holds no sample yet (its range lies beyond the input's steps): reading it
        would give an evaluation or an epoch of nothing, whose metrics look like results."""
        if self.splits.get(split, ()) or split not in self.splits:
            return
        described = self.sample.get("splits", {}).get(split) if isinstance(self.sample, dict) else None
        reason = described.get("no_data_yet") if isinstance(described, dict) else None
        why = f" ({reason})" if isinstance(reason, str) else ""
        raise UserError(
            f"{where}: split {split!r} holds no samples yet{why}; --append the data that reaches it, "
            f"or read another split (schema.num_examples({split!r}) is 0)"
        )

    def num_records(self, split: str | None = None) -> int:
        """TFRecord records in one split or all (fewer than samples when samples are packed)."""
        splits = [split] if split else list(self.splits)
        return sum(shard.records for name in splits for shard in self.splits[name])

    def num_examples(self, split: str | None = None) -> int:
        """Samples in one split or all."""
        splits = [split] if split else list(self.splits)
        return sum(shard.examples for name in splits for shard in self.splits[name])

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "created_by": self.created_by,
            "features": [f.to_json() for f in self.features],
            "splits": {
                name: {
                    "examples": sum(s.examples for s in shards),
                    "records": sum(s.records for s in shards),
                    "shards": [dataclasses.asdict(s) for s in shards],
                }
                for name, shards in self.splits.items()
            },
            "num_examples": self.num_examples() if self.splits else 0,
            "compression": self.compression,
            "examples_per_record": self.examples_per_record,
            "seed": self.seed,
            "counts": self.counts,
            "sample": self.sample,
            "coords": self.coords,
            "scalar_coords": list(self.scalar_coords),
            "grid": self.grid,
            "sources": self.sources,
            "config": self.config,
        }

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=2, allow_nan=False) + "\n"

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Schema:
        """The schema ``obj`` (schema.json's JSON) describes; SchemaError (naming the entry) where it is malformed.

        The types and ranges are checked here, where every reader loads it, so that a damaged schema.json is
        one line naming what is wrong rather than a TypeError deep in a reader.
        """
        _expect(obj, dict, "schema", "an object")
        if obj.get("format") != FORMAT:
            raise SchemaError(f"not an {FORMAT} schema (format: {_shown(obj.get('format'))})")
        features = _expect(obj.get("features"), list, "features", "a list")
        per_record = _count(obj.get("examples_per_record", 1), "examples_per_record")
        if not 1 <= per_record <= MAX_RECORD_VALUES:
            raise SchemaError(f"examples_per_record: {per_record} is not between 1 and {MAX_RECORD_VALUES}")
        parsed = tuple(Feature.from_json(f, f"features[{i}]") for i, f in enumerate(features))
        for feature in parsed:
            if feature.size * per_record > MAX_RECORD_VALUES:
                raise SchemaError(f"features: {feature.name!r} packed {per_record} to a record is more than one holds")
        compression = obj.get("compression")
        if compression is not None:
            _expect(compression, str, "compression", "a string or null")
        fields = {key: _expect(obj.get(key, {}), dict, key, "an object") for key in _OBJECT_KEYS}
        _check_grid_references(fields["grid"])
        return cls(
            features=parsed,
            splits=_splits_from_json(_expect(obj.get("splits", {}), dict, "splits", "an object")),
            compression=compression,
            examples_per_record=per_record,
            scalar_coords=tuple(_expect(obj.get("scalar_coords", []), list, "scalar_coords", "a list")),
            seed=_expect(obj.get("seed", 0), int, "seed", "a whole number"),
            created_by=_expect(obj.get("created_by", ""), str, "created_by", "a string"),
            **fields,
        )

    @classmethod
    def loads(cls, text: str) -> Schema:
        """The schema in schema.json's text; SchemaError where it is not JSON, too deeply nested, or malformed."""
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as error:
            raise SchemaError(f"not JSON ({error})") from None
        except RecursionError:  # a nest of thousands of [ or {: no schema is nested more than a few levels
            raise SchemaError("JSON nested too deeply to be a schema") from None
        return cls.from_json(obj)


#: The schema's entries that are JSON objects, held as dicts.
_OBJECT_KEYS = ("sample", "coords", "grid", "sources", "counts", "config")


def _check_grid_references(grid: dict[str, Any]) -> None:
    """SchemaError for a grid entry whose values are in a file (schemas.grid_file) named other than as a file of the
    output's folder, or described incompletely: readers join the name to the output's path."""
    for name, entry in grid.items():
        for key in ("values", "seconds"):
            stored = entry.get(key) if isinstance(entry, dict) else None
            if not (isinstance(stored, dict) and "file" in stored):
                continue
            where = f"grid[{name!r}].{key}"
            _file_name(stored["file"], f"{where}.file")
            _expect(stored.get("array"), str, f"{where}.array", "a string")
            _count(stored.get("count"), f"{where}.count")
            digest = stored.get("sha256")
            if not (isinstance(digest, str) and re.fullmatch(r"[0-9a-f]{64}", digest)):
                raise SchemaError(f"{where}.sha256: {_shown(digest)} is not a sha256 in hex")


def _splits_from_json(splits: dict[str, Any]) -> dict[str, tuple[Shard, ...]]:
    """Each split's shards; its ``records`` and ``examples`` totals, where stated, checked to be counts."""
    out = {}
    for name, split in splits.items():
        where = f"splits.{name}"
        _expect(split, dict, where, "an object")
        for key in ("records", "examples"):
            if key in split:
                _count(split[key], f"{where}.{key}")
        shards = _expect(split.get("shards"), list, f"{where}.shards", "a list")
        out[name] = tuple(Shard.from_json(shard, f"{where}.shards[{i}]") for i, shard in enumerate(shards))
    return out
