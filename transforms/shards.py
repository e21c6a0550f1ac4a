"""WriteBucketedShards: merge each shard's buckets in shuffle-key order, write one TFRecord file atomically.

The writer streams: it holds an index of the shard's records and a few batches of payloads,
never the shard (schemas.bucket_sort), so its memory stays within ``WriteSpec.writer_budget_bytes``
whatever the shard's size. With ``output.examples_per_record`` N > 1 the sorted samples are
packed N to a record here, a batch at a time: each feature gains a leading axis of N and
``record/count`` says how many rows are real (the last record of a shard may be part empty, its
unused rows zero). Every file the stages write goes through ``write_atomically`` here (Beam's
FileSystems: local paths and gs:// alike).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import logging
import os
import shutil
import stat
from collections.abc import Iterable, Iterator

import apache_beam as beam
import numpy as np
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics

from planning.run.cancellation import check_cancelled, writing
from planning.run.contracts import BYTES_WRITTEN, METRICS_NAMESPACE, RECORDS_WRITTEN, SHARD_BYTES, ShardResult
from planning.run.names import join, new_temporary_token, temporary_path
from planning.run.progress import mark
from planning.specs import WriteSpec
from schemas.bucket_sort import BufferLedger, SortedBuckets
from schemas.buckets import row_dtype
from schemas.errors import UserError
from schemas.example_codec import ExampleEncoder
from schemas.schema import RECORD_COUNT, Feature
from schemas.tfrecord import frame_parts
from schemas.urls import is_remote

logger = logging.getLogger(__name__)
#: Payload bytes per batch, as a fraction of the writer's budget: a batch of framed records is
#: held about twice (read, then compressed); a batch of packed rows about four times (rows,
#: encoded records, framed records, compressed), beside an index of up to a quarter.
_PLAIN_BATCH_FRACTION = 4
_PACKED_BATCH_FRACTION = 16


@dataclasses.dataclass
class _Tally:
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


def framed_chunks(spec: WriteSpec, buckets: SortedBuckets, tally: _Tally) -> Iterator[bytes | bytearray]:
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
        records = encoder.encode(pack_rows(spec.features, rows, per_record))
        del rows
        encoded = sum(map(len, records))
        ledger.hold(2 * encoded)  # the encoder's working array, then the records
        ledger.release(encoded)
        chunk = b"".join(part for record in records for part in frame_parts(record))
        ledger.hold(len(chunk))
        del records
        ledger.release(encoded)
        tally.records += -(-batch.count // per_record)
        tally.examples += batch.count
        del batch
        yield chunk
        ledger.release(len(chunk))
        del chunk


def _capped(chunks: Iterable, tally: _Tally, limit: int, name: str) -> Iterator:
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
    """Write one shard from its buckets (file paths or bytes); ``ledger`` counts the bytes held."""
    split, number = spec.split_of_shard(shard)
    path = spec.shard_path(shard)
    name = os.path.basename(path)
    tally = _Tally()
    with SortedBuckets(spec.writer_budget_bytes, ledger) as sorted_buckets:
        for bucket in buckets:
            if not isinstance(bucket, str):
                sorted_buckets.add_blob(bucket)
            elif is_remote(bucket):
                with FileSystems.open(bucket, compression_type=CompressionTypes.UNCOMPRESSED) as stream:
                    sorted_buckets.add_stream(stream, bucket)
            else:
                sorted_buckets.add_file(bucket)
            del bucket  # a blob's memory is the runner's to release once it is on disk
        if spec.examples_per_record == 1 and sorted_buckets.payload_bytes > spec.max_shard_bytes:
            raise UserError(_too_large(name, sorted_buckets.payload_bytes, spec.max_shard_bytes))
        chunks = _capped(framed_chunks(spec, sorted_buckets, tally), tally, spec.max_shard_bytes, name)
        size = write_atomically(path, chunks, spec.compression, join_small=False)
    return ShardResult(split.name, number, name, tally.records, size, tally.examples)


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
#: Bytes handed to the compressor at a time: zlib builds each call's output in blocks and then
#: joins them, so a large write would briefly hold its compressed size twice.
_COMPRESS_BYTES = 2**16


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


def write_atomically(path: str, chunks, compression: str | None = None, join_small: bool = True) -> int:
    """Write bytes chunks to a temporary name beside ``path``, then rename; returns the file's size.

    ``compression="gzip"`` writes one gzip stream (what TensorFlow's GZIP TFRecord reader expects);
    its bytes do not depend on how the data is cut into chunks. ``join_small``: join small chunks
    into writes of about 8 MB (pass False when the chunks are batches already).
    """
    with writing():  # an interrupted build waits for this write to end, then removes the run's files
        return _write_atomically(path, chunks, compression, join_small)


def _write_atomically(path: str, chunks, compression: str | None, join_small: bool) -> int:
    temporary = temporary_path(path, new_temporary_token())
    written = 0
    kind = CompressionTypes.GZIP if compression == "gzip" else CompressionTypes.UNCOMPRESSED
    stream = FileSystems.create(temporary, compression_type=kind)
    try:
        try:
            for chunk in _batched(chunks) if join_small else chunks:
                check_cancelled()
                if compression is None:
                    stream.write(chunk)
                else:
                    with memoryview(chunk) as view:
                        for start in range(0, len(view), _COMPRESS_BYTES):
                            stream.write(view[start : start + _COMPRESS_BYTES])
                written += len(chunk)
                del chunk  # let it go before the next chunk is made
        except BaseException:
            with contextlib.suppress(Exception):  # the write's error is the one to report
                stream.close()
            raise
        stream.close()  # a full disk may show only here, when the last bytes are flushed
        if FileSystems.exists(path):
            FileSystems.delete([path])
        FileSystems.rename([temporary], [path])
    except BaseException:
        # Whatever failed (a write, the flush at close, the rename), no temporary is left behind:
        # a rerun would otherwise meet it.
        try:
            if FileSystems.exists(temporary):
                FileSystems.delete([temporary])
        except Exception as error:  # the write's error is the one to report
            logger.warning("could not remove %s: %s", temporary, error)
        raise
    if compression is None:
        return written
    return FileSystems.match([path])[0].metadata_list[0].size_in_bytes


def remove_tree(path: str, inside: str | None = None) -> None:
    """Delete a file or a directory with everything under it; on object stores, every object under the prefix.

    Locally no link is ever followed: a link is removed itself, never what it points to, and a
    link on the way from ``inside`` (default: the parent of ``path``) to ``path`` is an error.
    """
    if is_remote(path):
        found = [m.path for m in FileSystems.match([join(path, "**")])[0].metadata_list]
        if found:
            FileSystems.delete(found)
        if FileSystems.exists(path):
            FileSystems.delete([path])
        return
    base = inside if inside is not None else os.path.dirname(os.path.abspath(path))
    parts = os.path.relpath(os.path.abspath(path), os.path.abspath(base)).split(os.sep)
    if parts[0] in (os.curdir, os.pardir) or os.pardir in parts:
        raise ValueError(f"{path} is not inside {base}: not removed")
    try:
        directory = os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    try:
        for part in parts[:-1]:
            try:
                inner = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=directory)
            except FileNotFoundError:
                return
            except OSError as error:
                if error.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                raise UserError(
                    f"{path}: {part} on the way to it is a link or a file, not a directory this tool made; "
                    "remove it by hand"
                ) from None
            os.close(directory)
            directory = inner
        try:
            info = os.stat(parts[-1], dir_fd=directory, follow_symlinks=False)
        except FileNotFoundError:
            return
        if stat.S_ISDIR(info.st_mode):
            shutil.rmtree(parts[-1], dir_fd=directory)  # descends by descriptors, never through a link
        else:
            os.unlink(parts[-1], dir_fd=directory)
    finally:
        os.close(directory)


def remove_if_empty(directory: str) -> None:
    """Remove a local directory left empty (object stores have no directories)."""
    if not is_remote(directory):
        with contextlib.suppress(OSError):  # missing, or holds something: leave it
            os.rmdir(directory)


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
