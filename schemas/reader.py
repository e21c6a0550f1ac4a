"""Reads an output's records with numpy alone (PyTorch, JAX, checks): CRCs verified, features decoded.

    from schemas.reader import Reader
    reader = Reader("out/patches", split="data")      # local path or any fsspec URL (gs://...)
    for sample in reader: ...                         # {name: array of the feature's dtype and shape}
    for batch in reader.iter_batches(64): ...         # {name: array of shape (64, *feature shape)}

Shards are read in written order (the records are fully shuffled on disk already); use
``shuffled`` or the torch dataset for a fresh order per epoch.
"""

from __future__ import annotations

import dataclasses
import gzip
import io
import posixpath
import zlib
from collections.abc import Iterable, Iterator, Sequence
from typing import TypeVar

import fsspec
import numpy as np

from schemas.errors import UserError
from schemas.metadata import load_schema, normalization_constants
from schemas.record_decoder import ExampleDecoder
from schemas.schema import RECORD_COUNT, Schema, Shard
from schemas.shards import shard_counts
from schemas.tfrecord import CorruptRecordError, read_records
from schemas.urls import check_regular_file, is_remote

#: Records decoded together: large enough to amortise numpy calls, small enough for any memory.
DEFAULT_CHUNK = 256
_READ_BLOCK = 16 * 2**20
_COMPRESSION = {None: None, "gzip": "gzip"}
T = TypeVar("T")

Batch = dict[str, np.ndarray]


def shard_url(path: str, shard: Shard) -> str:
    """Where a shard of the output at ``path`` lives (local path or URL)."""
    return posixpath.join(str(path), shard.file)


def open_shard(url: str, compression: str | None):
    """A binary stream of a shard's TFRecord bytes (decompressed), via fsspec."""
    if compression not in _COMPRESSION:
        raise UserError(f"{url}: compression {compression!r} is not supported (only gzip or none); update the reader")
    check_regular_file(url)  # a FIFO in a shard's place would block the read for ever
    try:
        stream = fsspec.open(url, "rb", compression=_COMPRESSION[compression]).open()
        # Records are read in order, a few bytes at a time: ask a remote filesystem for big
        # sequential chunks, or every small read waits on a request of its own.
        return io.BufferedReader(stream, buffer_size=_READ_BLOCK) if is_remote(url) else stream
    except FileNotFoundError:
        raise UserError(
            f"{url}: shard listed in schema.json is missing; the output is incomplete or was moved: build it again"
        ) from None


def iter_shard_records(url: str, shard: Shard, compression: str | None, verify: bool = True) -> Iterator[bytes]:
    """The serialized records of one shard, CRCs checked, and their number checked against the schema."""
    count = 0
    with open_shard(url, compression) as stream:
        try:
            size = shard.bytes if compression is None else None  # (gzip: schema.json gives the compressed size)
            for record in read_records(stream, verify=verify, name=url, size=size):
                count += 1
                yield record
        except (EOFError, gzip.BadGzipFile, zlib.error) as error:  # a gzip stream cut short or damaged
            raise CorruptRecordError(f"{url}: record {count}: {error}") from None
    if count != shard.records:
        raise CorruptRecordError(f"{url}: {count} records, but schema.json says {shard.records}")


def _chunks(records: Iterable[bytes], size: int) -> Iterator[list[bytes]]:
    chunk: list[bytes] = []
    for record in records:
        chunk.append(record)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def unpack(records: Batch, examples_per_record: int) -> Batch:
    """Packed records (every feature with a leading axis of N, plus RECORD_COUNT) -> the real samples."""
    counts = records.pop(RECORD_COUNT)
    if np.any((counts < 0) | (counts > examples_per_record)):
        bad = int(counts[(counts < 0) | (counts > examples_per_record)][0])
        raise ValueError(f"{RECORD_COUNT} is {bad}, outside 0..{examples_per_record}")
    real = np.arange(examples_per_record) < counts[:, None]
    return {name: values[real] for name, values in records.items()}


def batch_length(batch: Batch) -> int:
    return len(next(iter(batch.values()))) if batch else 0


class Reader:
    """The samples of one split of an output, decoded to numpy, shard after shard in written order.

    Needs no TensorFlow: every CRC and every shard's record count is checked, and each feature is decoded with its
    declared dtype and shape, value for value what ``tf.io.parse_example`` returns.

    Args:
        path: the output's folder, a local path or an fsspec URL.
        split: the split to read (``"data"`` for a build without ``splits:``).
        schema: the output's schema, if already loaded.
        verify: check each record's CRCs as it is read.
        normalize: True: ``(x - mean) / std`` with stats.json's constants; ``"tendency"``: targets as residuals.
        normalized_fill: with ``normalize``, the value of the points nan_policy: fill filled.

    Raises:
        UserError: no complete output at ``path``, a split it does not hold, or a damaged shard (named, with the
            record at fault) when it is read.
    """

    def __init__(
        self,
        path: str,
        split: str = "data",
        *,
        schema: Schema | None = None,
        verify: bool = True,
        normalize: bool | str = False,
        normalized_fill: float = 0.0,
    ):
        """``normalize``: float features as (x - mean) / std with the output's stats.json constants, in
        float32 as the TensorFlow parser computes them, then the points nan_policy: fill filled set
        to ``normalized_fill``, found as that parser finds them; ``"tendency"``: the same, with the
        ``targets`` role's features as residuals, (x - x_before - mean) / std of x(t+1) - x(t)."""
        self.path = str(path).rstrip("/") or "/"
        self.schema = schema if schema is not None else load_schema(self.path)
        if split not in self.schema.splits:
            splits = ", ".join(self.schema.splits) or "none"
            raise UserError(f"{self.path}: no split {split!r}; it has: {splits}; choose one of those")
        self.schema.check_has_samples(split, self.path)
        self.split = split
        self.shards: Sequence[Shard] = self.schema.splits[split]
        self.features = self.schema.features
        self.verify = verify
        self._decoder = ExampleDecoder(self.schema.record_features())
        self._normalization = _normalization(self.path, normalize) if normalize else {}
        names = {f.name for f in self.features}
        for name, normalizer in self._normalization.items():
            if normalizer.mask is not None and normalizer.mask not in names:
                raise UserError(
                    f"{self.path}: stats.json finds the filled points of {name!r} by the feature {normalizer.mask!r}, "
                    "which schema.json lacks; rebuild the output, or read without normalize"
                )
        self._normalized_fill = np.float32(normalized_fill)

    @property
    def num_records(self) -> int:
        """TFRecord records in the split (samples, unless records are packed)."""
        return int(shard_counts(self.shards, "records").sum())

    def url(self, shard: Shard) -> str:
        return shard_url(self.path, shard)

    def iter_records(self, shard: Shard) -> Iterator[bytes]:
        """One shard's serialized records."""
        return iter_shard_records(self.url(shard), shard, self.schema.compression, self.verify)

    def iter_chunks(self, shards: Sequence[Shard] | None = None, chunk: int = DEFAULT_CHUNK) -> Iterator[Batch]:
        """Decoded samples in blocks of up to ``chunk`` records: {name: (samples, *shape)}."""
        for shard in self.shards if shards is None else shards:
            yield from self.decode_records(shard, self.iter_records(shard), chunk)

    def decode_records(self, shard: Shard, records: Iterable[bytes], chunk: int = DEFAULT_CHUNK) -> Iterator[Batch]:
        """``iter_chunks`` of one shard whose serialized records come from ``records`` (e.g. noted on the way)."""
        first = 0
        for batch in _chunks(records, chunk):
            try:
                block = self._decoder.decode_batch(batch, first_index=first)
                if self.schema.examples_per_record > 1:
                    block = unpack(block, self.schema.examples_per_record)
                stored = dict(block)  # (a residual's x_before is another feature as stored)
                for name, normalizer in self._normalization.items():
                    block[name] = normalizer.apply(stored, name, self._normalized_fill)
            except ValueError as error:
                raise CorruptRecordError(f"{self.url(shard)}: {error}") from None
            first += len(batch)
            yield block

    def iter_examples(self, shards: Sequence[Shard] | None = None) -> Iterator[Batch]:
        """One {name: array} per sample; the arrays are views of a decoded block (copy to keep many)."""
        for block in self.iter_chunks(shards):
            items = list(block.items())
            for i in range(batch_length(block)):
                yield {name: values[i, ...] for name, values in items}

    def __iter__(self) -> Iterator[Batch]:
        return self.iter_examples()

    def iter_batches(
        self, batch_size: int, drop_remainder: bool = False, shards: Sequence[Shard] | None = None
    ) -> Iterator[Batch]:
        """{name: array of shape (batch_size, *feature shape)}; the last batch may be smaller."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, not {batch_size}")
        return rebatch(self.iter_chunks(shards, chunk=min(batch_size, 4 * DEFAULT_CHUNK)), batch_size, drop_remainder)

    def read_all(self, shards: Sequence[Shard] | None = None) -> Batch:
        """Every sample of the split (or of ``shards``) in one dict of arrays: for small outputs."""
        blocks = list(self.iter_chunks(shards))
        if not blocks:
            return {f.name: np.zeros((0, *f.shape), f.dtype) for f in self.features}
        return {f.name: np.concatenate([b[f.name] for b in blocks]) for f in self.features}


@dataclasses.dataclass(frozen=True)
class _Normalizer:
    """One feature's stats.json normalisation: mean and std, and how its filled points are found."""

    mean: np.ndarray
    std: np.ndarray
    mask: str | None = None  # the feature's nan_mask
    equal_to: np.float32 | None = None  # else: values equal to the fill value ...
    where: np.ndarray | None = None  # ... where no real value equals it
    #: normalize="tendency": the feature holding x_before and the indices taking it, per axis (after the sample's)
    residual_of: dict | None = None

    def apply(self, block: Batch, name: str, fill: np.float32) -> np.ndarray:
        values = x = block[name]
        if self.residual_of is not None:
            before = block[self.residual_of["feature"]]
            for axis, indices in self.residual_of["take"]:
                before = np.take(before, indices, axis=axis + 1)
            x = values - before
        normalized = (x - self.mean) / self.std
        if self.mask is not None:
            return np.where(block[self.mask] != 0, fill, normalized)
        if self.where is not None:
            return np.where((values == self.equal_to) & self.where, fill, normalized)
        return normalized


def _normalization(path: str, normalize: bool | str = True) -> dict[str, _Normalizer]:
    """Each float feature's normaliser, its constants float32 arrays that broadcast against a batch."""
    normalization = normalization_constants(path, normalize)
    out = {}
    for name, values in normalization.items():
        filled = values.get("filled") or {}
        out[name] = _Normalizer(
            np.asarray(values["mean"], np.float32),
            np.asarray(values["std"], np.float32),
            filled.get("mask"),
            None if "equal_to" not in filled else np.float32(filled["equal_to"]),
            None if "where" not in filled else np.asarray(filled["where"], dtype=bool),
            values.get("residual_of"),
        )
    return out


def rebatch(blocks: Iterable[Batch], batch_size: int, drop_remainder: bool = False) -> Iterator[Batch]:
    """Blocks of any length -> batches of exactly ``batch_size`` (the last may be smaller)."""
    pending: list[Batch] = []
    have = 0
    for block in blocks:
        if not batch_length(block):
            continue
        pending.append(block)
        have += batch_length(block)
        while have >= batch_size:
            merged = _concat(pending)
            yield {name: values[:batch_size] for name, values in merged.items()}
            rest = {name: values[batch_size:] for name, values in merged.items()}
            have -= batch_size
            pending = [rest] if have else []
    if have and not drop_remainder:
        yield _concat(pending)


def _concat(blocks: list[Batch]) -> Batch:
    if len(blocks) == 1:
        return blocks[0]
    return {name: np.concatenate([b[name] for b in blocks]) for name in blocks[0]}


def shuffled(items: Iterable[T], buffer_size: int, rng: np.random.Generator) -> Iterator[T]:
    """Items in a random order drawn from a buffer of ``buffer_size`` (as tf.data's shuffle does)."""
    if buffer_size <= 1:
        yield from items
        return
    buffer: list[T] = []
    for item in items:
        if len(buffer) < buffer_size:
            buffer.append(item)
            continue
        i = int(rng.integers(buffer_size))
        yield buffer[i]
        buffer[i] = item
    rng.shuffle(buffer)
    yield from buffer


def read_split(path: str, split: str = "data") -> Batch:
    """Every sample of a split as one dict of numpy arrays (for small outputs and checks).

    Args:
        path: the output's folder, a local path or an fsspec URL.
        split: the split to read.

    Returns:
        ``{feature name: array}``, each array shaped (samples, *feature shape).
    """
    return Reader(path, split).read_all()
