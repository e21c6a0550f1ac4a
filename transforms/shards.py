"""WriteBucketedShards: merge each shard's buckets in shuffle-key order, write one TFRecord file atomically.

The writer streams: it holds an index of the shard's records and a few batches of payloads,
never the shard (transforms.buckets.sorting), so its memory stays within ``WriteSpec.writer_budget_bytes``
whatever the shard's size. With ``output.examples_per_record`` N > 1 the sorted samples are
packed N to a record here, a batch at a time: each feature gains a leading axis of N and
``record/count`` says how many rows are real (the last record of a shard may be part empty, its
unused rows zero). The shard is written by ``transforms.files.write_atomically`` (local paths
and gs:// alike).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Iterable, Iterator

import apache_beam as beam
import numpy as np
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics

from planning.run.contracts import BYTES_WRITTEN, METRICS_NAMESPACE, RECORDS_WRITTEN, SHARD_BYTES, ShardResult
from planning.run.progress import mark
from planning.specs import WriteSpec
from schemas.errors import UserError
from schemas.example_codec import ExampleEncoder
from schemas.schema import RECORD_COUNT, Feature
from schemas.shard_index import FrameSizes
from schemas.urls import is_remote
from transforms.buckets.blobs import row_dtype
from transforms.buckets.sorting import BufferLedger, SortedBuckets
from transforms.buckets.spill import SpilledBucket, fetch_spilled
from transforms.compat import use_anonymous_credentials_for_emulator
from transforms.files import write_atomically, write_index

logger = logging.getLogger(__name__)
#: Payload bytes per batch, as a fraction of the writer's budget: a batch of framed records is
#: held about twice (read, then compressed); a batch of packed rows about four times (rows,
#: encoded records, framed records, compressed), beside an index of up to a quarter.
_PLAIN_BATCH_FRACTION = 4
_PACKED_BATCH_FRACTION = 16
#: Spilled buckets fetched at once, as a fraction of the writer's budget (each is then written to local temp).
_FETCH_FRACTION = 4


@dataclasses.dataclass
class Tally:
    records: int = 0
    examples: int = 0
    bytes: int = 0


def pack_rows(features: tuple[Feature, ...], rows: np.ndarray, per_record: int) -> dict[str, np.ndarray]:
    """Columns of packed records: every feature shaped (records, per_record, *shape), plus the counts."""
    n = len(rows)
    records = -(-n // per_record)
    padded = rows
    if n != records * per_record:  # only a shard's last record is part empty: its unused rows are zero
        padded = np.zeros(records * per_record, dtype=rows.dtype)
        padded[:n] = rows
    columns = {f.name: padded[f"f{i}"].reshape((records, per_record, *f.shape)) for i, f in enumerate(features)}
    counts = np.full(records, per_record, dtype=np.int64)
    if records:
        counts[-1] = n - (records - 1) * per_record
    columns[RECORD_COUNT] = counts
    return columns


def framed_chunks(spec: WriteSpec, buckets: SortedBuckets, tally: Tally) -> Iterator[bytes | bytearray]:
    """The shard's framed records in key order, a batch at a time (packed N to a record if N > 1)."""
    per_record = spec.examples_per_record
    if per_record == 1:
        for batch in buckets.batches(spec.writer_budget_bytes // _PLAIN_BATCH_FRACTION):
            tally.records += batch.count
            tally.examples += batch.count
            yield batch.payloads
            del batch  # before the next batch is read
        return
    dtype = row_dtype(spec.features)
    encoder = ExampleEncoder(spec.record_features)
    ledger = buckets.ledger
    # Whole records per batch: every batch but the last holds a multiple of N rows.
    for batch in buckets.batches(spec.writer_budget_bytes // _PACKED_BATCH_FRACTION, multiple=per_record):
        rows = np.frombuffer(batch.payloads, dtype=dtype)
        records = encoder.rows(pack_rows(spec.features, rows, per_record))
        del rows
        encoded = int(records.sizes().sum())
        ledger.hold(2 * encoded)  # the encoder's working arrays, then the framed records
        ledger.release(encoded)
        chunk = b"".join(records.in_order())
        ledger.hold(len(chunk))
        del records
        ledger.release(encoded)
        tally.records += -(-batch.count // per_record)
        tally.examples += batch.count
        del batch
        yield chunk
        ledger.release(len(chunk))
        del chunk


def capped(chunks: Iterable, tally: Tally, limit: int, name: str) -> Iterator:
    """Pass chunks through, counting their bytes; fail once they exceed ``limit``."""
    for chunk in chunks:
        tally.bytes += len(chunk)
        if tally.bytes > limit:
            raise UserError(_too_large(name, tally.bytes, limit, more=True))
        yield chunk
        del chunk


def _too_large(name: str, size: int, limit: int, more: bool = False) -> str:
    written = f"over {size / 1e6:,.1f} MB" if more else f"{size / 1e6:,.1f} MB"
    return (
        f"shard {name}: {written}, above the {limit / 1e6:g} MB a shard may hold; "
        "raise output.num_shards or lower output.target_shard_mb"
    )


def write_shard(
    spec: WriteSpec, shard: int, buckets: Iterable[bytes | str], ledger: BufferLedger | None = None
) -> ShardResult:
    """Write one shard from its buckets (file paths, bytes, or spilled buckets); ``ledger`` counts the bytes held."""
    split, number = spec.split_of_shard(shard)
    path = spec.shard_path(shard)
    name = os.path.basename(path)
    tally = Tally()
    with SortedBuckets(spec.writer_budget_bytes, ledger) as sorted_buckets:
        spilled = []
        for bucket in buckets:
            if isinstance(bucket, SpilledBucket):
                spilled.append(bucket)  # (fetched together below, many ranges at once)
            elif not isinstance(bucket, str):
                sorted_buckets.add_blob(bucket)
            elif is_remote(bucket):
                with FileSystems.open(bucket, compression_type=CompressionTypes.UNCOMPRESSED) as stream:
                    sorted_buckets.add_stream(stream, bucket)
            else:
                sorted_buckets.add_file(bucket)
            del bucket  # a blob's memory is the runner's to release once it is on disk
        for blob in fetch_spilled(spilled, spec.writer_budget_bytes // _FETCH_FRACTION):
            sorted_buckets.add_blob(blob, name=f"shard {name}'s bucket")
            del blob
        if spec.examples_per_record == 1 and sorted_buckets.payload_bytes > spec.max_shard_bytes:
            raise UserError(_too_large(name, sorted_buckets.payload_bytes, spec.max_shard_bytes))
        chunks = capped(framed_chunks(spec, sorted_buckets, tally), tally, spec.max_shard_bytes, name)
        frames = FrameSizes() if spec.compression is None else None  # a gzip shard cannot be read at an offset
        size = write_atomically(path, frames.passing(chunks) if frames else chunks, spec.compression, join_small=False)
    index = write_index(path, chunks=frames.index_chunks()) if frames else None
    return ShardResult(split.name, number, name, tally.records, size, tally.examples, index)


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
