"""The config's ``input`` section (where the files are, how they join), below the plan so the inputs read it."""

from __future__ import annotations

import math
import os
import re
from typing import Any, Literal

import regex
from pydantic import BaseModel, ConfigDict, Field, NonNegativeFloat, field_validator, model_validator

from planning.formats.calendars import check_calendar
from schemas.urls import is_remote

#: input.preprocess: a module path, a colon, and a (dotted) name in the module.
_FUNCTION_PATH = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


class _Strict(BaseModel):
    # Unknown keys are errors: a misspelt key silently ignored is a dataset built wrong.
    model_config = ConfigDict(extra="forbid", frozen=True)


class NewDimConfig(_Strict):
    """A dim made from the files' names: files otherwise alike (ensemble members) joined along it."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    name: str = Field(description="the new dim's name, e.g. member")
    pattern: str = Field(
        alias="from",
        description=(
            "a regular expression searched in each file's name (not its directory) with one group: the group's "
            "match is the file's coordinate value along the new dim, an integer where every match reads as one, "
            r'e.g. "TREFHT\\.B06\\.(\\d+)"'
        ),
    )

    @field_validator("pattern")
    @classmethod
    def _one_group(cls, value: str) -> str:
        try:
            # The engine planning.inputs.members searches with (it bounds a search's time).
            compiled = regex.compile(value)
        except regex.error as error:
            raise ValueError(f"not a regular expression ({error})") from None
        if compiled.groups != 1:
            raise ValueError(
                f"give exactly one group ( ... ) around the part of the file name that is the coordinate value, "
                f"found {compiled.groups}; write other groups as (?: ... )"
            )
        return value


class GribConfig(_Strict):
    """GRIB input: which hypercube of the files' messages is read (a GRIB file may hold several)."""

    filter_by_keys: dict[str, str | int | float] = Field(
        default_factory=dict,
        json_schema_extra={"reference_type": "{key: value}"},
        description=(
            "the messages to read, by their ecCodes keys, as cfgrib takes them, e.g. {typeOfLevel: isobaricInhPa, "
            "stepType: instant}; default: every message (the files must then hold one hypercube)"
        ),
    )

    @field_validator("filter_by_keys")
    @classmethod
    def _keys(cls, value: dict) -> dict:
        for key, wanted in value.items():
            if not key or isinstance(wanted, bool):
                raise ValueError(f"{key!r}: give an ecCodes key and a string or number, e.g. typeOfLevel: surface")
        return value


class IcechunkConfig(_Strict):
    """Icechunk input: which version of the repository is read (at most one of branch, tag, snapshot)."""

    branch: str | None = Field(
        None, description="a branch: its latest snapshot when the build is planned (default main)"
    )
    tag: str | None = Field(None, description="a tag: the snapshot it names")
    snapshot: str | None = Field(None, description="a snapshot id, e.g. K59448GV2VVDSFJW6W50")

    @model_validator(mode="after")
    def _one_version(self) -> IcechunkConfig:
        given = [k for k in ("branch", "tag", "snapshot") if getattr(self, k) is not None]
        if len(given) > 1:
            raise ValueError(f"give one of branch, tag or snapshot, not {' and '.join(given)}")
        for key in given:
            if not getattr(self, key):
                raise ValueError(f"{key}: give a name, or leave it out to read branch main")
        return self

    def version(self) -> dict[str, str]:
        """The version as icechunk's readonly_session takes it."""
        if self.tag is not None:
            return {"tag": self.tag}
        if self.snapshot is not None:
            return {"snapshot_id": self.snapshot}
        return {"branch": self.branch or "main"}


class InputConfig(_Strict):
    """Where the NetCDF files are and how they join into one virtual dataset."""

    paths: list[str] = Field(
        description=(
            "a glob or a list of globs (local paths or gs:// URLs) of NetCDF or GRIB files, or one Zarr store, "
            "kerchunk reference file or Icechunk repository (see Other inputs)"
        )
    )
    concat_dim: str = Field(
        "time", description="the dim the files are split along; files are ordered by its coordinate"
    )
    gaps: Literal["error", "skip"] = Field(
        "error",
        description=(
            "a window or pair along concat_dim that would join steps not one regular step apart: "
            "`error` stops the build, `skip` drops those samples (counted in schema.json)"
        ),
    )
    decode_times: bool = Field(
        True,
        description=(
            "decode times (CF units and calendar, any calendar cftime knows) to dates, so splits take dates; "
            "false: keep the stored numbers (splits then take numbers), for units no calendar decodes, "
            "e.g. `months since` outside the 360_day calendar"
        ),
    )
    calendar: str | None = Field(
        None,
        description=(
            "the calendar of the files' times, in place of the one they state: for a missing or unknown "
            "calendar attribute (e.g. noleap for `365_days`); any calendar cftime knows"
        ),
    )
    coord_tolerance: Literal["float32"] | NonNegativeFloat = Field(
        "float32",
        json_schema_extra={"reference_type": '"float32" or a finite float ≥ 0'},
        description=(
            "how far the files' coordinates (other than concat_dim) may differ and the files still join: "
            "`float32`: by float32 rounding (about 1.2e-7 times the value); a number: by that much; "
            "0: not at all. The first file's values are the ones recorded"
        ),
    )
    preprocess: str | None = Field(
        None,
        description=(
            "derived variables: a function `package.module:function` taking an xr.Dataset of the input variables "
            "over each unit's slab and returning an xr.Dataset; `variables` then names its outputs "
            "(see Derived variables)"
        ),
    )
    missing_chunks: Literal["error", "fill"] = Field(
        "error",
        description=(
            "a Zarr store's chunk that is absent: `error` stops the build (it may be a store still being written), "
            "`fill` reads it as the array's fill value, as Zarr does: for stores written with "
            "write_empty_chunks=False (zarr 3's default), which leave out every all-fill chunk"
        ),
    )
    new_dim: NewDimConfig | None = Field(
        None,
        json_schema_extra={"reference_type": "{name, from}"},
        description=(
            "files that are otherwise alike (ensemble members, one per file or per run of files) joined along a "
            r'new dim whose coordinate is read from their names, e.g. {name: member, from: "TREFHT\\.B06\\.(\\d+)"} '
            "(see Ensembles)"
        ),
    )
    grib: GribConfig | None = Field(
        None,
        json_schema_extra={"reference_type": "{filter_by_keys}"},
        description=(
            "the paths are GRIB files (GRIB 1 or 2, read through cfgrib and ecCodes: pip install "
            '"xarray-tfrecords[grib]"), and which of their hypercubes to read, e.g. {filter_by_keys: {typeOfLevel: '
            "isobaricInhPa}}; files named *.grib, *.grib2, *.grb or *.grb2 are GRIB without it (see Other inputs)"
        ),
    )
    icechunk: IcechunkConfig | None = Field(
        None,
        json_schema_extra={"reference_type": "{branch, tag or snapshot}"},
        description=(
            'the path is an Icechunk repository (local; pip install "xarray-tfrecords[icechunk]"): the version '
            "read, e.g. {tag: v1}; default: branch main. The snapshot read is recorded in schema.json's sources "
            "(see Other inputs)"
        ),
    )
    preprocess_inputs: list[str] | None = Field(
        None,
        description=(
            "the variables input.preprocess is given; default: every numeric variable with all the sample dims "
            "(list static or lower-dimensional ones here to give them too)"
        ),
    )

    @field_validator("paths", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @field_validator("coord_tolerance", mode="before")
    @classmethod
    def _tolerance(cls, value: Any) -> Any:
        # YAML's .inf and .nan are floats too: an infinite tolerance would join any grids, NaN none.
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if (
            (number and not (math.isfinite(value) and value >= 0))
            or isinstance(value, bool)
            or (isinstance(value, str) and value != "float32")
        ):
            raise ValueError("give float32 (the default), or a finite number >= 0 (0: the values must be equal)")
        return value

    @field_validator("paths")
    @classmethod
    def _not_empty(cls, value: list[str]) -> list[str]:
        if not value or any(not p for p in value):
            raise ValueError("give at least one non-empty path or glob")
        return [p if is_remote(p) else os.path.expanduser(p) for p in value]

    @field_validator("preprocess")
    @classmethod
    def _function_path(cls, value: str | None) -> str | None:
        if value is not None and not _FUNCTION_PATH.fullmatch(value):
            raise ValueError("give the function as package.module:function, e.g. mypackage.derived:wind_speed")
        return value

    @field_validator("preprocess_inputs")
    @classmethod
    def _inputs(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and not value:
            raise ValueError("an empty list gives the function nothing; leave it out to give every variable")
        if value is not None and len(set(value)) != len(value):
            raise ValueError(f"a variable is listed twice: {value}")
        return value

    @field_validator("calendar")
    @classmethod
    def _known_calendar(cls, value: str | None) -> str | None:
        if value is not None:
            check_calendar(value)
        return value

    @model_validator(mode="after")
    def _calendar_decodes(self) -> InputConfig:
        if self.calendar is not None and not self.decode_times:
            raise ValueError("calendar is only used to decode times: drop it, or set decode_times: true")
        if self.preprocess_inputs is not None and self.preprocess is None:
            raise ValueError("preprocess_inputs are what input.preprocess is given: set preprocess, or drop them")
        if self.new_dim is not None and self.new_dim.name == self.concat_dim:
            raise ValueError(
                f"new_dim.name: {self.new_dim.name!r} is concat_dim already; give the new dim another name"
            )
        return self

    @property
    def split_dims(self) -> tuple[str, ...]:
        """The dims a split may range along: concat_dim, and the new dim if there is one."""
        return (self.concat_dim,) if self.new_dim is None else (self.concat_dim, self.new_dim.name)
