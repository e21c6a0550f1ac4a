"""The build configuration's model: every key, its default and its checks (pydantic; loaded by .loading)."""

from __future__ import annotations

import datetime
import os
from typing import Any, Literal

import pydantic
from pydantic import Field, PositiveInt, field_validator, model_validator

from planning.inputs.input_config import InputConfig, _Strict
from schemas.urls import is_remote

#: Shards stay well under 1 GiB: readers and tools handle files of this size well
#: (tensorflow/datasets#10995). Planning sizes shards so none can exceed it; writers check it.
MAX_SHARD_MB = 512
MAX_SHARD_BYTES = int(MAX_SHARD_MB * 1e6)


class WindowConfig(_Strict):
    """A dim cut into windows of ``size`` steps, one every ``stride`` steps."""

    size: PositiveInt = Field(1, description="window length along the dim")
    stride: PositiveInt | None = Field(None, description="steps between window starts (default: size, no overlap)")

    @model_validator(mode="before")
    @classmethod
    def _size_shorthand(cls, value: Any) -> Any:
        return {"size": value} if isinstance(value, int) and not isinstance(value, bool) else value

    @property
    def step(self) -> int:
        return self.stride or self.size


#: Feature name prefixes the records already use: a sample role may not take one.
RESERVED_PREFIXES = ("index", "coord", "time_features", "mask", "record")


class RoleConfig(_Strict):
    """One group of a sample's variables (inputs, targets, forcings) with its own steps and crop."""

    variables: list[str] = Field(min_length=1, description="the role's variables, each written as <role>/<variable>")
    offsets: dict[str, list[int]] = Field(
        default_factory=dict,
        description="its steps along input.concat_dim relative to the sample's index, e.g. time: [-1, 0]; default [0]",
        json_schema_extra={"reference_type": "mapping: concat_dim → list of int"},
    )
    crop: dict[str, PositiveInt] = Field(
        default_factory=dict,
        description="a centred part of the sample's window along these dims, e.g. {lat: 8, lon: 8}",
        json_schema_extra={"reference_type": "mapping: dim → int"},
    )

    @field_validator("variables")
    @classmethod
    def _variables(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError(f"a variable is listed twice: {value}")
        return value

    @field_validator("offsets")
    @classmethod
    def _offsets(cls, value: dict[str, list[int]]) -> dict[str, list[int]]:
        for dim, steps in value.items():
            if not steps or len(set(steps)) != len(steps):
                raise ValueError(f"{dim}: give distinct offsets, e.g. [-1, 0]; got {steps}")
        return value


class SampleConfig(_Strict):
    """What one sample is. Dims not named here are iterated: one sample per index, dim dropped."""

    window: dict[str, WindowConfig] = Field(
        default_factory=dict,
        description="dims cut into windows; `lat: 9` is short for {size: 9}",
        json_schema_extra={"reference_type": "mapping: dim → {size, stride}"},
    )
    offsets: dict[str, list[int]] = Field(
        default_factory=dict,
        description=(
            "steps along one dim taken together in one sample, relative to the sample's own index, so 0 "
            "must be one of them: time: [0, 1] is a step and the next, [-1, 0] the one before and it"
        ),
        json_schema_extra={"reference_type": "mapping: dim → list of int"},
    )
    keep: list[str] = Field(default_factory=list, description="dims kept whole in every sample")
    roles: dict[str, RoleConfig] = Field(
        default_factory=dict,
        description=(
            "groups of variables with their own steps along input.concat_dim and crops of the window, e.g. "
            "inputs: {variables: [t, z], offsets: {time: [-1, 0]}}, targets: {variables: [t], offsets: {time: "
            "[1]}, crop: {lat: 8, lon: 8}}; features are named <role>/<variable>; they name the variables"
        ),
        json_schema_extra={"reference_type": "mapping: role → {variables, offsets, crop}"},
    )
    time_features: list[Literal["year_progress", "day_progress", "cos_zenith"]] = Field(
        default_factory=list,
        description=(
            "each step's progress through its year and day as time_features/<name>_sin and _cos (GraphCast's "
            "definitions; year_progress of the step's own calendar year outside the Gregorian calendars; "
            "day_progress at the sample's own longitudes), e.g. "
            "[year_progress, day_progress]; cos_zenith: the cosine of the solar zenith angle per cell and step "
            "(time_features/cos_zenith; the sample must hold ranges of latitudes and longitudes)"
        ),
    )

    @field_validator("offsets")
    @classmethod
    def _offsets(cls, value: dict[str, list[int]]) -> dict[str, list[int]]:
        if len(value) > 1:
            raise ValueError(f"offsets are allowed along one dim only, got {sorted(value)}")
        for dim, steps in value.items():
            if not steps:
                raise ValueError(f"{dim}: give at least one offset, e.g. [0, 1]")
            if len(set(steps)) != len(steps):
                raise ValueError(f"{dim}: offsets {steps} repeat a step")
            if 0 not in steps:
                # Without 0 the same samples come out as with the offsets shifted to start at 0; a
                # list like [14, 16] is almost always meant as two fixed levels, which select takes.
                raise ValueError(
                    f"{dim}: offsets {steps} do not include 0; they are steps relative to each sample's "
                    f"own index (time: [0, 1] is a step and the next), not fixed indices: for pairs "
                    f"{max(steps) - min(steps)} apart write {sorted(s - min(steps) for s in steps)}; to take "
                    f"only some {dim} values, use select: {{{dim}: [values]}} with sample.keep: [{dim}]"
                )
        return value

    @field_validator("time_features")
    @classmethod
    def _time_features(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError(f"time_features lists a feature twice: {value}")
        return value

    @model_validator(mode="after")
    def _roles_disjoint(self) -> SampleConfig:
        roles = {"window": set(self.window), "offsets": set(self.offsets), "keep": set(self.keep)}
        if len(self.keep) != len(roles["keep"]):
            raise ValueError(f"keep lists a dim twice: {self.keep}")
        names = list(roles)
        for i, a in enumerate(names):
            for b in names[i + 1 :]:
                both = roles[a] & roles[b]
                if both:
                    raise ValueError(f"dim {sorted(both)[0]!r} is in both sample.{a} and sample.{b}; give it one role")
        return self._with_roles_steps() if self.roles else self

    def _with_roles_steps(self) -> SampleConfig:
        """Roles checked; their steps joined into the sample's offsets (each role takes its own of them)."""
        for name, role in self.roles.items():
            if not name.isidentifier() or name in RESERVED_PREFIXES:
                raise ValueError(
                    f"roles: {name!r} cannot name a role (a plain name, not one of {', '.join(RESERVED_PREFIXES)}): "
                    "it prefixes the role's features"
                )
            for dim, size in role.crop.items():
                if dim not in self.window:
                    raise ValueError(f"roles.{name}.crop.{dim}: only a window can be cropped; {dim!r} is not in window")
                if size > self.window[dim].size:
                    raise ValueError(
                        f"roles.{name}.crop.{dim}: {size} is larger than the window ({self.window[dim].size})"
                    )
        dims = {dim for role in self.roles.values() for dim in role.offsets}
        if len(dims) > 1:
            raise ValueError(f"roles: offsets along one dim only (the concat dim), got {sorted(dims)}")
        if dims and self.offsets:
            raise ValueError("offsets: with roles, each role gives its own offsets; remove sample.offsets")
        if dims:
            dim = dims.pop()
            steps = sorted({step for role in self.roles.values() for step in role.offsets.get(dim, [0])})
            if 0 not in steps:
                raise ValueError(
                    f"roles: no role takes offset 0 along {dim!r} (the step a sample's index/{dim} names): "
                    f"shift every role's offsets so that one takes 0, e.g. by {-steps[0]}"
                )
            # Frozen models: set once, here, while the model is being made (as pydantic's own defaults are).
            object.__setattr__(self, "offsets", {dim: steps})
        return self


class ShuffleConfig(_Strict):
    seed: int = Field(
        0,
        ge=0,
        lt=2**64,
        description="same seed and inputs give byte-identical shards; another seed, another order (0 to 2**64 - 1)",
    )
    mode: Literal["write", "read"] = Field(
        "write",
        description=(
            "write: every sample is shuffled into the shards as they are written, so a sequential tf.data read "
            "is in a full random order (the output's bytes go through a sort, and on workers that share no "
            "filesystem through spill objects); read: no shuffle at write, each shard holds a run of consecutive "
            "units in archive order, written once, and readers take a fresh global order each epoch through the "
            "shards' indexes (load_dataset(..., epoch=e), shuffled_stream, open_source, epoch_order); not with "
            "output.compression or output.examples_per_record above 1"
        ),
    )


class StackConfig(_Strict):
    """Several variables written as one feature with a channel axis."""

    name: str = Field(description="the stacked feature's name")
    variables: list[str] = Field(min_length=1, description="the variables, in channel order")
    axis: Literal[0, -1] = Field(-1, description="-1: channels last (TensorFlow/Keras); 0: channels first (PyTorch)")

    @field_validator("variables")
    @classmethod
    def _distinct(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError(f"a variable is stacked twice: {value}")
        return value


class LayoutConfig(_Strict):
    stack: list[StackConfig] = Field(default_factory=list, description="stacked features (one mapping or a list)")

    @field_validator("stack", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        return [value] if isinstance(value, dict) else value

    @model_validator(mode="after")
    def _no_overlap(self) -> LayoutConfig:
        seen: dict[str, str] = {}
        for stack in self.stack:
            for name in stack.variables:
                if name in seen:
                    raise ValueError(f"variable {name!r} is in stacks {seen[name]!r} and {stack.name!r}; stack it once")
                seen[name] = stack.name
        return self


class StatsConfig(_Strict):
    per: list[str] = Field(
        default_factory=list, description="kept dims to compute statistics per index of, e.g. [level]"
    )
    reference_split: str | None = Field(
        None, description="split whose statistics normalise (default: train if there is one, else the first split)"
    )
    over: Literal["samples", "field"] = Field(
        "samples",
        description=(
            "what each variable's statistics count: samples, the values the records store, each once per written "
            "sample holding it (overlapping windows weigh a cell by the samples holding it; with sample.roles, the "
            "cells its role features store); field, every grid point and step of each split's selected region "
            "once, whatever the samples (as GraphCast and anemoi normalise)"
        ),
    )
    tendency: bool = Field(
        False,
        description=(
            "also the statistics of the one-step differences x(t+1) - x(t) along input.concat_dim over the "
            "reference split's consecutive regular steps (every cell of the selected region), in stats.json's "
            '`tendency`, for residual models (load_dataset(..., normalize="tendency"))'
        ),
    )


class OutputConfig(_Strict):
    path: str = Field(description="output directory (local path or gs:// URL)")
    num_shards: PositiveInt | None = Field(
        None, description="shards per split; default: enough for about target_shard_mb each"
    )
    target_shard_mb: float = Field(
        256.0,
        gt=0,
        le=MAX_SHARD_MB,
        description=(
            "shard size to aim for when num_shards is not set (records counted at their largest: int64 values "
            "at 10 bytes, so shards of int64-heavy records come out smaller)"
        ),
    )
    allow_float32_overflow: bool = Field(
        False,
        description="store float64 values beyond float32's range as +-inf (counted in stats.json) instead of failing",
    )
    dtype: str = Field("float32", description="float storage type: tf.train.Example holds float32 only")
    compression: Literal["gzip"] | None = Field(None, description="gzip: write .tfrecord.gz shards")
    examples_per_record: PositiveInt = Field(
        1, le=4096, description="samples packed into one record (each feature gains a leading axis)"
    )
    in_place: bool = Field(
        True,
        description=(
            "write each record straight to its final offset in its shard when the build allows it (a local "
            "output the workers share: the local runner, or --shared_filesystem; no nan_policy: drop, packing, "
            "compression or integer variables); false: always go through bucket files. Same bytes either way"
        ),
    )

    @field_validator("path")
    @classmethod
    def _one_meaning(cls, value: str) -> str:
        # A file:// URL names a local directory: treat it as one (records can be written in place there).
        value = value.removeprefix("file://") or value
        try:
            value.encode("utf-8")  # a name given in bytes that are not UTF-8 arrives with them escaped as surrogates
        except UnicodeEncodeError as error:
            byte = ord(value[error.start]) & 0xFF
            raise ValueError(
                f"not UTF-8 (byte 0x{byte:02x} at character {error.start}), and schema.json and parser.py name the "
                "output in UTF-8; choose a name in UTF-8"
            ) from None
        if "::" in value:
            raise ValueError("'::' chains URLs in fsspec, so the output would be read back from another place")
        if any(c in value for c in "*?[]"):
            raise ValueError("*, ?, [ and ] are glob patterns to the filesystem layers; choose a path without them")
        return os.path.expanduser(value) if not is_remote(value) else value

    @field_validator("dtype")
    @classmethod
    def _float32_only(cls, value: str) -> str:
        if value != "float32":
            raise ValueError(
                f"tf.train.Example holds floats as float32 only, so {value} cannot be stored; "
                "remove the key (float32 is the default) and cast after loading if you need it"
            )
        return value


SplitRange = list[str | float | None]

#: A coordinate value in a config: a number, or a date or time (at any precision) as text.
CoordValue = str | float


def _dates_as_text(value: Any) -> Any:
    """YAML reads an unquoted 1890-01-01 as a date: a split bound or selected value is the text it was written as."""
    if isinstance(value, datetime.date):
        return value.isoformat()
    if isinstance(value, dict):
        return {key: _dates_as_text(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_dates_as_text(item) for item in value]
    return value


class SelectRange(_Strict):
    """An inclusive range of coordinate values along one dim; either bound may be left out."""

    min: CoordValue | None = Field(None, description="the smallest value taken (along time: a date at any precision)")
    max: CoordValue | None = Field(
        None,
        description=(
            "the largest value taken; on a longitude a max below min crosses the seam, e.g. {min: 350, max: 10}"
        ),
    )

    @field_validator("min", "max", mode="before")
    @classmethod
    def _dates(cls, value: Any) -> Any:
        return _dates_as_text(value)

    @model_validator(mode="after")
    def _a_bound(self) -> SelectRange:
        if self.min is None and self.max is None:
            raise ValueError("give min, max or both, e.g. {min: 30, max: 60}")
        return self


class BuildConfig(_Strict):
    """The whole build: input files, variables, sample geometry, splits, shuffle and output."""

    input: InputConfig
    variables: list[str] | None = Field(
        None,
        description=(
            "default: every data variable that has all the sample dims; list lower-dimensional or static "
            "variables (e.g. orography on lat, lon) explicitly to include them in every sample; with "
            "input.preprocess: among the variables it returns"
        ),
    )
    coords: list[str] = Field(
        default_factory=list,
        description=(
            "coordinates of the files that are not dim coordinates (2-D lat and lon of a curvilinear grid, "
            "auxiliary or scalar coordinates), carried in every record as coord/<name>, cut with the sample's "
            "window over their own dims, e.g. [lat, lon]; scalar coordinates are recorded in schema.json anyway"
        ),
    )
    select: dict[str, list[CoordValue] | SelectRange] = Field(
        default_factory=dict,
        json_schema_extra={"reference_type": "mapping: dim → list of values, or {min, max}"},
        description=(
            "the part of the input to read, by coordinate value along any dims: a list takes those values "
            "(each must exist), {min, max} an inclusive range (a longitude range may cross the seam), e.g. "
            "level: [500, 850], lat: {min: 30, max: 60}; samples are cut from the selection alone"
        ),
    )
    sample: SampleConfig = Field(default_factory=SampleConfig)
    splits: dict[str, dict[str, SplitRange]] | None = Field(
        None,
        json_schema_extra={"reference_type": "mapping: split name → {concat_dim: [start, end]}"},
        description=(
            'coordinate ranges along concat_dim, inclusive, e.g. train: {time: ["1979", "2015"]}, or along '
            "input.new_dim (every split along the same dim), e.g. test: {member: [31, 40]}; "
            "default: one split named data holding every sample"
        ),
    )
    nan_policy: Literal["keep", "drop", "fill"] = Field(
        "keep", description="samples with NaN (masked or _FillValue) values: keep them, drop them, or fill them"
    )
    fill_value: float | None = Field(None, description="the value NaN becomes with nan_policy: fill")
    nan_mask: bool | list[str] = Field(
        False,
        description=(
            "with nan_policy: fill, write beside every float variable or stack (true), or beside those "
            "listed, a feature mask/<name> (int64, 1 where the value was NaN and filled, else 0, one byte a "
            "value on disk); normalize=True then sets exactly the filled points after normalising"
        ),
    )
    stats: StatsConfig = Field(default_factory=StatsConfig)
    layout: LayoutConfig = Field(default_factory=LayoutConfig)
    shuffle: ShuffleConfig = Field(default_factory=ShuffleConfig)
    output: OutputConfig

    @model_validator(mode="after")
    def _consistent(self) -> BuildConfig:
        if self.nan_policy == "fill" and self.fill_value is None:
            raise ValueError("nan_policy: fill needs a fill_value, e.g. fill_value: 0.0")
        if self.nan_policy != "fill" and self.fill_value is not None:
            raise ValueError(f"fill_value is set but nan_policy is {self.nan_policy}: set nan_policy: fill, or drop it")
        if self.shuffle.mode == "read":
            self._check_read_shuffle()
        if self.nan_mask and self.nan_policy != "fill":
            raise ValueError(
                f"nan_mask marks the values nan_policy: fill filled, but nan_policy is {self.nan_policy}: "
                "set nan_policy: fill with a fill_value, or drop nan_mask"
            )
        along = self.input.split_dims
        for name, ranges in (self.splits or {}).items():
            if not name.isidentifier():
                raise ValueError(f"splits: {name!r} is not a plain name (letters, digits, _): it names the shard files")
            if len(ranges) != 1 or next(iter(ranges)) not in along:
                which = " or ".join(repr(d) for d in along)
                raise ValueError(
                    f"splits.{name}: give one range along {which} (input.concat_dim"
                    f"{', input.new_dim' if len(along) > 1 else ''}), e.g. {along[-1]}: [start, end]; "
                    f"got keys {list(ranges)}"
                )
            dim, bounds = next(iter(ranges.items()))
            if len(bounds) != 2:
                raise ValueError(f"splits.{name}.{dim}: give [start, end], got {bounds}")
        dims = {next(iter(ranges)) for ranges in (self.splits or {}).values()}
        if len(dims) > 1:
            raise ValueError(f"every split ranges along one dim: choose {' or '.join(sorted(dims))} for all of them")
        return self._roles_name_the_variables() if self.sample.roles else self

    def _check_read_shuffle(self) -> None:
        # Readers take their global order by record offsets (each shard's .tfindex), one sample a record.
        if self.output.compression:
            raise ValueError(
                "shuffle.mode: read needs each shard's record index for the readers' global order, and a gzip "
                "shard has none; drop output.compression, or use shuffle.mode: write"
            )
        if self.output.examples_per_record > 1:
            raise ValueError(
                "shuffle.mode: read needs one sample a record for the readers' global order (they read records by "
                "offset); drop output.examples_per_record, or use shuffle.mode: write"
            )

    def _roles_name_the_variables(self) -> BuildConfig:
        roles = self.sample.roles
        for name, role in roles.items():
            for dim in role.offsets:
                if dim != self.input.concat_dim:
                    raise ValueError(
                        f"sample.roles.{name}.offsets: {dim!r} is not input.concat_dim ({self.input.concat_dim!r}); "
                        "roles take their own steps along the concat dim only"
                    )
        named = list(dict.fromkeys(v for role in roles.values() for v in role.variables))
        if self.variables is not None and set(self.variables) != set(named):
            raise ValueError(
                f"variables: with sample.roles the roles name the variables ({', '.join(named)}); remove `variables:`"
            )
        object.__setattr__(self, "variables", named)  # frozen: set while the model is made
        return self

    @property
    def split_dim(self) -> str:
        """The dim the splits range along (input.concat_dim when there are none)."""
        return next(iter(next(iter(self.splits.values())))) if self.splits else self.input.concat_dim

    @field_validator("splits", mode="before")
    @classmethod
    def _dates_as_text(cls, value: Any) -> Any:
        return _dates_as_text(value)

    @field_validator("select", mode="before")
    @classmethod
    def _select_shorthand(cls, value: Any) -> Any:
        # `level: 500` is short for [500]; dates YAML read as dates are the text they were.
        if not isinstance(value, dict):
            return value
        out = {}
        for dim, wanted in value.items():
            if isinstance(wanted, list):
                wanted = [_dates_as_text(v) for v in wanted]
            elif isinstance(wanted, dict):
                # Validated here so that a mistake is reported against the range alone, not
                # against every form the union allows.
                try:
                    wanted = SelectRange.model_validate(wanted)
                except pydantic.ValidationError as error:
                    problems = format_validation_error(error, "").removeprefix(": ").replace("(top level): ", "")
                    raise ValueError(f"{dim}: {problems}") from None
            elif wanted is not None:
                wanted = [_dates_as_text(wanted)]
            out[dim] = wanted
        return out

    @field_validator("select")
    @classmethod
    def _select(cls, value: dict) -> dict:
        for dim, wanted in value.items():
            if isinstance(wanted, list):
                if not wanted:
                    raise ValueError(f"{dim}: an empty list selects nothing; give values or leave {dim} out")
                if len(set(wanted)) != len(wanted):
                    raise ValueError(f"{dim}: a value is listed twice: {wanted}")
        return value

    @field_validator("coords")
    @classmethod
    def _coords(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError(f"a coordinate is listed twice: {value}")
        return value

    @field_validator("variables")
    @classmethod
    def _variables(cls, value: list[str] | None) -> list[str] | None:
        if value is not None:
            if not value:
                raise ValueError("an empty list selects nothing; leave it out to take every variable")
            if len(set(value)) != len(value):
                raise ValueError(f"a variable is listed twice: {value}")
        return value


def _location(error: dict[str, Any]) -> str:
    return ".".join(str(part) for part in error["loc"]) or "(top level)"


def format_validation_error(error: pydantic.ValidationError, source: str) -> str:
    """One line per problem, each naming the key, what is wrong and the value given."""
    problems = []
    for item in error.errors():
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            message = "unknown key (check its spelling and the config reference, docs/reference/config.md)"
        elif item["type"] == "missing":
            message = "required key is missing"
        elif "input" in item and not isinstance(item["input"], dict):
            message += f" (got {item['input']!r})"
        problems.append(f"{_location(item)}: {message}")
    return f"{source}: " + "; ".join(problems)


def json_default(key: str) -> object:
    """The value a config key (dotted, as the JSON dump spells it) takes when it is not given, as JSON.

    None for a key the model does not have or that has no default. (An output built by an earlier
    version lacks the keys added since: those mean their defaults.)
    """
    model: type[pydantic.BaseModel] | None = BuildConfig
    value: object = None
    for part in key.split("."):
        if model is None:
            return None
        field = next((f for name, f in model.model_fields.items() if (f.alias or name) == part), None)
        if field is None:
            return None
        nested = field.annotation if isinstance(field.annotation, type) else None
        model = nested if nested is not None and issubclass(nested, pydantic.BaseModel) else None
        value = None if field.is_required() else field.get_default(call_default_factory=True)
    if isinstance(value, pydantic.BaseModel):
        return value.model_dump(mode="json", by_alias=True)
    return value
