"""A shard's record index, ``<shard>.tfindex``: a line ``"{offset} {size}"`` per record (DALI's, tfrecord's format).

``offset`` is the byte where the record's 8-byte length starts and ``size`` the whole framed
record (16 bytes of framing plus its data). The index is read from disk, so it is checked
against the shard it describes before any offset in it is used.
"""

from __future__ import annotations

import dataclasses
import tempfile

import numpy as np

from schemas.tfrecord import FOOTER_BYTES, HEADER_BYTES, CorruptRecordError

INDEX_SUFFIX = ".tfindex"
FRAMING_BYTES = HEADER_BYTES + FOOTER_BYTES


def index_name(shard_file: str) -> str:
    """The index file beside a shard."""
    return shard_file + INDEX_SUFFIX


def index_lines(sizes) -> bytes:
    """The index of records of these framed sizes, written one after another from byte 0."""
    sizes = np.asarray(sizes, dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]) if len(sizes) else sizes
    return "".join(f"{o} {s}\n" for o, s in zip(offsets.tolist(), sizes.tolist())).encode()


@dataclasses.dataclass(frozen=True)
class ShardIndex:
    """Where each record of one shard starts, and its framed size."""

    offsets: np.ndarray  # int64
    sizes: np.ndarray  # int64

    def __len__(self) -> int:
        return len(self.offsets)

    @classmethod
    def parse(cls, data: bytes, name: str, records: int, shard_bytes: int) -> ShardIndex:
        """The index in ``data``, checked to describe a shard of ``records`` records in ``shard_bytes`` bytes."""
        try:
            values = np.array(data.split(), dtype=np.int64)
        except (ValueError, OverflowError):
            raise CorruptRecordError(f"{name}: not an index (lines of two whole numbers); rebuild the output") from None
        lines = data.count(b"\n")
        if len(values) != 2 * records or lines != records:
            raise CorruptRecordError(f"{name}: {lines} lines for a shard of {records} records; rebuild the output")
        index = cls(values[0::2].copy(), values[1::2].copy())
        index.check(name, shard_bytes)
        return index

    def check(self, name: str, shard_bytes: int) -> None:
        """CorruptRecordError unless the records tile the shard from byte 0 to its end, each at least a frame."""
        if not len(self):
            if shard_bytes:
                raise CorruptRecordError(f"{name}: no record for a shard of {shard_bytes} bytes; rebuild the output")
            return
        ends = self.offsets + self.sizes
        bad = np.flatnonzero((self.sizes < FRAMING_BYTES) | (self.offsets != np.concatenate([[0], ends[:-1]])))
        if len(bad):
            i = int(bad[0])
            raise CorruptRecordError(
                f"{name}: line {i + 1} ({self.offsets[i]} {self.sizes[i]}) does not follow the record before it; "
                "rebuild the output"
            )
        if int(ends[-1]) != shard_bytes:
            raise CorruptRecordError(
                f"{name}: its records end at byte {int(ends[-1])}, the shard at {shard_bytes}; rebuild the output"
            )


def load_index(url: str, records: int, shard_bytes: int, read_at=None) -> ShardIndex:
    """A shard's index from its ``.tfindex`` file, checked against the shard; where there is none, found by
    walking the shard's headers through ``read_at(offset, size) -> bytes`` (without it: FileNotFoundError)."""
    import fsspec

    from schemas.urls import check_regular_file

    check_regular_file(index_name(url))  # a FIFO in the index's place would block the read for ever
    try:
        with fsspec.open(index_name(url), "rb") as stream:
            data = stream.read()
    except FileNotFoundError:
        if read_at is None:
            raise
        return scan_index(read_at, shard_bytes, records, url)
    return ShardIndex.parse(data, index_name(url), records, shard_bytes)


def scan_index(read_at, shard_bytes: int, records: int, name: str) -> ShardIndex:
    """The index of a shard found by walking its length headers (``read_at(offset, size) -> bytes``)."""
    offsets = np.empty(records, dtype=np.int64)
    sizes = np.empty(records, dtype=np.int64)
    offset = 0
    for i in range(records):
        header = read_at(offset, 8)
        if len(header) < 8:
            raise CorruptRecordError(f"{name}: record {i}: truncated header")
        offsets[i] = offset
        sizes[i] = int.from_bytes(header, "little") + FRAMING_BYTES
        offset += int(sizes[i])
    index = ShardIndex(offsets, sizes)
    index.check(name, shard_bytes)
    return index


class FrameSizes:
    """A shard's index, from the length headers of its TFRecord bytes as they pass on their way to disk.

    The lines go to a temporary file as they are made: the writer's memory stays bounded however
    many records the shard holds.
    """

    #: Bytes of lines held before they go to the temporary file (and read back at a time).
    BUFFER_BYTES = 64 * 1024

    def __init__(self):
        self.records = 0
        self._offset = 0  # where the next record starts
        self._left = 0  # bytes of the current record still to pass
        self._head = b""  # a length header split between two chunks
        self._lines = bytearray()
        self._spool = tempfile.TemporaryFile()  # noqa: SIM115 (closed by index_chunks, once the shard is written)

    def passing(self, chunks):
        """The chunks, unchanged, noting each record's place on the way."""
        for chunk in chunks:
            self._walk(memoryview(chunk).cast("B"))
            yield chunk
        if self._left or self._head:
            raise CorruptRecordError(f"a record was cut short: {self._left + 8 - len(self._head)} bytes missing")

    def index_chunks(self):
        """The index's bytes, once every chunk has passed; closes the temporary file."""
        self._flush()
        self._spool.seek(0)
        try:
            while chunk := self._spool.read(self.BUFFER_BYTES):
                yield chunk
        finally:
            self._spool.close()

    def _walk(self, view: memoryview) -> None:
        pos, end = 0, len(view)
        while pos < end:
            if self._left:
                step = min(self._left, end - pos)
                pos += step
                self._left -= step
                continue
            need = 8 - len(self._head)
            self._head += bytes(view[pos : pos + need])
            pos += min(need, end - pos)
            if len(self._head) == 8:
                size = int.from_bytes(self._head, "little") + FRAMING_BYTES
                self._lines += b"%d %d\n" % (self._offset, size)
                if len(self._lines) >= self.BUFFER_BYTES:
                    self._flush()
                self.records += 1
                self._offset += size
                self._left, self._head = size - 8, b""

    def _flush(self) -> None:
        self._spool.write(self._lines)
        self._lines.clear()
