"""Bucket blobs: what one unit sends to one shard (framed records or raw sample rows) with shuffle keys.

Layout: magic, count n, n uint64 keys, n uint64 lengths, the payloads back to back. Keys and
lengths sit in front so a shard writer reads them with numpy, not per record. A payload is a
framed TFRecord record, or, when samples are packed several to a record (which can only happen
after the shard's sort), a raw row: every feature's little-endian values, in ``row_dtype`` layout.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Sequence

import numpy as np

from schemas.schema import Feature

MAGIC = b"XTFBKT01"
_COUNT = struct.Struct("<Q")
_HEAD_BYTES = len(MAGIC) + _COUNT.size


def bucket_pieces(keys: np.ndarray, payloads: Sequence[Sequence[bytes]] | np.ndarray) -> list[bytes]:
    """A bucket as a list of byte strings to write or join, without copying the payloads.

    ``payloads``: per record, the parts that make it up (e.g. framing header, Example, framing
    footer), or fixed-length rows as a structured array.
    """
    if isinstance(payloads, np.ndarray):
        lengths = np.full(len(payloads), payloads.dtype.itemsize, dtype="<u8")
        body: list = [payloads.tobytes()]
    else:
        lengths = np.fromiter((sum(map(len, parts)) for parts in payloads), dtype="<u8", count=len(payloads))
        body = [part for parts in payloads for part in parts]
    head = MAGIC + _COUNT.pack(len(lengths))
    return [head, np.asarray(keys, dtype="<u8").tobytes(), lengths.tobytes(), *body]


def row_dtype(features: Sequence[Feature]) -> np.dtype:
    """One raw sample row: every feature's values, little-endian, in schema order."""
    kinds = {"float32": "<f4", "int64": "<i8"}
    return np.dtype([(f"f{i}", kinds[f.dtype], f.shape) for i, f in enumerate(features)])


def unpack_bucket(blob: bytes, name: str = "bucket") -> tuple[np.ndarray, np.ndarray, memoryview]:
    """(keys, lengths, payload) of a bucket; the payload holds the framed records in order."""
    if blob[: len(MAGIC)] != MAGIC:
        raise ValueError(f"{name}: not a bucket blob (bad magic)")
    (count,) = _COUNT.unpack_from(blob, len(MAGIC))
    start = len(MAGIC) + _COUNT.size
    keys = np.frombuffer(blob, dtype="<u8", count=count, offset=start)
    lengths = np.frombuffer(blob, dtype="<u8", count=count, offset=start + 8 * count)
    payload = memoryview(blob)[start + 16 * count :]
    if len(payload) != int(lengths.sum()):
        raise ValueError(f"{name}: truncated bucket ({len(payload)} payload bytes, expected {int(lengths.sum())})")
    return keys, lengths, payload


def payload_start(count: int) -> int:
    """Where the payloads of a bucket of ``count`` records begin."""
    return _HEAD_BYTES + 16 * count


def read_bucket_count(fd: int, name: str = "bucket") -> int:
    """The number of records of the bucket file open as ``fd`` (its magic checked)."""
    head = os.pread(fd, _HEAD_BYTES, 0)
    if head[: len(MAGIC)] != MAGIC or len(head) < _HEAD_BYTES:
        raise ValueError(f"{name}: not a bucket file (bad magic)")
    return _COUNT.unpack_from(head, len(MAGIC))[0]


def read_bucket_entries(fd: int, count: int, first: int, n: int, name: str = "bucket") -> tuple[np.ndarray, np.ndarray]:
    """Keys and lengths of records ``first`` to ``first + n`` of a bucket file of ``count`` records."""
    keys = os.pread(fd, 8 * n, _HEAD_BYTES + 8 * first)
    lengths = os.pread(fd, 8 * n, _HEAD_BYTES + 8 * (count + first))
    if len(keys) < 8 * n or len(lengths) < 8 * n:
        raise ValueError(f"{name}: truncated bucket (its header ends early)")
    return np.frombuffer(keys, dtype="<u8"), np.frombuffer(lengths, dtype="<u8")
