"""TFRecord framing: length, masked CRC32C of the length, data, masked CRC32C of the data."""

from __future__ import annotations

import os
import struct
from collections.abc import Iterable, Iterator
from typing import BinaryIO

import google_crc32c
import numpy as np

try:
    # Takes any buffer (a row of a block's records, without a copy into bytes) and computes outside the GIL,
    # so the writer threads' checksums run side by side. LGPL-2.1-or-later, imported as an installed library.
    import crc32c as _buffer_crc32c
except ImportError:  # the readers' install: google-crc32c alone
    _buffer_crc32c = None

_MASK_DELTA = 0xA282EAD8
_LENGTH = struct.Struct("<Q")
_CRC = struct.Struct("<I")
HEADER_BYTES = _LENGTH.size + _CRC.size
FOOTER_BYTES = _CRC.size


class CorruptRecordError(ValueError):
    """A TFRecord file whose framing or checksums are wrong."""


def _masked(crc):
    """TFRecord's mask of a CRC32C: an int, or a uint32 array element-wise (where the shifts wrap alike)."""
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def masked_crc(data: bytes) -> int:
    """TFRecord's masked CRC32C (hardware-accelerated by google-crc32c)."""
    return _masked(google_crc32c.value(data))


def masked_crcs(rows: np.ndarray) -> np.ndarray:
    """Each row's masked CRC32C (uint32) of a 2-D uint8 array; bitwise masked_crc's."""
    if _buffer_crc32c is not None:
        crc = _buffer_crc32c.crc32c
        crcs = np.fromiter((crc(row, gil_release_mode=1) for row in rows), np.uint32, len(rows))
    else:
        crcs = np.fromiter((google_crc32c.value(row.tobytes()) for row in rows), np.uint32, len(rows))
    return _masked(crcs)


def frame_header(length: int) -> bytes:
    """The TFRecord header of a record of ``length`` bytes: the length and its masked CRC32C."""
    packed = _LENGTH.pack(length)
    return packed + _CRC.pack(masked_crc(packed))


def frame_parts(record: bytes) -> tuple[bytes, bytes, bytes]:
    """A record's TFRecord header, the record, and its footer (to write or join without a copy)."""
    return frame_header(len(record)), record, _CRC.pack(masked_crc(record))


def frame(record: bytes) -> bytes:
    """One record with its TFRecord header and footer."""
    return b"".join(frame_parts(record))


def write_records(stream: BinaryIO, records: Iterable[bytes]) -> int:
    """Frame and write records; returns the number written."""
    count = 0
    for record in records:
        stream.write(frame(record))
        count += 1
    return count


def read_records(
    stream: BinaryIO, verify: bool = True, name: str = "<stream>", size: int | None = None
) -> Iterator[bytes]:
    """Yield the records of a TFRecord stream, checking both CRCs unless ``verify`` is false.

    ``size``: the stream's bytes, where known; a length header that runs past them names its record (a length
    of 2**40 would otherwise be asked of memory). Where unknown (a decompressed stream), data is read in
    pieces, so a false length costs no more memory than the stream holds.
    """
    index = offset = 0
    while True:
        header = stream.read(HEADER_BYTES)
        if not header:
            return
        if len(header) < HEADER_BYTES:
            raise CorruptRecordError(f"{name}: record {index}: truncated header")
        length_bytes = header[: _LENGTH.size]
        (length,) = _LENGTH.unpack(length_bytes)
        if verify and _CRC.unpack(header[_LENGTH.size :])[0] != masked_crc(length_bytes):
            raise CorruptRecordError(f"{name}: record {index}: length CRC mismatch")
        # (A record starting past the end is one more than listed: its reader counts it.)
        if size is not None and offset < size and length > size - offset - HEADER_BYTES - FOOTER_BYTES:
            raise CorruptRecordError(
                f"{name}: record {index}: its length header says {length} bytes, past the shard's end at byte {size}"
            )
        data = _read_up_to(stream, length)
        footer = stream.read(FOOTER_BYTES)
        if len(data) < length or len(footer) < FOOTER_BYTES:
            raise CorruptRecordError(f"{name}: record {index}: truncated data")
        if verify and _CRC.unpack(footer)[0] != masked_crc(data):
            raise CorruptRecordError(f"{name}: record {index}: data CRC mismatch")
        yield data
        index += 1
        offset += HEADER_BYTES + length + FOOTER_BYTES


#: The most bytes of a record asked of a stream at once.
_PIECE = 64 * 2**20


def _read_up_to(stream: BinaryIO, length: int) -> bytes:
    """``length`` bytes of the stream, or fewer where it ends first; read in pieces, never allocating ``length``
    at once (a stream's ``read(n)`` may reserve n bytes before reading)."""
    if length <= _PIECE:
        return stream.read(length)
    pieces, left = [], length
    while left:
        piece = stream.read(min(left, _PIECE))
        if not piece:
            break
        pieces.append(piece)
        left -= len(piece)
    return b"".join(pieces)


def read_frame_at(fd: int, offset: int, size: int, shard: str, record: int) -> bytes:
    """The data of the framed record of ``size`` bytes at ``offset`` of an open file, its length and both CRCs
    checked (check_frame's checks; the data read as its own bytes, for the CRC, rather than copied out)."""
    head = os.pread(fd, HEADER_BYTES, offset)
    data = os.pread(fd, size - HEADER_BYTES - FOOTER_BYTES, offset + HEADER_BYTES)
    foot = os.pread(fd, FOOTER_BYTES, offset + size - FOOTER_BYTES)
    if len(head) < HEADER_BYTES or len(foot) < FOOTER_BYTES or len(data) < size - HEADER_BYTES - FOOTER_BYTES:
        raise CorruptRecordError(f"{shard}: record {record}: truncated ({size} bytes from byte {offset})")
    length = int.from_bytes(head[:8], "little")
    if int.from_bytes(head[8:], "little") != masked_crc(head[:8]):
        raise CorruptRecordError(f"{shard}: record {record}: length CRC mismatch")
    if length != len(data):
        raise CorruptRecordError(f"{shard}: record {record}: {length} bytes of data where the index says {len(data)}")
    if int.from_bytes(foot, "little") != masked_crc(data):
        raise CorruptRecordError(f"{shard}: record {record}: data CRC mismatch")
    return data


def check_frame(framed, shard: str, record: int) -> bytes:
    """The data of one framed record read at an offset (a read-only buffer), its length and both CRCs checked."""
    if len(framed) < HEADER_BYTES + FOOTER_BYTES:
        raise CorruptRecordError(f"{shard}: record {record}: truncated ({len(framed)} bytes)")
    head = bytes(framed[:8])  # google-crc32c takes bytes only
    length = int.from_bytes(head, "little")
    if int.from_bytes(framed[8:12], "little") != masked_crc(head):
        raise CorruptRecordError(f"{shard}: record {record}: length CRC mismatch")
    if length != len(framed) - HEADER_BYTES - FOOTER_BYTES:
        raise CorruptRecordError(
            f"{shard}: record {record}: {length} bytes of data where the index says {len(framed) - 16}"
        )
    data = bytes(framed[HEADER_BYTES : HEADER_BYTES + length])
    if int.from_bytes(framed[HEADER_BYTES + length :], "little") != masked_crc(data):
        raise CorruptRecordError(f"{shard}: record {record}: data CRC mismatch")
    return data
