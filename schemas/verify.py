"""Checks that an output is whole: every shard read, CRCs, record counts, feature shapes, no stray files."""

from __future__ import annotations

import dataclasses
import importlib
import json
import posixpath
import time

import fsspec
import numpy as np

from schemas.errors import UserError
from schemas.grid import coordinate_values
from schemas.grid_file import VALUE_KEYS, is_reference
from schemas.metadata import load_schema, load_stats
from schemas.reader import Reader, batch_length
from schemas.sample_shapes import check_axis_lengths, expected_length, sample_axes, shaped_as
from schemas.schema import PARSER_FILE, SCHEMA_FILE, STATS_FILE, Schema
from schemas.shard_index import FRAMING_BYTES, ShardIndex
from schemas.shards import generation_of_name, is_shard_name, listed_files
from schemas.tfrecord import CorruptRecordError
from schemas.urls import check_regular_file

#: The endings that already tell the user what to do: a message ending so gets no second fix.
_FIXES = ("rebuild the output", "build the output again")


def with_fix(message: str, fix: str) -> str:
    """``message`` ending with ``fix``, unless it already ends with a fix (an index's errors say "rebuild the
    output" themselves): one fix a line, not "...; rebuild the output; build the output again"."""
    return message if message.endswith(_FIXES) else f"{message}; {fix}"


class VerifyError(UserError):
    """An output that is not what its schema.json says; the message names the file and the problem."""


@dataclasses.dataclass(frozen=True)
class VerifyReport:
    """What a successful verification read."""

    path: str
    splits: dict[str, int]  # samples per split
    shards: int
    records: int
    bytes: int
    seconds: float
    source: str | None = None  # the check against the inputs' summary, where one ran

    def summary(self) -> str:
        per_split = ", ".join(f"{name} {count:,}" for name, count in self.splits.items())
        line = (
            f"OK: {self.path}: {self.records:,} records in {self.shards} shard(s) ({per_split} samples), "
            f"{self.bytes / 1e6:,.1f} MB; every CRC, record count and feature shape checked in {self.seconds:.1f} s"
        )
        return line if self.source is None else f"{line}\n{self.source}"


def list_files(path: str) -> dict[str, int]:
    """{file name: size in bytes} of the files directly in the output directory (any fsspec URL)."""
    fs, root = fsspec.core.url_to_fs(path)
    return {
        posixpath.basename(entry["name"].rstrip("/")): int(entry.get("size") or 0)
        for entry in fs.ls(root, detail=True)
        if entry.get("type") != "directory"
    }


def _check_listing(path: str, schema: Schema, files: dict[str, int]) -> None:
    listed = listed_files(schema.splits)
    for name in (STATS_FILE, PARSER_FILE):
        if name not in files:
            raise VerifyError(f"{posixpath.join(path, name)}: missing beside {SCHEMA_FILE}; build the output again")
    for shards in schema.splits.values():
        for shard in shards:
            for name in (shard.file, shard.index):
                if name is not None and name not in files:
                    raise VerifyError(
                        f"{posixpath.join(path, name)}: missing, but {SCHEMA_FILE} lists it; build the output again"
                    )
                if name is not None:
                    _check_regular(posixpath.join(path, name))
    _check_regular(posixpath.join(path, STATS_FILE))
    # Shards of a later generation than those committed are an append under way, or one that was killed
    # (its rerun removes them): not part of this output yet, which is whole without them.
    committed = int(schema.sources.get("generations", 1))
    extra = sorted(
        name for name in files if is_shard_name(name) and name not in listed and generation_of_name(name) < committed
    )
    if extra:
        raise VerifyError(
            f"{posixpath.join(path, extra[0])}: shard file not listed in {SCHEMA_FILE} "
            f"({len(extra)} such file(s)); delete it or build the output again with --overwrite"
        )


def _check_regular(url: str) -> None:
    """A VerifyError where a file the output lists is a FIFO, a device, ... (which reading would block on)."""
    try:
        check_regular_file(url)
    except UserError as error:
        raise VerifyError(str(error)) from None


def _check_declared_totals(path: str, schema: Schema) -> None:
    """The totals schema.json states beside the shard list must agree with it."""
    with fsspec.open(posixpath.join(path, SCHEMA_FILE), "r") as stream:
        raw = json.load(stream)
    for name, split in raw.get("splits", {}).items():
        counted = schema.num_records(name)
        if split.get("records", counted) != counted:
            raise VerifyError(
                f"{posixpath.join(path, SCHEMA_FILE)}: split {name!r} says {split['records']} records "
                f"but its shards add up to {counted}; build the output again"
            )


def _check_grid(schema: Schema) -> None:
    """The grid's values kept beside schema.json (grid.npz) are there, whole, and those it was written with."""
    for entry in schema.grid.values():
        if any(is_reference(entry.get(key)) for key in VALUE_KEYS):
            try:
                coordinate_values(entry, schema.location)
            except UserError as error:
                raise VerifyError(str(error)) from None


def _check_stats(path: str, schema: Schema) -> None:
    try:
        stats = load_stats(path).get("variables", {})  # (refuses the statistics of another commit than schema.json's)
    except UserError as error:
        raise VerifyError(str(error)) from None
    digest = schema.sources.get("generations_sha256")
    with fsspec.open(posixpath.join(path, PARSER_FILE), "r") as stream:
        if digest and digest not in stream.read():  # (it holds the schema it serves: its commit's digest too)
            raise VerifyError(
                f"{posixpath.join(path, PARSER_FILE)}: written for another commit than {SCHEMA_FILE}'s (an append "
                "stopped during its commit); run the same append again to complete it"
            )
    # A role's feature (sample.roles: "<role>/<variable>") has its variable's statistics.
    own = {f.name: f.source.get("variable", f.name) if "sample_role" in f.source else f.name for f in schema.features}
    names = [name for f in schema.variable_features for name in f.source.get("channels", [own[f.name]])]
    missing = [name for name in names if name not in stats]
    if missing:
        raise VerifyError(
            f"{posixpath.join(path, STATS_FILE)}: no statistics for {missing[0]!r}; build the output again"
        )


def _check_shapes(path: str, schema: Schema) -> None:
    """Every feature's shape is what its dims are in one sample: a window's size, a kept dim's length, ..."""
    axes = sample_axes(schema)
    if not axes:  # not recorded (an output written by hand, or by an early version): nothing to compare
        return
    where = posixpath.join(path, SCHEMA_FILE)
    try:
        check_axis_lengths(schema, where)
    except UserError as error:
        raise VerifyError(str(error)) from None
    for feature in schema.features:
        for dim in feature.dims:
            expected = expected_length(shaped_as(feature, schema), dim, axes)
            if expected is None:
                raise VerifyError(
                    f"{where}: feature {feature.name!r} has dim {dim!r}, which is not among the sample's axes "
                    f"({', '.join(map(str, axes))}); build the output again"
                )
            if expected[0] is None:
                raise VerifyError(
                    f"{where}: feature {feature.name!r} has dim {dim!r}, which sample.axes iterates (one sample per "
                    "index), so no feature holds it; build the output again"
                )


def verify_output(path: str, split: str | None = None, *, source_samples: int = 0, seed: int = 0) -> VerifyReport:
    """Read every shard of the output (or of one split) and check it against schema.json.

    Args:
        path: the output's folder, a local path or an fsspec URL.
        split: only this split (default: every split).
        source_samples: also re-read that many random samples from the output's inputs with plain xarray and
            compare every feature bit for bit (needs the build's install: xarray).
        seed: which samples ``source_samples`` picks.

    Returns:
        A ``VerifyReport``: samples per split, shards, records, bytes read and, with ``source_samples``, the
        source check's summary.

    Raises:
        VerifyError: at the first mismatch, in one line: the file at fault, the problem, the fix.
    """
    started = time.monotonic()
    path = str(path).rstrip("/") or "/"
    try:
        schema = load_schema(path)  # (refuses a damaged schema.json, and shard names outside the output)
    except UserError as error:
        raise VerifyError(str(error)) from None
    files = list_files(path)
    _check_listing(path, schema, files)
    _check_shapes(path, schema)
    _check_stats(path, schema)
    _check_grid(schema)
    names = [split] if split else list(schema.splits)
    samples, shards, records, size = {}, 0, 0, 0
    for name in names:
        samples[name] = 0
        if not schema.splits.get(name, True):
            continue  # a split with no data yet: no shard to check
        reader = Reader(path, name, schema=schema)
        for shard in reader.shards:
            found, sizes = _read_shard(reader, shard)
            if shard.index is not None:
                _check_index(reader, shard, sizes)
            if found != shard.examples:
                raise VerifyError(
                    f"{reader.url(shard)}: {found} samples, {SCHEMA_FILE} says {shard.examples}; build the output again"
                )
            samples[name] += found
            if files[shard.file] != shard.bytes:
                raise VerifyError(
                    f"{reader.url(shard)}: {files[shard.file]} bytes on disk, {SCHEMA_FILE} says {shard.bytes}; "
                    "build the output again"
                )
            shards += 1
            records += shard.records
            size += shard.bytes
    _check_declared_totals(path, schema)  # after the shards, so a wrong shard count names its shard
    report = VerifyReport(path, samples, shards, records, size, time.monotonic() - started)
    if source_samples > 0:
        report = dataclasses.replace(report, source=check_source(path, source_samples, seed, split))
    return report


#: Where the check against the inputs lives: it reads them with xarray, which this package never imports.
SOURCE_CHECK = "pipelines.source_check"


def check_source(path: str, samples: int, seed: int = 0, split: str | None = None) -> str:
    """The summary line of re-reading ``samples`` random samples from the inputs; a VerifyError where one differs
    or where the inputs cannot be checked."""
    try:
        module = importlib.import_module(SOURCE_CHECK)
    except ImportError as error:
        raise VerifyError(
            f"{path}: checking against the source needs the build's install ({error.name} is missing); "
            'pip install "xarray-tfrecords[build]", or verify without source_samples'
        ) from None
    try:
        return module.verify_source(path, samples, seed, split).summary()
    except UserError as error:
        raise VerifyError(str(error)) from None


def _check_index(reader: Reader, shard, sizes: np.ndarray) -> None:
    """The shard's index: well-formed, and every record where it says (``sizes``: the records' framed sizes, read)."""
    name = posixpath.join(reader.path, shard.index)
    try:
        with fsspec.open(name, "rb") as stream:
            index = ShardIndex.parse(stream.read(), name, shard.records, shard.bytes)
    except CorruptRecordError as error:
        raise VerifyError(with_fix(str(error), "build the output again")) from None
    if len(sizes) != len(index.sizes):
        raise VerifyError(
            f"{reader.url(shard)}: {len(sizes)} records, {SCHEMA_FILE} says {shard.records}; build the output again"
        )
    differ = np.flatnonzero(sizes != index.sizes)
    if len(differ):
        line = int(differ[0])
        raise VerifyError(
            f"{name}: line {line + 1} says record {line} is {index.sizes[line]} bytes, the shard's is "
            f"{sizes[line]}; build the output again"
        )


def _read_shard(reader: Reader, shard) -> tuple[int, np.ndarray]:
    """Samples in one shard, every record decoded, and the records' framed sizes (the shard read once).

    Damage becomes a VerifyError.
    """
    lengths: list[int] = []

    def noted(records):
        for record in records:
            lengths.append(len(record))
            yield record

    try:
        found = sum(batch_length(block) for block in reader.decode_records(shard, noted(reader.iter_records(shard))))
    except CorruptRecordError as error:
        raise VerifyError(with_fix(str(error), "the shard is damaged: build the output again")) from None
    return found, np.array(lengths, dtype=np.int64) + FRAMING_BYTES
