"""The dataset schema: each feature's name, dtype, shape, dims and provenance, and its JSON form."""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Sequence
from typing import Any, Literal

FORMAT = "xarray-tfrecords/1"
SCHEMA_FILE = "schema.json"
STATS_FILE = "stats.json"
PARSER_FILE = "parser.py"

#: What a tf.train.Example can hold; every feature is stored as one of these.
RecordDtype = Literal["float32", "int64"]
#: variable: a data variable's values; index: a sample's start index along a dim of the
#: virtual dataset; coord: the coordinate values the sample covers along that dim; aux_coord:
#: another coordinate of the files (config ``coords``, e.g. a curvilinear grid's 2-D lat) at
#: the sample's points; count: how many samples a packed record holds; mask: 1 where a variable
#: (or stack) of the same shape, named in ``source["of"]``, was NaN and filled, else 0 (config nan_mask);
#: time_feature: the sin or cos of a step's progress through its year or day (config sample.time_features).
FeatureRole = Literal["variable", "index", "coord", "aux_coord", "count", "mask", "time_feature"]
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
            raise ValueError(f"feature {self.name!r}: dtype {self.dtype!r} is not float32 or int64")
        if len(self.shape) != len(self.dims):
            raise ValueError(f"feature {self.name!r}: shape {self.shape} does not match dims {self.dims}")

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
    def from_json(cls, obj: dict[str, Any]) -> Feature:
        return cls(
            name=obj["name"],
            dtype=obj["dtype"],
            shape=tuple(obj["shape"]),
            dims=tuple(obj["dims"]),
            role=obj["role"],
            source=obj.get("source", {}),
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
        if obj.get("format") != FORMAT:
            raise ValueError(f"not an {FORMAT} schema (format: {obj.get('format')!r})")
        return cls(
            features=tuple(Feature.from_json(f) for f in obj["features"]),
            splits={name: tuple(Shard(**s) for s in split["shards"]) for name, split in obj.get("splits", {}).items()},
            compression=obj.get("compression"),
            examples_per_record=obj.get("examples_per_record", 1),
            sample=obj.get("sample", {}),
            coords=obj.get("coords", {}),
            scalar_coords=tuple(obj.get("scalar_coords", [])),
            grid=obj.get("grid", {}),
            sources=obj.get("sources", {}),
            counts=obj.get("counts", {}),
            seed=obj.get("seed", 0),
            config=obj.get("config", {}),
            created_by=obj.get("created_by", ""),
        )

    @classmethod
    def loads(cls, text: str) -> Schema:
        return cls.from_json(json.loads(text))
