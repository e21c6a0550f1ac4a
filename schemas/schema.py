"""The dataset schema: each feature's name, dtype, shape, dims and provenance, and its JSON form."""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Sequence
from typing import Any, Literal

from schemas.errors import UserError
from schemas.schema_checks import SchemaError as SchemaError
from schemas.schema_checks import count as _count
from schemas.schema_checks import expect as _expect
from schemas.schema_checks import file_name as _file_name
from schemas.schema_checks import plain_file_name as plain_file_name
from schemas.schema_checks import shown as _shown
from schemas.shards import SHARDS_FILE as SHARDS_FILE
from schemas.shards import Shard, ShardList, ShardTable
from schemas.shards import shard_name as shard_name

#: schema.json's format: its splits describe their shards by a naming rule, their counts in shards.npz
#: (schemas.shards). Readers read the first too, whose splits list every shard.
FORMAT = "xarray-tfrecords/2"
FORMAT_LISTED = "xarray-tfrecords/1"
FORMATS = (FORMAT, FORMAT_LISTED)
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


def default_split(names: Sequence[str]) -> str:
    """The split to show or normalise with when none is named: train if there is one, else the first."""
    return "train" if "train" in names else names[0]


@dataclasses.dataclass(frozen=True)
class Schema:
    """Everything a reader needs: features, the shard files per split and how they were made.

    ``splits`` is empty until the shards are written; the ``schema.json`` that holds it is the
    output's commit marker, written last.
    """

    features: tuple[Feature, ...]
    #: per split its shards in order: a tuple, or a ShardList (schemas.shards) whose counts are read when asked
    splits: dict[str, Sequence[Shard]] = dataclasses.field(default_factory=dict)
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

    def __post_init__(self):
        # Loaded lazily, the shards' counts are read from the folder the schema was loaded from.
        table = self._loaded_table()
        if table is not None and self.location and table.folder != self.location:
            bound = table.bound(self.location)
            object.__setattr__(self, "splits", {name: bound.split(name) for name in self.splits})

    def _loaded_table(self) -> ShardTable | None:
        """The table every split is a view of, where they all are of one (a loaded schema's), else None."""
        tables = {id(s.table): s.table for s in self.splits.values() if isinstance(s, ShardList)}
        if len(tables) != 1 or not all(isinstance(s, ShardList) for s in self.splits.values()):
            return None
        return next(iter(tables.values()))

    @property
    def shard_table(self) -> ShardTable | None:
        """The splits' shards by rule and their counts (schemas.shards), where they are held so; None where they are
        listed one by one (schema.json's first format, or a schema made of Shard objects: see by_rule)."""
        return self._loaded_table()

    def by_rule(self) -> Schema:
        """This schema with its shards held by rule (schema.json's second format) where every one follows the
        naming rule, as every build of this tool names them; else itself."""
        table = self.shard_table or ShardTable.from_shards(self.splits)
        if table is None or table is self.shard_table:
            return self
        return dataclasses.replace(self, splits={name: table.split(name) for name in self.splits})

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
        return sum(_total(self.splits[name], "records") for name in ([split] if split else self.splits))

    def num_examples(self, split: str | None = None) -> int:
        """Samples in one split or all."""
        return sum(_total(self.splits[name], "examples") for name in ([split] if split else self.splits))

    def to_json(self, listed: bool = False) -> dict[str, Any]:
        """schema.json's JSON: its shards by rule (FORMAT) where they follow it, else, or with ``listed``, every shard
        listed (FORMAT_LISTED, as outputs of earlier versions hold it)."""
        table = None if listed else self.shard_table
        if table is not None:
            splits, shards = table.to_json()
            described = {"format": FORMAT, "splits": splits, "shards": shards}
        else:
            described = {"format": FORMAT_LISTED, "splits": _listed_json(self.splits)}
        return {
            "format": described["format"],
            "created_by": self.created_by,
            "features": [f.to_json() for f in self.features],
            "splits": described["splits"],
            **({"shards": described["shards"]} if "shards" in described else {}),
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

    def dumps(self, listed: bool = False) -> str:
        return json.dumps(self.to_json(listed), indent=2, allow_nan=False) + "\n"

    def files(self) -> dict[str, bytes]:
        """The files that hold this schema: schema.json and, in its second format, the shards' sidecar."""
        out = {SCHEMA_FILE: self.dumps().encode()}
        if self.shard_table is not None:
            out[self.shard_table.reference["file"]] = self.shard_table.data()
        return out

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Schema:
        """The schema ``obj`` (schema.json's JSON) describes; SchemaError (naming the entry) where it is malformed.

        The types and ranges are checked here, where every reader loads it, so that a damaged schema.json is
        one line naming what is wrong rather than a TypeError deep in a reader.
        """
        _expect(obj, dict, "schema", "an object")
        if obj.get("format") not in FORMATS:
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
            splits=_splits_from_json(obj),
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


def _total(shards: Sequence[Shard], key: str) -> int:
    """A split's total ``records`` or ``examples``: schema.json's where loaded by rule (no sidecar read)."""
    if isinstance(shards, ShardList):
        return shards.table.total(shards.split, key)
    return sum(getattr(shard, key) for shard in shards)


def _listed_json(splits: dict[str, Sequence[Shard]]) -> dict[str, Any]:
    """schema.json's splits in its first format: every shard listed."""
    return {
        name: {
            "examples": _total(shards, "examples"),
            "records": _total(shards, "records"),
            "shards": [dataclasses.asdict(s) for s in shards],
        }
        for name, shards in splits.items()
    }


def _splits_from_json(obj: dict[str, Any]) -> dict[str, Sequence[Shard]]:
    """Each split's shards: by rule (a ShardList: the sidecar is not read), or listed in the first format."""
    splits = _expect(obj.get("splits", {}), dict, "splits", "an object")
    if obj["format"] == FORMAT:
        table = ShardTable.from_json(splits, obj.get("shards"))
        return {name: table.split(name) for name in splits}
    return _listed_from_json(splits)


def _listed_from_json(splits: dict[str, Any]) -> dict[str, tuple[Shard, ...]]:
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
