"""A shard's buckets read back in shuffle-key order, holding no more than a fixed budget of bytes.

Only an index of the records stays in memory (key, bucket, payload offset and length: 24 bytes
a record); payloads are read with positioned reads in key order, a batch at a time. When the
index would outgrow half the budget, or too many buckets would be open at once, the records
indexed so far are written in key order to a sorted run in local temp, and the runs are merged
(heapq.merge) at the end, each through a small buffer. Buckets handed over as bytes (the
ranges of spill objects) go to local temp first, so the caller can let them go.
"""

from __future__ import annotations

import dataclasses
import heapq
import operator
import os
import resource
import shutil
import struct
import tempfile
from collections.abc import Iterator
from typing import BinaryIO

import numpy as np

from transforms.buckets.blobs import payload_start, read_bucket_count, read_bucket_entries

#: Index bytes per record while it is sorted: key, bucket, offset and length (24) plus the
#: sort's order (8), one permuted column (8) and slack for the sort's scratch (8).
INDEX_BYTES_PER_RECORD = 48
#: A sorted run's index file: each record's key and payload length, in key order (its payloads
#: are back to back in a file beside it).
_ENTRY = struct.Struct("<QQ")
_ENTRY_DTYPE = np.dtype([("key", "<u8"), ("length", "<u8")])
_MAX_LENGTH = 2**32 - 1
#: Records turned into Python ints at a time (a Python int list takes about 4x its numpy array).
_CHUNK_RECORDS = 512
_DUPLICATE = "duplicate shuffle key in a shard: a sample was cut twice; this is a bug, please report it"


def max_open_files() -> int:
    """Files one writer keeps open at once: an eighth of the process's limit, between 16 and 1024.

    Several writers may run in one process, a thread each; a shard of more buckets spills runs.
    """
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 1024
    return max(16, min(1024, soft // 8))


@dataclasses.dataclass
class BufferLedger:
    """Bytes a writer holds in its own buffers, now and at most, and how many sorted runs it spilled."""

    held: int = 0
    peak: int = 0
    runs: int = 0

    def hold(self, nbytes: int) -> None:
        self.held += nbytes
        self.peak = max(self.peak, self.held)

    def release(self, nbytes: int) -> None:
        self.held -= nbytes


@dataclasses.dataclass(frozen=True)
class Batch:
    """Consecutive records in key order: their payloads back to back, and how many there are."""

    payloads: bytearray
    count: int


@dataclasses.dataclass(frozen=True)
class _Run:
    index_path: str
    data_path: str


class _Index:
    """The records indexed since the last run: key, source (an open bucket), payload offset, length."""

    def __init__(self, ledger: BufferLedger):
        self._ledger = ledger
        self._parts: list[tuple[np.ndarray, ...]] = []
        self.records = 0

    def add(self, keys: np.ndarray, source: int, offsets: np.ndarray, lengths: np.ndarray) -> None:
        n = len(keys)
        part = (np.asarray(keys, np.uint64), np.full(n, source, np.uint32), offsets, lengths.astype(np.uint32))
        self._parts.append(part)
        self._ledger.hold(sum(a.nbytes for a in part))
        self.records += n

    def take_sorted(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Keys, sources, offsets and lengths in key order; the index is empty afterwards.

        Keys are unique by construction (a bijective hash of unique sample ids); a repeat means a
        sample was cut twice, which fails the build rather than writing a duplicate.
        """
        n = self.records
        columns = []
        for i, dtype in enumerate((np.uint64, np.uint32, np.uint64, np.uint32)):
            column = np.concatenate([p[i] for p in self._parts]) if self._parts else np.zeros(0, dtype)
            self._parts = [(*p[:i], None, *p[i + 1 :]) for p in self._parts]  # each column freed once joined
            columns.append(column)
        self._parts, self.records = [], 0
        self._ledger.hold(16 * n)  # the order and the sort's scratch
        order = np.argsort(columns[0])
        self._ledger.release(8 * n)
        for i, column in enumerate(columns):
            self._ledger.hold(column.nbytes)
            columns[i] = column[order]
            self._ledger.release(column.nbytes)
        del order
        self._ledger.release(8 * n)
        keys = columns[0]
        if n > 1 and np.any(keys[1:] == keys[:-1]):
            raise RuntimeError(_DUPLICATE)
        return tuple(columns)


class SortedBuckets:
    """A shard's buckets, added one by one, read back as batches of records in key order.

    Use as a context manager: temporary files and open buckets are released on exit.
    """

    def __init__(
        self,
        budget_bytes: int,
        ledger: BufferLedger | None = None,
        scratch_parent: str | None = None,
        max_open: int | None = None,
    ):
        self.ledger = ledger if ledger is not None else BufferLedger()
        self._half = max(1, budget_bytes // 2)
        self._capacity = max(1, self._half // INDEX_BYTES_PER_RECORD)  # records per sorted run
        self._max_open = max(2, max_open or max_open_files())
        self._index = _Index(self.ledger)
        self._sources: list[tuple[int, str, bool]] = []  # fd, path, whether it is our temporary copy
        self._runs: list[_Run] = []
        self._scratch_parent = scratch_parent
        self._scratch: str | None = None
        self._temporaries = 0
        self.records = 0
        self.payload_bytes = 0

    def __enter__(self) -> SortedBuckets:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._close_sources()
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None

    def add_blob(self, blob: bytes, name: str = "bucket") -> None:
        """A bucket handed over in memory: copied to local temp, so the caller may drop it."""
        path = self._temporary("bucket")
        with open(path, "wb") as stream:
            stream.write(blob)
        self.add_file(path, name=name, owned=True)

    def add_stream(self, stream: BinaryIO, name: str) -> None:
        """A bucket to read from a stream (e.g. a remote file): copied to local temp a buffer at a time."""
        path = self._temporary("bucket")
        size = max(1, self._half // 2)
        self.ledger.hold(size)
        with open(path, "wb") as copy:
            while chunk := stream.read(size):
                copy.write(chunk)
        self.ledger.release(size)
        self.add_file(path, name=name, owned=True)

    def add_file(self, path: str, name: str | None = None, owned: bool = False) -> None:
        """A local bucket file; ``owned``: a temporary copy, deleted once read."""
        name = name or path
        if len(self._sources) >= self._max_open:
            self._spill()
        fd = os.open(path, os.O_RDONLY)
        source = self._register(fd, path, owned)
        count = read_bucket_count(fd, name)
        start = offset = payload_start(count)
        step = max(1, self._capacity // 8)  # the header is read a slice at a time, beside the index
        for first in range(0, count, step):
            n = min(step, count - first)
            if self._index.records and self._index.records + n > self._capacity:
                self._spill(keep=fd)
                source = self._register(fd, path, owned)
            keys, lengths = read_bucket_entries(fd, count, first, n, name)
            ends = np.cumsum(lengths, dtype=np.uint64)
            if n and int(lengths.max()) > _MAX_LENGTH:
                raise ValueError(f"{name}: a record of {int(lengths.max())} bytes; this is not a bucket file")
            offsets = np.empty(n, np.uint64)
            offsets[0:1] = offset
            offsets[1:] = offset + ends[:-1]
            offset += int(ends[-1]) if n else 0
            self._index.add(keys, source, offsets, lengths)
        size = os.fstat(fd).st_size
        if size != offset:
            raise ValueError(f"{name}: truncated bucket ({size - start} payload bytes, expected {offset - start})")
        self.records += count
        self.payload_bytes += offset - start

    def batches(self, max_bytes: int, multiple: int = 1) -> Iterator[Batch]:
        """Every record added, in key order, in batches of about ``max_bytes`` (at least one record).

        Every batch but the last holds a multiple of ``multiple`` records.
        """
        if not self._runs:
            columns = self._index.take_sorted()
            held = sum(c.nbytes for c in columns)
            try:
                for payloads, keys, _ in self._gathered(*columns, max_bytes, multiple):
                    yield Batch(payloads, len(keys))
                    del payloads  # before the next batch is read
            finally:
                del columns
                self.ledger.release(held)
            return
        if self._index.records:
            self._spill()
        self._close_sources()
        fan_in = max(2, self._max_open // 2)  # a run is two open files
        while len(self._runs) > fan_in:
            merged, self._runs = self._runs[:fan_in], self._runs[fan_in:]
            self._runs.append(self._write_run(self._merged(merged)))
        yield from self._assembled(self._merged(self._runs), max_bytes, multiple)

    # -- sources and temporary files

    def _temporary(self, kind: str) -> str:
        if self._scratch is None:
            self._scratch = tempfile.mkdtemp(prefix="xtf-shard-", dir=self._scratch_parent)
        self._temporaries += 1
        return os.path.join(self._scratch, f"{kind}-{self._temporaries:06d}")

    def _register(self, fd: int, path: str, owned: bool) -> int:
        self._sources.append((fd, path, owned))
        return len(self._sources) - 1

    def _close_sources(self, keep: int | None = None) -> None:
        for fd, path, owned in self._sources:
            if fd == keep:
                continue
            os.close(fd)
            if owned:
                os.unlink(path)
        self._sources = []

    # -- reading payloads in key order

    def _gathered(self, keys, sources, offsets, lengths, max_bytes: int, multiple: int):
        """(payloads, keys, lengths) of consecutive batches of the sorted index, read with positioned reads."""
        fds = [fd for fd, _, _ in self._sources]
        ends = np.cumsum(lengths, dtype=np.int64)
        self.ledger.hold(ends.nbytes)
        n, i = len(keys), 0
        while i < n:
            base = int(ends[i - 1]) if i else 0
            j = int(np.searchsorted(ends, base + max_bytes, side="right"))
            count = max(j - i, 1)
            if i + count < n:
                count = max(multiple, count - count % multiple)
            j = min(i + count, n)
            size = int(ends[j - 1]) - base
            payloads = bytearray(size)
            self.ledger.hold(size)
            view = memoryview(payloads)
            position = 0
            for k in range(i, j, _CHUNK_RECORDS):
                chunk = slice(k, min(k + _CHUNK_RECORDS, j))
                for source, offset, length in zip(
                    sources[chunk].tolist(), offsets[chunk].tolist(), lengths[chunk].tolist()
                ):
                    if os.preadv(fds[source], [view[position : position + length]], offset) != length:
                        raise ValueError(f"{self._sources[source][1]}: truncated bucket (a payload ends early)")
                    position += length
            view.release()
            yield payloads, keys[i:j], lengths[i:j]
            del payloads
            self.ledger.release(size)
            i = j
        self.ledger.release(ends.nbytes)

    def _assembled(self, records, max_bytes: int, multiple: int) -> Iterator[Batch]:
        """Batches of about ``max_bytes`` from a stream of (key, payload)."""
        payloads, count = bytearray(), 0
        for _, payload in records:
            payloads += payload
            count += 1
            if len(payloads) >= max_bytes and count % multiple == 0:
                size = len(payloads)
                self.ledger.hold(size)
                yield Batch(payloads, count)
                self.ledger.release(size)
                payloads, count = bytearray(), 0
        if count:
            yield Batch(payloads, count)

    # -- sorted runs

    def _spill(self, keep: int | None = None) -> None:
        """Write the records indexed so far to a sorted run; close their buckets, but ``keep``."""
        columns = self._index.take_sorted()
        held = sum(c.nbytes for c in columns)
        index_path, data_path = self._temporary("run-index"), self._temporary("run-data")
        with open(index_path, "wb") as index, open(data_path, "wb", buffering=0) as data:
            for payloads, keys, lengths in self._gathered(*columns, self._half // 2, 1):
                data.write(payloads)
                del payloads  # before the next batch is read
                entries = np.empty(len(keys), _ENTRY_DTYPE)
                entries["key"], entries["length"] = keys, lengths
                index.write(entries.tobytes())
        del columns
        self.ledger.release(held)
        self._close_sources(keep)
        self._runs.append(_Run(index_path, data_path))
        self.ledger.runs += 1

    def _write_run(self, records) -> _Run:
        """A run of a merged stream of (key, payload)."""
        index_path, data_path = self._temporary("run-index"), self._temporary("run-data")
        buffer = max(1, self._half // 4)
        self.ledger.hold(2 * buffer)
        with open(index_path, "wb", buffering=buffer) as index, open(data_path, "wb", buffering=buffer) as data:
            for key, payload in records:
                index.write(_ENTRY.pack(key, len(payload)))
                data.write(payload)
        self.ledger.release(2 * buffer)
        return _Run(index_path, data_path)

    def _merged(self, runs: list[_Run]) -> Iterator[tuple[int, memoryview]]:
        """The records of sorted runs in key order, each run read through a buffer of its share of half the budget."""
        share = max(1, self._half // 2 // len(runs))
        readers = [self._read_run(run, share) for run in runs]
        previous = None
        for key, payload in heapq.merge(*readers, key=operator.itemgetter(0)):
            if key == previous:
                raise RuntimeError(_DUPLICATE)
            previous = key
            yield key, payload
        for run in runs:
            os.unlink(run.index_path)
            os.unlink(run.data_path)

    def _read_run(self, run: _Run, share: int) -> Iterator[tuple[int, memoryview]]:
        """A run's (key, payload) in order, reading about ``share`` bytes at a time (at least one record)."""
        entries_per_read = max(1, share // 4 // _ENTRY.size)
        index_fd, data_fd = os.open(run.index_path, os.O_RDONLY), os.open(run.data_path, os.O_RDONLY)
        index_at = data_at = 0
        pending = np.zeros(0, _ENTRY_DTYPE)
        try:
            while True:
                if not len(pending):
                    raw = os.pread(index_fd, entries_per_read * _ENTRY.size, index_at)
                    if not raw:
                        return
                    index_at += len(raw)
                    pending = np.frombuffer(raw, _ENTRY_DTYPE)
                ends = np.cumsum(pending["length"], dtype=np.int64)
                take = max(1, int(np.searchsorted(ends, share // 2, side="right")))
                size = int(ends[take - 1])
                data = os.pread(data_fd, size, data_at)
                if len(data) != size:
                    raise ValueError(f"{run.data_path}: truncated run")
                data_at += size
                self.ledger.hold(size + entries_per_read * _ENTRY.size)
                view, position = memoryview(data), 0
                for k in range(0, take, _CHUNK_RECORDS):
                    chunk = pending[k : min(k + _CHUNK_RECORDS, take)]
                    for key, length in zip(chunk["key"].tolist(), chunk["length"].tolist()):
                        yield key, view[position : position + length]
                        position += length
                pending = pending[take:]
                del view, data
                self.ledger.release(size + entries_per_read * _ENTRY.size)
        finally:
            os.close(index_fd)
            os.close(data_fd)
