"""An output checked against its inputs: random samples re-read through plain xarray and compared bit for bit.

The records name where each sample came from (``index/<dim>``: its start on the selected grid)
and schema.json names the inputs, the selection and each dim's role. This module finds every
sampled record's values again with ``xr.open_dataset``/``xr.open_zarr`` and ``.isel`` alone, a
path independent of the build's own readers, and recomputes what the build derives (stacks,
roles, fills and masks, record-ready coordinates, time features, ``input.preprocess``'s outputs)
with the project's pure functions, which define those. The first difference is named: feature,
sample, index, both values.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import glob
import os
import posixpath
import time
import warnings
from collections.abc import Mapping, Sequence
from pathlib import PurePosixPath
from typing import Any

import fsspec
import numpy as np
import xarray as xr

from planning.features import ROLE_KEY, is_role_stack, role_values
from planning.formats.zarr_paths import is_store
from planning.inputs.coords import record_values
from planning.positions import TIME_FEATURE_ROLE, TimeFeatures
from planning.sampling import Axis, SampleGrid
from schemas.errors import UserError
from schemas.metadata import load_schema
from schemas.reader import Reader, batch_length
from schemas.schema import Feature, Schema
from schemas.urls import is_remote

#: What to do about a record that differs from its inputs.
FIX = (
    "the output does not hold its inputs' values (inputs changed since the build, or the output was altered): "
    "build it again from the inputs"
)


#: How long reading a member's value from a file name may take (planning.inputs.members allows as long).
MEMBER_SEARCH_SECONDS = 0.5


class SourceMismatch(UserError):
    """A record that differs from its source: the message names the feature, the sample, the index, both values."""


class SourceUncheckable(UserError):
    """An output whose samples this check cannot find in the source: the message says what cannot be checked."""


@dataclasses.dataclass(frozen=True)
class SourceReport:
    path: str
    samples: int
    features: int
    files: int
    seconds: float
    seed: int

    def summary(self) -> str:
        return (
            f"OK: {self.path}: {self.samples:,} random sample(s) (seed {self.seed}) equal their source bit for bit, "
            f"every one of {self.features} features (index/* as positions on the sample grid, in their split), "
            f"re-read with xarray from the {self.files} input file(s) in {self.seconds:.1f} s"
        )


# ---------------------------------------------------------------------------------------------
# The inputs


def _matches(pattern: str) -> list[str]:
    if is_remote(pattern):
        fs, _ = fsspec.core.url_to_fs(pattern)
        protocol = pattern.split("://", 1)[0]
        found = fs.glob(pattern) if glob.has_magic(pattern) else ([pattern] if fs.exists(pattern) else [])
        return [p if "://" in p else f"{protocol}://{p}" for p in found]
    if glob.has_magic(pattern):
        return sorted(os.path.abspath(p) for p in glob.glob(pattern))
    return [os.path.abspath(pattern)] if os.path.exists(pattern) else []


def _resolve(pattern: str, listed: Sequence[str]) -> str:
    """A relative input path made absolute where the build ran: the folder its listed files say."""
    if is_remote(pattern) or os.path.isabs(pattern) or _matches(pattern):
        return pattern
    depth = len(PurePosixPath(pattern).parts)
    for path in listed:
        parents = PurePosixPath(path).parents
        if depth <= len(parents) and fnmatch.fnmatch(path, str(parents[depth - 1] / pattern)):
            return str(parents[depth - 1] / pattern)
    return pattern


def input_paths(schema: Schema) -> list[str]:
    """Every input file (or store) of the build, found again from schema.json's input.paths."""
    config_paths = schema.config.get("input", {}).get("paths") or schema.sources.get("globs") or []
    if isinstance(config_paths, str):
        config_paths = [config_paths]
    listed = [entry["path"] for entry in schema.sources.get("listed", []) if isinstance(entry, dict)]
    listed += [entry["path"] for entry in schema.sources.get("static", []) if isinstance(entry, dict)]
    found: list[str] = []
    for pattern in config_paths:
        resolved = _resolve(str(pattern), listed)
        if is_store(resolved):
            found.append(resolved.rstrip("/"))
            continue
        matched = _matches(resolved)
        if not matched:
            raise SourceUncheckable(
                f"input.paths: {pattern!r} matches no file from {os.getcwd()}; run the check where the inputs are "
                "(from the folder the build ran in)"
            )
        found.extend(matched)
    found = list(dict.fromkeys(found))
    missing = [path for path in listed if path.rstrip("/") not in found]
    if missing:
        raise SourceUncheckable(
            f"{missing[0]}: an input schema.json lists, but input.paths no longer finds it; restore the inputs "
            "the output was built from"
        )
    return found


class Inputs:
    """The input files opened with xarray (lazily, each once), and where each variable's steps are."""

    def __init__(self, schema: Schema, paths: Sequence[str]):
        config = schema.config.get("input", {})
        self.concat_dim = schema.sample.get("concat_dim", config.get("concat_dim", "time"))
        self.decode_times = bool(config.get("decode_times", True))
        self.calendar = config.get("calendar")  # input.calendar: the files' times' calendar, in place of theirs
        self.paths = list(paths)
        self.new_dim = schema.sample.get("new_dim")
        self._open: dict[str, xr.Dataset] = {}
        self._files: list = []  # remote files opened through fsspec, closed with the datasets
        self._steps: dict[tuple[str, Any], list[tuple[str, int, int]]] = {}

    def dataset(self, path: str) -> xr.Dataset:
        if path not in self._open:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # xarray's notes on the files' encodings, not about the values
                if is_store(path):
                    self._open[path] = xr.open_zarr(path, chunks=None, decode_times=self.decode_times)
                elif self.calendar and self.decode_times:
                    dataset = xr.open_dataset(self._target(path), decode_times=False, cache=False)
                    if self.concat_dim in dataset.variables:
                        dataset[self.concat_dim].attrs["calendar"] = self.calendar
                    self._open[path] = xr.decode_cf(dataset)
                else:
                    self._open[path] = xr.open_dataset(self._target(path), decode_times=self.decode_times, cache=False)
        return self._open[path]

    def _target(self, path: str):
        """What xarray opens: a local path, or a remote file (gs://, s3://) as a file object, which it reads with
        h5netcdf (NetCDF-4) or scipy (NetCDF-3)."""
        if not is_remote(path):
            return path
        stream = fsspec.open(path, "rb").open()
        self._files.append(stream)
        return stream

    def close(self) -> None:
        for dataset in self._open.values():
            dataset.close()
        for stream in self._files:
            stream.close()
        self._open.clear()
        self._files.clear()

    def _member_of(self, path: str):
        import regex

        name = posixpath.basename(path.rstrip("/"))
        try:  # (the pattern comes from schema.json: one that backtracks without end is stopped)
            match = regex.search(self.new_dim["from"], name, timeout=MEMBER_SEARCH_SECONDS)
        except TimeoutError:
            raise SourceUncheckable(
                f"schema.json: sample.new_dim.from ({self.new_dim['from']!r}) takes too long on {name!r}; "
                "the members cannot be told apart"
            ) from None
        if match is None or match.group(1) is None:
            return None
        text = match.group(1)
        values = self.new_dim["values"]
        return int(text) if values and isinstance(values[0], int) else text

    def holding(self, name: str, member=None) -> list[tuple[str, int, int]]:
        """[(path, first virtual step, length)] of the files holding ``name`` along the concat dim, in order."""
        key = (name, member)
        if key not in self._steps:
            found = []
            for path in self.paths:
                if self.new_dim is not None and self._member_of(path) != member:
                    continue
                dataset = self.dataset(path)
                if name in dataset.variables and self.concat_dim in dataset[name].dims:
                    found.append((path, dataset))
            if found and self.concat_dim in found[0][1].coords:
                found.sort(key=lambda item: item[1][self.concat_dim].values[0])
            out, start = [], 0
            for path, dataset in found:
                length = dataset.sizes[self.concat_dim]
                out.append((path, start, length))
                start += length
            self._steps[key] = out
        return self._steps[key]

    def static(self, name: str) -> str:
        """The first file holding ``name`` (a variable without the concat dim)."""
        for path in self.paths:
            if name in self.dataset(path).variables:
                return path
        raise SourceUncheckable(f"{name!r}: no input file holds it any more; restore the inputs")

    def concat_values(self, name: str, member=None) -> np.ndarray:
        """The concat dim's coordinate along every step of the files holding ``name``."""
        parts = [self.dataset(path)[self.concat_dim].values for path, _, _ in self.holding(name, member)]
        return np.concatenate(parts) if parts else np.array([])


# ---------------------------------------------------------------------------------------------
# Where a sample is


def _axes(schema: Schema) -> dict[str, dict]:
    return {axis["dim"]: axis for axis in schema.sample.get("axes", []) if isinstance(axis, dict)}


def sample_grid(schema: Schema) -> SampleGrid:
    """The sample grid schema.json describes (for the pure functions that take one)."""
    axes = []
    for axis in schema.sample["axes"]:
        dim, length, role = axis["dim"], axis["length"], axis["role"]
        if role == "window":
            axes.append(Axis.window(dim, length, axis["size"], axis["stride"]))
        elif role == "offsets":
            axes.append(Axis.offsets(dim, length, axis["offsets"]))
        elif role == "keep":
            axes.append(Axis.keep(dim, length))
        else:
            axes.append(Axis.iterate(dim, length))
    return SampleGrid(tuple(axes))


@dataclasses.dataclass(frozen=True)
class Located:
    """One sample's elements along every dim, on the selected grid and in the source (before ``select``), and its
    position on the grid."""

    on_grid: dict[str, np.ndarray]
    in_source: dict[str, np.ndarray]
    positions: dict[str, int]  # its grid position along each grid dim


def _selected(schema: Schema) -> dict[str, np.ndarray]:
    taken = {}
    for dim, entry in schema.sample.get("selection", {}).items():
        runs = entry.get("source_index_runs", [])
        taken[dim] = np.concatenate([np.arange(a, b) for a, b in runs]) if runs else np.array([], dtype=np.int64)
    return taken


def locate(schema: Schema, record: Mapping[str, np.ndarray], sample: str) -> Located:
    """Where ``record`` is, from its index/* features; a SourceMismatch where an index is off the grid."""
    taken = _selected(schema)
    on_grid, in_source, positions = {}, {}, {}
    for dim, axis in _axes(schema).items():
        role, length = axis["role"], axis["length"]
        if role == "keep":
            elements = np.arange(length)
        else:
            name = f"index/{dim}"
            if name not in record:
                raise SourceUncheckable(f"schema.json: the records carry no {name!r}, so no sample can be found again")
            index = int(np.asarray(record[name]).reshape(())) + int(axis.get("index_origin", 0))
            if role == "window":
                position, off = divmod(index, axis["stride"])
                elements = index + np.arange(axis["size"])
            elif role == "offsets":
                position, off = index + min(axis["offsets"]), 0
                elements = index + np.asarray(axis["offsets"])
            else:
                position, off = index, 0
                elements = np.array([index])
            if off or not 0 <= position < axis["positions"]:
                raise SourceMismatch(
                    f"{name} of {sample} is {index}, which is no sample's start on the grid ({axis['positions']} "
                    f"positions along {dim!r}, {role}); {FIX}"
                )
            positions[dim] = position
        on_grid[dim] = elements
        in_source[dim] = taken[dim][elements] if dim in taken else elements
    return Located(on_grid, in_source, positions)


def check_split(schema: Schema, where: Located, split: str, sample: str) -> None:
    """A SourceMismatch where the sample's steps along the split dim are not all in its split's range: a record in
    another split's shards (a sample straddling two splits is in none)."""
    info = schema.sample.get("splits", {}).get(split)
    dim = schema.sample.get("split_dim", schema.sample.get("concat_dim"))
    axis = _axes(schema).get(dim)
    if not isinstance(info, dict) or "index_range" not in info or axis is None or dim not in where.on_grid:
        return
    origin = int(axis.get("index_origin", 0))
    start, stop = (int(i) + origin for i in info["index_range"])
    steps = where.on_grid[dim]
    if steps.min() < start or steps.max() >= stop:
        raise SourceMismatch(
            f"{sample} covers {dim} steps {steps.min() - origin} to {steps.max() - origin} of the sample grid, but "
            f"split {split!r} holds steps {start - origin} to {stop - origin - 1}: the record is in another split's "
            f"shards; {FIX}"
        )


# ---------------------------------------------------------------------------------------------
# A sample's values from the source


def _by_file(name: str, concat: str, files, steps: np.ndarray) -> list[tuple[str, list[int]]]:
    """Runs of ``steps`` (virtual) in one file each: [(path, its steps in the file)], in order."""
    runs: list[tuple[str, list[int]]] = []
    for step in steps.tolist():
        found = [(path, step - start) for path, start, length in files if start <= step < start + length]
        if not found:
            raise SourceUncheckable(
                f"{name!r}: step {step} along {concat!r} is in no input file now (the inputs hold "
                f"{sum(n for _, _, n in files)}); restore the inputs the output was built from"
            )
        path, local = found[0]
        if runs and runs[-1][0] == path:
            runs[-1][1].append(local)
        else:
            runs.append((path, [local]))
    return runs


def _read(inputs: Inputs, name: str, dims: Sequence[str], where: Located) -> tuple[np.ndarray, tuple[str, ...]]:
    """``name`` at the sample's elements, and its dims (as in the files; an iterated one is 1 long)."""
    concat, new_dim = inputs.concat_dim, inputs.new_dim
    member_dim = new_dim["name"] if new_dim else None
    file_dims = [d for d in dims if d != member_dim]
    others = {d: where.in_source[d] for d in file_dims if d != concat and d in where.in_source}
    if concat not in file_dims:
        variable = inputs.dataset(inputs.static(name))[name]
        return variable.isel({d: others[d] for d in variable.dims if d in others}).values, tuple(variable.dims)
    members = [None] if member_dim is None else [new_dim["values"][i] for i in where.in_source[member_dim]]
    blocks = []
    for member in members:
        files = inputs.holding(name, member)
        steps = []
        for path, locals_ in _by_file(name, concat, files, where.in_source[concat]):
            variable = inputs.dataset(path)[name]
            picked = variable.isel({concat: locals_, **{d: others[d] for d in variable.dims if d in others}})
            steps.append(picked.transpose(*file_dims).values)
        blocks.append(np.concatenate(steps, axis=file_dims.index(concat)))
    values = np.stack(blocks) if member_dim is not None else blocks[0]
    order = ([member_dim] if member_dim is not None else []) + file_dims
    if member_dim is not None and list(dims) != order:
        values = np.moveaxis(values, 0, list(dims).index(member_dim))
        order = list(dims)
    return values, tuple(order)


class SourceCheck:
    """Expected values of every feature of a record, from the inputs alone."""

    def __init__(self, schema: Schema, inputs: Inputs):
        self.schema = schema
        self.inputs = inputs
        self.axes = _axes(schema)
        self.config = schema.config
        self.nan_policy = self.config.get("nan_policy", "keep")
        self.fill_value = self.config.get("fill_value")
        self._grid = sample_grid(schema)
        self._time_features: TimeFeatures | None = None
        self._anchor: str | None = None
        self._derived_for: tuple | None = None
        self._derived: xr.Dataset | None = None

    def iterated(self) -> set[str]:
        return {dim for dim, axis in self.axes.items() if axis["role"] == "iterate"}

    def raw(self, name: str, source: Mapping, where: Located) -> tuple[np.ndarray, tuple[str, ...]]:
        dims = source.get("dims")
        if dims is None:
            raise SourceUncheckable(f"schema.json: variable {name!r} does not say its dims in the files")
        iterated = self.iterated()
        values, order = _read(self.inputs, name, dims, where)
        keep_axes = [i for i, d in enumerate(order) if d not in iterated]
        shape = [values.shape[i] for i in keep_axes]
        return values.reshape(shape), tuple(order[i] for i in keep_axes)

    def variable(self, feature: Feature, name: str, source: Mapping, dims: Sequence[str], where) -> np.ndarray:
        """One variable over the sample, in ``dims`` order, as the record stores it (before any fill)."""
        values, order = self.raw(name, source, where)
        values = np.transpose(values, [order.index(d) for d in dims])
        if feature.dtype == "int64":
            return values.astype(np.int64)
        with np.errstate(over="ignore", invalid="ignore"):
            return values.astype(np.float32)

    def _filled(self, values: np.ndarray) -> np.ndarray:
        if self.nan_policy == "fill" and values.dtype.kind == "f":
            return np.where(np.isnan(values), np.float32(self.fill_value), values).astype(values.dtype)
        return values

    def unfilled(self, feature: Feature, where: Located) -> np.ndarray:
        source = feature.source
        if ROLE_KEY in source:
            return self._role(feature, where)
        if "channels" in source:
            dims = [d for d in feature.dims if d != "channel"]
            channels = [
                self.values_of(feature, name, source["variables"][name], dims, where) for name in source["channels"]
            ]
            return np.stack(channels, axis=0 if feature.dims[0] == "channel" else -1)
        return self.values_of(feature, source.get("variable", feature.name), source, feature.dims, where)

    def values_of(self, feature: Feature, name: str, source: Mapping, dims: Sequence[str], where) -> np.ndarray:
        """One variable (``source``: its provenance) over the sample: derived by input.preprocess, or read."""
        if "preprocess" in source:
            return self.derived(feature, name, source, dims, where)
        return self.variable(feature, name, source, dims, where)

    def derived(self, feature: Feature, name: str, source: Mapping, dims: Sequence[str], where) -> np.ndarray:
        """A variable ``input.preprocess`` derives, over the sample: the function applied to its inputs read here."""
        if self.inputs.new_dim is not None:
            raise SourceUncheckable(
                f"feature {feature.name!r}: derived (input.preprocess) from an ensemble (input.new_dim), which this "
                "check cannot re-derive; nothing was compared"
            )
        key = source["preprocess"]
        if self._derived_for != key:  # (expected() forgets it at each sample)
            self._derived_for, self._derived = key, self._run_preprocess(source, where)
        returned = self._derived
        if name not in returned.data_vars:
            raise SourceMismatch(f"input.preprocess: {source['preprocess']} no longer returns {name!r}")
        variable = returned[name]
        iterated = self.iterated()
        order = [d for d in variable.dims if d not in iterated]
        values = variable.transpose(*[d for d in variable.dims if d in iterated], *order).values
        values = values.reshape(values.shape[len(variable.dims) - len(order) :])
        values = np.transpose(values, [order.index(d) for d in dims])
        return values.astype(np.int64 if feature.dtype == "int64" else np.float32)

    def _run_preprocess(self, source: Mapping, where: Located) -> xr.Dataset:
        from planning.preprocess import call

        reference = self.inputs.dataset(self._reference_file())
        data, dims = {}, []
        for name in source.get("inputs", []):
            file_dims = list(reference[name].dims) if name in reference.variables else self._static_dims(name)
            values, order = _read(self.inputs, name, file_dims, where)
            attrs = dict(reference[name].attrs) if name in reference.variables else {}
            data[name] = xr.Variable(order, values, attrs)
            dims.extend(d for d in order if d not in dims)
        coords = {}
        for dim in dims:
            found = self.coordinate_values(dim, where, whole=dim not in where.in_source)
            if found is not None:
                coords[dim] = xr.Variable(dim, found[0], found[1])
        return call(source["preprocess"], xr.Dataset(data, coords), "a sample re-read by the source check")

    def _static_dims(self, name: str) -> list[str]:
        return list(self.inputs.dataset(self.inputs.static(name))[name].dims)

    def _role(self, feature: Feature, where: Located) -> np.ndarray:
        source = feature.source
        if is_role_stack(feature):
            values = {}
            for name in source["channels"]:
                member = source["variables"][f"{source[ROLE_KEY]}/{name}"]
                values[name] = self._whole(feature, name, member, where)[None]
            return role_values(feature, values)[0]
        return role_values(feature, self._whole(feature, source["variable"], source, where)[None])[0]

    def _whole(self, feature: Feature, name: str, source: Mapping, where: Located) -> np.ndarray:
        """A role's variable over the whole sample (every step any role takes, the uncropped window), in the
        feature's dims (a stack's: each channel's) as role_values takes it."""
        return self.values_of(feature, name, source, [d for d in feature.dims if d != "channel"], where)

    def coordinate_values(self, dim: str, where: Located, whole: bool = False) -> tuple[np.ndarray, dict] | None:
        """A dim's coordinate at the sample's elements (``whole``: all of it), and its attributes; None if none."""
        new_dim = self.inputs.new_dim
        if new_dim is not None and dim == new_dim["name"]:
            values = np.asarray(new_dim["values"])
            return (values if whole else values[where.in_source[dim]]), {}
        if dim == self.inputs.concat_dim:
            anchor, member = self._anchor_variable(), self._member(where)
            values = self.inputs.concat_values(anchor, member)
            attrs = dict(self.inputs.dataset(self.inputs.holding(anchor, member)[0][0])[dim].attrs)
            return (values if whole else values[where.in_source[dim]]), attrs
        reference = self.inputs.dataset(self._reference_file())
        if dim not in reference.coords:
            return None
        values = reference[dim].values
        return (values if whole else values[where.in_source[dim]]), dict(reference[dim].attrs)

    def _member(self, where: Located):
        new_dim = self.inputs.new_dim
        if new_dim is None:
            return None
        return new_dim["values"][int(where.in_source[new_dim["name"]][0])]

    def coordinate(self, feature: Feature, where: Located) -> np.ndarray:
        dim = feature.source["dim"]
        found = self.coordinate_values(dim, where)
        if found is None:
            raise SourceUncheckable(f"{feature.name}: the input files have no coordinate {dim!r} any more")
        ready = record_values(*found)
        if ready is None:
            raise SourceUncheckable(f"{feature.name}: {dim!r}'s values cannot be held by a record")
        out = ready[0]
        return out.reshape(()) if feature.shape == () else out

    def _anchor_variable(self) -> str:
        """A variable of the files along the concat dim: where the concat dim's steps are counted."""
        if self._anchor is None:
            names = []
            for feature in self.schema.variable_features:
                source = feature.source
                for name, member in source.get("variables", {feature.name: source}).items():
                    names.extend([member.get("variable", name), *member.get("inputs", [])])
            first = self._first_member()
            self._anchor = next((n for n in dict.fromkeys(names) if self.inputs.holding(n, first)), None)
            if self._anchor is None:
                raise SourceUncheckable(
                    f"no input file holds a variable of the records along {self.inputs.concat_dim!r} any more; "
                    "restore the inputs the output was built from"
                )
        return self._anchor

    def _reference_file(self) -> str:
        return self.inputs.holding(self._anchor_variable(), self._first_member())[0][0]

    def _first_member(self):
        return self.inputs.new_dim["values"][0] if self.inputs.new_dim else None

    def aux_coordinate(self, feature: Feature, where: Located) -> np.ndarray:
        source = feature.source
        name = source.get("coordinate")
        path = self.inputs.static(name) if source.get("static") else None
        if path is not None:
            variable = self.inputs.dataset(path)[name]
            dims = list(variable.dims)
            others = {d: where.in_source[d] for d in dims if d in where.in_source}
            values = variable.isel(others).values
            iterated = self.iterated()
            keep = [i for i, d in enumerate(dims) if d not in iterated]
            values = values.reshape([values.shape[i] for i in keep])
            order = [dims[i] for i in keep]
        else:
            values, order = self.raw(name, {"dims": source.get("dims") or self._dims_of(name)}, where)
            order = list(order)
        values = np.transpose(values, [order.index(d) for d in feature.dims])
        return values.astype(np.int64 if feature.dtype == "int64" else np.float32)

    def _dims_of(self, name: str) -> list[str]:
        return list(self.inputs.dataset(self._reference_file())[name].dims)

    def time_feature(self, feature: Feature, where: Located) -> np.ndarray:
        if self._time_features is None:
            self._time_features = self._plan_time_features()
        grid_dims = [a.dim for a in self._grid.grid_axes]
        positions = [np.array([where.positions[d]]) for d in grid_dims]
        seconds = self._seconds()
        columns = self._time_features.columns(self._grid, positions, seconds)
        return columns[feature.name][1][0]

    def _seconds(self) -> np.ndarray:
        concat = self.inputs.concat_dim
        anchor = self._anchor_variable()
        values = self.inputs.concat_values(anchor, self._first_member())
        taken = _selected(self.schema).get(concat)
        if taken is not None:
            values = values[taken]
        ready = record_values(values, {})
        return ready[0]

    def _plan_time_features(self) -> TimeFeatures:
        """The time features as the build planned them, from schema.json's record of them and the inputs' own
        longitudes and latitudes (read here, through xarray)."""
        names = tuple(self.config.get("sample", {}).get("time_features") or ())
        calendar = lon_name = lat_dim = None
        for feature in self.schema.features:
            if feature.role == TIME_FEATURE_ROLE:
                calendar = feature.source.get("calendar", calendar)
                lon_name = feature.source.get("longitude") or lon_name
                lat_dim = feature.source.get("latitude") or lat_dim
        lon_dims, lon_values, lat_values = (), None, None
        if lon_name is not None:
            variable = self._coordinate_variable(lon_name)
            lon_dims = tuple(variable.dims)
            lon_values = self._on_selected_grid(variable)
        if lat_dim is not None:
            lat_values = self._on_selected_grid(self._coordinate_variable(lat_dim))
        concat = self.inputs.concat_dim
        return TimeFeatures(names, concat, calendar, lon_name, lon_dims, lon_values, lat_dim, lat_values)

    def _coordinate_variable(self, name: str) -> xr.DataArray:
        """A coordinate of the inputs: from the reference file, or the first file holding it (a grid file)."""
        reference = self.inputs.dataset(self._reference_file())
        if name in reference.variables:
            return reference[name]
        return self.inputs.dataset(self.inputs.static(name))[name]

    def _on_selected_grid(self, variable: xr.DataArray) -> np.ndarray:
        """A coordinate's float64 values over its dims, as the selection left them."""
        values, taken = variable.values.astype(np.float64), _selected(self.schema)
        for axis, dim in enumerate(variable.dims):
            if dim in taken:
                values = np.take(values, taken[dim], axis=axis)
        return values

    def expected(self, record: Mapping[str, np.ndarray], sample: str, split: str) -> dict[str, np.ndarray]:
        """Every feature's expected value; index/* features are the locator, checked by locate (on the grid) and
        check_split (in the split's range)."""
        where = locate(self.schema, record, sample)
        check_split(self.schema, where, split, sample)
        self._derived_for = self._derived = None
        out: dict[str, np.ndarray] = {}
        unfilled: dict[str, np.ndarray] = {}
        for feature in self.schema.features:
            role = feature.role
            if role == "variable":
                unfilled[feature.name] = self.unfilled(feature, where)
                out[feature.name] = self._filled(unfilled[feature.name])
            elif role == "index":
                out[feature.name] = np.asarray(record[feature.name])
            elif role == "coord":
                out[feature.name] = self.coordinate(feature, where)
            elif role == "aux_coord":
                out[feature.name] = self.aux_coordinate(feature, where)
            elif role == "mask":
                of = feature.source["of"]
                out[feature.name] = np.isnan(unfilled[of]).astype(np.int64)
            elif role == TIME_FEATURE_ROLE:
                out[feature.name] = self.time_feature(feature, where)
            else:
                raise SourceUncheckable(
                    f"feature {feature.name!r} ({role}): this check cannot recompute it from the inputs; "
                    "nothing was compared"
                )
        return out


# ---------------------------------------------------------------------------------------------
# Comparing


def _same(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Element-wise: the same bits (NaN equal to NaN, whatever its payload)."""
    if a.dtype.kind == "f":
        bits = a.view(np.uint32 if a.dtype.itemsize == 4 else np.uint64)
        other = b.view(bits.dtype)
        return (bits == other) | (np.isnan(a) & np.isnan(b))
    return a == b


def _text(value) -> str:
    """A value as it is stored: float32's shortest repr (which reads back to the same bits), ints whole."""
    return str(np.asarray(value).reshape(()).item()) if np.asarray(value).dtype.kind in "iub" else str(value)


def first_difference(feature: Feature, got: np.ndarray, want: np.ndarray, sample: str) -> str | None:
    """Where the record's value of ``feature`` first differs from the source's, in words; None if nowhere."""
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        return f"{feature.name} of {sample} is {got.shape} in the record but {want.shape} from the source"
    want = want.astype(got.dtype, copy=False)
    same = _same(got, want)
    if bool(np.all(same)):
        return None
    at = np.unravel_index(int(np.flatnonzero(~same.reshape(-1))[0]), got.shape) if got.shape else ()
    index = ", ".join(f"{d}={i}" for d, i in zip(feature.dims, at))
    where = f" at [{index}]" if index else ""
    return f"{feature.name} of {sample}{where} is {_text(got[at])} in the record but {_text(want[at])} in the source"


def _check_supported(schema: Schema) -> None:
    if not schema.sample.get("axes"):
        raise SourceUncheckable("schema.json does not describe the sample's axes (an early output); nothing compared")


def chosen_samples(counts: Mapping[str, int], count: int, seed: int) -> dict[str, list[int]]:
    """``count`` distinct samples drawn over every split (seeded), per split in file order."""
    total = sum(counts.values())
    picks = np.sort(np.random.default_rng(seed).choice(total, size=min(count, total), replace=False))
    out, start = {}, 0
    for name, n in counts.items():
        out[name] = (picks[(picks >= start) & (picks < start + n)] - start).tolist()
        start += n
    return out


def _records(path: str, schema: Schema, split: str, positions: Sequence[int]):
    """(position, record) of each wanted sample of a split, by position where the shards allow, else read through."""
    if not positions:
        return
    if not schema.compression:
        from schemas.random_access import RandomAccessSource

        source = RandomAccessSource(path, split, schema=schema)
        yield from zip(positions, source.__getitems__(list(positions)))
        return
    wanted, at = set(positions), 0
    for block in Reader(path, split, schema=schema).iter_chunks():
        n = batch_length(block)
        for i in range(n):
            if at + i in wanted:
                yield at + i, {name: values[i] for name, values in block.items()}
        at += n


def sample_label(schema: Schema, split: str, position: int) -> str:
    """'sample 12 of split 'train' (data-00001-of-00004.tfrecord, record 3)': how to find it again."""
    within = position
    for shard in schema.splits[split]:
        if within < shard.examples:
            record, slot = divmod(within, schema.examples_per_record)
            inside = f", slot {slot}" if schema.examples_per_record > 1 else ""
            return f"sample {position} of split {split!r} ({shard.file}, record {record}{inside})"
        within -= shard.examples
    return f"sample {position} of split {split!r}"


def verify_source(path: str, samples: int, seed: int = 0, split: str | None = None) -> SourceReport:
    """Re-read ``samples`` random samples (seeded) of the output from its inputs with xarray, compare every feature.

    Raises SourceMismatch naming the first difference, SourceUncheckable where the inputs cannot be
    found or the output holds what this check cannot recompute (never a silent pass).
    """
    started = time.monotonic()
    path = str(path).rstrip("/") or "/"
    schema = load_schema(path)
    _check_supported(schema)
    inputs = Inputs(schema, input_paths(schema))
    check = SourceCheck(schema, inputs)
    names = [split] if split else list(schema.splits)
    counts = {name: schema.num_examples(name) for name in names}
    compared = 0
    try:
        for name, positions in chosen_samples(counts, samples, seed).items():
            for position, record in _records(path, schema, name, positions):
                label = sample_label(schema, name, position)
                try:
                    expected = check.expected(record, label, name)
                except UserError as error:  # (the function's own errors, with input.preprocess, among them)
                    kind = SourceMismatch if isinstance(error, SourceMismatch) else SourceUncheckable
                    raise kind(f"{path}: {error}") from None
                except (KeyError, IndexError, TypeError, ValueError, OSError) as error:  # unlike what schema.json says
                    raise SourceUncheckable(
                        f"{path}: {label} cannot be found in the inputs as schema.json describes them "
                        f"({type(error).__name__}: {error}); were the inputs changed since the build?"
                    ) from error
                for feature in schema.features:
                    problem = first_difference(feature, record[feature.name], expected[feature.name], label)
                    if problem:
                        raise SourceMismatch(f"{path}: {problem}; {FIX}")
                compared += 1
    finally:
        inputs.close()
    return SourceReport(path, compared, len(schema.features), len(inputs.paths), time.monotonic() - started, seed)
