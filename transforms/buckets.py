"""Bucket blobs: the framed records one unit sends to one shard, with their shuffle keys.

Layout: magic, record count n, n uint64 keys, n uint64 framed lengths, the framed records back
to back. Keys and lengths sit in front so a shard writer reads them with numpy, not per record.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import numpy as np

MAGIC = b"XTFBKT01"
_COUNT = struct.Struct("<Q")


def pack_bucket(keys: np.ndarray, framed: Sequence[bytes]) -> bytes:
    lengths = np.fromiter((len(r) for r in framed), dtype="<u8", count=len(framed))
    head = MAGIC + _COUNT.pack(len(framed))
    return b"".join((head, np.asarray(keys, dtype="<u8").tobytes(), lengths.tobytes(), *framed))


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
