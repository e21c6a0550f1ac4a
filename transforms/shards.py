"""WriteBucketedShards: merge each shard's buckets, sort by shuffle key, write one TFRecord file atomically.

With ``output.examples_per_record`` N > 1 the sorted samples are packed N to a record here:
each feature gains a leading axis of N and ``record/count`` says how many rows are real (the
last record of a shard may be part empty, its unused rows zero). Every file the stages write
goes through ``write_atomically`` here (Beam's FileSystems: local paths and gs:// alike).
"""

from __future__ import annotations

import dataclasses
import os
import uuid
from collections.abc import Iterable

import apache_beam as beam
import numpy as np
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics

from planning.contracts import BYTES_WRITTEN, METRICS_NAMESPACE, RECORDS_WRITTEN, SHARD_BYTES, ShardResult
from planning.names import join, temporary_path
from planning.progress import mark
from planning.specs import WriteSpec
from schemas.buckets import row_dtype, unpack_bucket
from schemas.example_codec import ExampleEncoder
from schemas.schema import RECORD_COUNT, Feature
from schemas.tfrecord import frame
from schemas.urls import is_remote


def sorted_payloads(buckets: Iterable[bytes | str]) -> tuple[list[memoryview], np.ndarray]:
    """All payloads of a shard's buckets in shuffle-key order, and their keys.

    A bucket is its bytes or the path of its file. Keys are unique by construction (a
    bijective hash of unique sample ids); a repeat means a sample was cut twice, which fails
    the build rather than writing a duplicate.
    """
    all_keys, payloads = [], []
    for bucket in buckets:
        blob = read_bytes(bucket) if isinstance(bucket, str) else bucket
        keys, lengths, payload = unpack_bucket(blob, name=bucket if isinstance(bucket, str) else "bucket")
        ends = np.cumsum(lengths, dtype=np.int64).tolist()
        starts = [0, *ends[:-1]]
        payloads.extend(payload[s:e] for s, e in zip(starts, ends))
        all_keys.append(keys)
    keys = np.concatenate(all_keys) if all_keys else np.zeros(0, np.uint64)
    order = np.argsort(keys, kind="stable")
    keys = keys[order]
    if len(keys) > 1 and np.any(keys[1:] == keys[:-1]):
        raise RuntimeError("duplicate shuffle key in a shard: a sample was cut twice; this is a bug, please report it")
    return [payloads[i] for i in order.tolist()], keys


def pack_rows(features: tuple[Feature, ...], rows: np.ndarray, per_record: int) -> dict[str, np.ndarray]:
    """Columns of packed records: every feature shaped (records, per_record, *shape), plus the counts."""
    n = len(rows)
    records = -(-n // per_record)
    padded = np.zeros(records * per_record, dtype=rows.dtype)
    padded[:n] = rows
    columns = {f.name: padded[f"f{i}"].reshape((records, per_record, *f.shape)) for i, f in enumerate(features)}
    counts = np.full(records, per_record, dtype=np.int64)
    if records:
        counts[-1] = n - (records - 1) * per_record
    columns[RECORD_COUNT] = counts
    return columns


def framed_records(spec: WriteSpec, payloads: list[memoryview]) -> tuple[list, int]:
    """The shard's framed records in order, and the number of samples they hold."""
    per_record = spec.examples_per_record
    if per_record == 1:
        return payloads, len(payloads)
    features = spec.features
    rows = np.frombuffer(b"".join(payloads), dtype=row_dtype(features))
    encoder = ExampleEncoder(spec.record_features)
    records = encoder.encode(pack_rows(features, rows, per_record)) if len(rows) else []
    return [frame(r) for r in records], len(rows)


def write_shard(spec: WriteSpec, shard: int, buckets: Iterable[bytes | str]) -> ShardResult:
    split, number = spec.split_of_shard(shard)
    payloads, _ = sorted_payloads(buckets)
    records, examples = framed_records(spec, payloads)
    path = spec.shard_path(shard)
    # Records go to the file one by one: joining them first would copy the shard once more.
    size = write_atomically(path, records, spec.compression)
    return ShardResult(split.name, number, os.path.basename(path), len(records), size, examples)


class _WriteShardFn(beam.DoFn):
    def __init__(self, spec: WriteSpec):
        self._spec = spec
        self._records = Metrics.counter(METRICS_NAMESPACE, RECORDS_WRITTEN)
        self._bytes = Metrics.counter(METRICS_NAMESPACE, BYTES_WRITTEN)
        self._shard_bytes = Metrics.distribution(METRICS_NAMESPACE, SHARD_BYTES)

    def setup(self):
        use_anonymous_credentials_for_emulator()

    def process(self, element):
        shard, buckets = element
        result = write_shard(self._spec, shard, buckets)
        self._records.inc(result.records)
        self._bytes.inc(result.bytes)
        self._shard_bytes.update(result.bytes)
        mark(self._spec.progress_dir, "shard", shard, records=result.examples, bytes=result.bytes)
        yield result


@dataclasses.dataclass
class WriteBucketedShards(beam.PTransform):
    """(shard number, bucket) pairs -> one written TFRecord file per shard -> ShardResult."""

    spec: WriteSpec

    def expand(self, buckets):
        return buckets | "GroupByShard" >> beam.GroupByKey() | "WriteShard" >> beam.ParDo(_WriteShardFn(self.spec))


_WRITE_BYTES = 8 * 2**20


def _batched(chunks, size: int = _WRITE_BYTES):
    """Join small chunks into writes of about ``size`` bytes; pass large ones through uncopied."""
    pending: list = []
    pending_bytes = 0
    for chunk in chunks:
        if len(chunk) >= size:
            if pending:
                yield b"".join(pending)
                pending, pending_bytes = [], 0
            yield chunk
            continue
        pending.append(chunk)
        pending_bytes += len(chunk)
        if pending_bytes >= size:
            yield b"".join(pending)
            pending, pending_bytes = [], 0
    if pending:
        yield b"".join(pending)


def write_atomically(path: str, chunks, compression: str | None = None) -> int:
    """Write bytes chunks to a temporary name beside ``path``, then rename; returns the file's size.

    ``compression="gzip"`` writes one gzip stream (what TensorFlow's GZIP TFRecord reader expects).
    """
    temporary = temporary_path(path, uuid.uuid4().hex[:8])
    written = 0
    kind = CompressionTypes.GZIP if compression == "gzip" else CompressionTypes.UNCOMPRESSED
    stream = FileSystems.create(temporary, compression_type=kind)
    try:
        for chunk in _batched(chunks):
            stream.write(chunk)
            written += len(chunk)
    except BaseException:
        stream.close()
        FileSystems.delete([temporary])
        raise
    stream.close()
    if FileSystems.exists(path):
        FileSystems.delete([path])
    FileSystems.rename([temporary], [path])
    if compression is None:
        return written
    return FileSystems.match([path])[0].metadata_list[0].size_in_bytes


def remove_tree(path: str) -> None:
    """Delete a file or a directory with everything under it; on object stores, every object under the prefix."""
    if is_remote(path):
        found = [m.path for m in FileSystems.match([join(path, "**")])[0].metadata_list]
        if found:
            FileSystems.delete(found)
    if FileSystems.exists(path):
        FileSystems.delete([path])


def read_bytes(path: str) -> bytes:
    with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as stream:
        return stream.read()


def use_anonymous_credentials_for_emulator() -> bool:
    """Tell Beam's GCS filesystem there are no credentials to find when a storage emulator is configured.

    google-cloud-storage already uses anonymous credentials when STORAGE_EMULATOR_HOST is set,
    but Beam first looks for Google credentials itself and retries for about 25 s per process
    before giving up. Called by the driver and by every DoFn that writes files, in setup(); does
    nothing without the variable.
    """
    if not os.environ.get("STORAGE_EMULATOR_HOST"):
        return False
    from apache_beam.internal.gcp import auth

    cache = getattr(auth, "_Credentials", None)
    if cache is None or not hasattr(cache, "_credentials_init"):
        return False  # a Beam version that looks credentials up differently: nothing to skip
    with cache._credentials_lock:
        cache._credentials = None
        cache._credentials_init = True
    return True
