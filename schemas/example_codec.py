"""The tf.train.Example wire format for a schema: the compiled encoder and the wire-format primitives.

No TensorFlow here (docs/design.md, decision 1). Every float feature has a fixed length, so its
protobuf headers are the same bytes in every record: they are computed once per schema, and a
block's records are the rows of one uint8 array per layout, each header and payload copied into
its columns of every row at once. int64 values are varints of varying length, encoded for a
whole block at once with numpy; samples whose varints take as many bytes share a layout.

Wire format: Example.features = 1 (Features); Features.feature = 1, a map entry
{key = 1: string, value = 2: Feature}; Feature.float_list = 2 / int64_list = 3;
FloatList.value / Int64List.value = 1, packed. Every field here is length-delimited.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np

from schemas.schema import Feature
from schemas.tfrecord import FOOTER_BYTES, HEADER_BYTES, frame_header, masked_crcs

FLOAT_LIST = 2
INT64_LIST = 3
_MAX_VARINT_BYTES = 10


def varint(value: int) -> bytes:
    """Protobuf base-128 varint of a non-negative int (negative int64s as their uint64)."""
    value &= (1 << 64) - 1
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def field_header(number: int, payload_len: int) -> bytes:
    """Tag and length of a length-delimited field, without its payload."""
    return bytes([(number << 3) | 2]) + varint(payload_len)


def entry_header(name: bytes, list_field: int, payload_len: int) -> bytes:
    """Bytes of one Features map entry up to (excluding) the packed values."""
    value_list = field_header(1, payload_len)  # FloatList/Int64List.value, packed
    feature = field_header(list_field, len(value_list) + payload_len)
    key = field_header(1, len(name)) + name
    value = field_header(2, len(feature) + len(value_list) + payload_len)
    entry_len = len(key) + len(value) + len(feature) + len(value_list) + payload_len
    return field_header(1, entry_len) + key + value + feature + value_list


def varint_lengths(values: np.ndarray) -> np.ndarray:
    """Bytes each int64 value takes as a varint (negative values take 10, as their uint64)."""
    unsigned = np.ascontiguousarray(values, dtype=np.int64).view(np.uint64)
    nbytes = np.ones(unsigned.shape, dtype=np.int64)
    for i in range(1, _widest(unsigned)):  # (no value takes more bytes than the largest: positions take 1 to 3)
        nbytes += (unsigned >> np.uint64(7 * i)) != 0
    return nbytes


def _widest(unsigned: np.ndarray) -> int:
    """Bytes the largest of these uint64 values takes as a varint."""
    return len(varint(int(unsigned.max()))) if unsigned.size else 1


def varints_by_row(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Varint-encode a (rows, k) int64 array: all rows' bytes back to back (uint8), and each row's byte count."""
    if values.dtype == np.bool_:  # masks: a varint of 0 or 1 is that one byte
        return values.astype(np.uint8).reshape(-1), np.full(len(values), values.shape[1], dtype=np.int64)
    unsigned = np.ascontiguousarray(values, dtype=np.int64).view(np.uint64)
    nbytes = varint_lengths(unsigned.view(np.int64))
    widest = int(nbytes.max()) if nbytes.size else 1
    groups = np.empty((*unsigned.shape, widest), dtype=np.uint8)  # each value's bytes, up to the widest's
    for i in range(widest):
        more = (nbytes > i + 1).astype(np.uint8) << 7
        groups[..., i] = ((unsigned >> np.uint64(7 * i)) & np.uint64(0x7F)).astype(np.uint8) | more
    used = np.arange(widest) < nbytes[..., None]
    return groups[used], nbytes.reshape(len(values), -1).sum(axis=1)


def _float_bytes(values: np.ndarray, pick: np.ndarray | None, feature: Feature) -> np.ndarray:
    """The samples' (``pick``: those samples') values of a float feature as little-endian float32 bytes, a row each.

    A view of the block's own memory where it is C-contiguous little-endian float32 already (the cut's blocks
    are), so the values are copied once, into their records; other arrays are copied to that form first, one
    feature at a time.
    """
    if pick is not None:
        values = values[pick]
    if values.dtype != np.dtype("<f4") or not values.flags.c_contiguous:
        values = np.ascontiguousarray(values, dtype="<f4")
    return values.reshape(len(values), feature.size).view(np.uint8)


@dataclasses.dataclass(frozen=True)
class RecordRows:
    """A block's records as the rows of 2-D uint8 arrays, one array per record layout, and the samples its rows are.

    Framed (``ExampleEncoder.rows``' default), a row is a whole TFRecord frame: length, its masked CRC32C, the
    Example, the Example's masked CRC32C; it is written, or joined, as it is.
    """

    count: int  # samples
    arrays: tuple[np.ndarray, ...]
    samples: tuple[np.ndarray, ...]  # per array, the block's sample indices of its rows

    def sizes(self) -> np.ndarray:
        """Each sample's record size in bytes, in sample order."""
        sizes = np.zeros(self.count, dtype=np.int64)
        for rows, samples in zip(self.arrays, self.samples):
            sizes[samples] = rows.shape[1]
        return sizes

    def in_order(self) -> list[np.ndarray]:
        """The records in sample order (views of the rows: bytes-like, to write or join)."""
        records: list = [None] * self.count
        for rows, samples in zip(self.arrays, self.samples):
            for i, row in zip(samples.tolist(), rows):
                records[i] = row
        return records


class ExampleEncoder:
    """Serialises blocks of samples into tf.train.Example bytes for a fixed list of features."""

    def __init__(self, features: Sequence[Feature]):
        self.features = tuple(features)
        self._floats = [f for f in self.features if f.dtype == "float32"]
        self._ints = [f for f in self.features if f.dtype == "int64"]
        # Float features: one constant header each, laid out back to back with their payloads.
        self._float_headers = [(f, entry_header(f.name.encode(), FLOAT_LIST, 4 * f.size)) for f in self._floats]
        self._fixed_len = sum(len(header) + 4 * f.size for f, header in self._float_headers)

    def record_lengths(self, int_columns: Mapping[str, np.ndarray], n: int) -> np.ndarray:
        """The serialized length of each sample's Example, from its int64 values alone.

        Float features have fixed lengths, so only the varints vary: the shards' layout can be
        known before any float is read. Masks (role ``mask``) hold 0 or 1, a byte each, whatever
        the data: they need no column.
        """
        length = np.full(n, self._fixed_len, dtype=np.int64)
        for feature in self._ints:
            if feature.role == "mask":
                payload = np.full(n, feature.size, dtype=np.int64)
            else:
                values = np.asarray(int_columns[feature.name]).reshape(n, feature.size)
                payload = varint_lengths(values).sum(axis=1)
            distinct, which = np.unique(payload, return_inverse=True)
            name = feature.name.encode()
            header = np.array([len(entry_header(name, INT64_LIST, int(p))) for p in distinct], dtype=np.int64)
            length += header[which] + payload
        distinct, which = np.unique(length, return_inverse=True)
        head = np.array([len(field_header(1, int(size))) for size in distinct], dtype=np.int64)
        return length + head[which]

    def max_record_length(self) -> int:
        """The longest Example these features serialise to: exact for floats, every int64 at a varint's 10 bytes."""
        longest = {f.name: np.full((1, f.size), -1, dtype=np.int64) for f in self._ints}
        return int(self.record_lengths(longest, 1)[0])

    def encode(self, columns: Mapping[str, np.ndarray]) -> list[bytes]:
        """One serialized Example per sample; ``columns[name]`` has shape (samples, *feature.shape)."""
        return [bytes(row) for row in self.rows(columns, framed=False).in_order()]

    def rows(self, columns: Mapping[str, np.ndarray], framed: bool = True) -> RecordRows:
        """The samples' Examples (TFRecord-framed unless ``framed`` is false) as rows of 2-D uint8 arrays.

        No Python work per record but its checksum: samples whose int64 features' varints take as many bytes
        have records of one layout (a block's usually all do), and each part of a layout is one numpy copy
        into a column range of every row: constant headers broadcast, float payloads from the block.
        """
        n = len(columns[self.features[0].name]) if self.features else 0
        if n == 0:  # e.g. a unit whose samples nan_policy: drop dropped every one of
            return RecordRows(0, (), ())
        varints = [varints_by_row(np.asarray(columns[f.name]).reshape(n, f.size)) for f in self._ints]
        floats = []  # (feature, entry header, values)
        for feature, header in self._float_headers:
            values = np.asarray(columns[feature.name])
            if values.size != n * feature.size:
                raise ValueError(f"{feature.name!r}: {values.size} values for {n} samples of {feature.size}")
            floats.append((feature, header, values.reshape(n, feature.size)))
        # A record's layout: each int64 feature's payload size (the floats' are fixed).
        layouts = np.stack([lengths for _, lengths in varints], axis=1) if varints else np.zeros((n, 0), np.int64)
        if (layouts == layouts[0]).all():  # (a block's usually are)
            arrays = [self._layout_rows(layouts[0], None, n, floats, varints, framed)]
            return RecordRows(n, tuple(arrays), (np.arange(n),))
        # Samples sorted by layout (stable: in order within one). Not np.unique(axis=0): its structured dtypes
        # left allocations behind at every call (tracemalloc, in the shard writer's memory test).
        order = np.lexsort(layouts.T[::-1])
        ordered = layouts[order]
        bounds = [0, *(np.flatnonzero((ordered[1:] != ordered[:-1]).any(axis=1)) + 1).tolist(), n]
        varints = [(stream, np.cumsum(lengths) - lengths) for stream, lengths in varints]  # each sample's start
        samples = [order[start:stop] for start, stop in zip(bounds, bounds[1:])]
        arrays = [
            self._layout_rows(ordered[start], pick, len(pick), floats, varints, framed)
            for start, pick in zip(bounds, samples)
        ]
        return RecordRows(n, tuple(arrays), tuple(samples))

    def _layout_rows(self, layout, pick, m: int, floats, varints, framed: bool) -> np.ndarray:
        """The records of ``m`` samples (``pick``: which, None: all) whose int64 payloads are ``layout``'s sizes.

        ``varints``: per int64 feature, its varints back to back and, with ``pick``, where each sample's start."""
        ints = []  # (entry header, (m, payload) bytes) per int64 feature
        for feature, (stream, starts), width in zip(self._ints, varints, layout.tolist()):
            # (all samples: each one's payload is ``width`` bytes, back to back)
            payload = stream.reshape(m, width) if pick is None else stream[starts[pick][:, None] + np.arange(width)]
            ints.append((entry_header(feature.name.encode(), INT64_LIST, width), payload))
        length = self._fixed_len + sum(len(header) + payload.shape[1] for header, payload in ints)
        head = field_header(1, length)
        example = len(head) + length
        frame = (HEADER_BYTES, FOOTER_BYTES) if framed else (0, 0)
        rows = np.empty((m, frame[0] + example + frame[1]), dtype=np.uint8)
        at = frame[0]

        def put(part) -> None:
            nonlocal at
            width = len(part) if isinstance(part, bytes) else part.shape[1]
            rows[:, at : at + width] = np.frombuffer(part, np.uint8) if isinstance(part, bytes) else part
            at += width

        put(head)
        for feature, header, values in floats:
            put(header)
            put(_float_bytes(values, pick, feature))
        for header, payload in ints:
            put(header)
            put(payload)
        if framed:
            rows[:, :HEADER_BYTES] = np.frombuffer(frame_header(example), np.uint8)
            rows[:, at:] = masked_crcs(rows[:, HEADER_BYTES:at]).astype("<u4").view(np.uint8).reshape(m, 4)
        return rows


# ---------------------------------------------------------------------------------------------
# Reading the wire format (schemas.record_decoder builds the decoder on these).


def read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf):
            raise ValueError("truncated varint")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift >= 70:
            raise ValueError("varint too long")


def iter_fields(buf: bytes, start: int, end: int):
    """Yield (field number, payload start, payload end) of the length-delimited fields in buf."""
    pos = start
    while pos < end:
        tag, pos = read_varint(buf, pos)
        if tag & 7 != 2:
            raise ValueError(f"unexpected wire type {tag & 7} in tf.Example")
        length, pos = read_varint(buf, pos)
        if pos + length > end:
            raise ValueError("truncated field in tf.Example")
        yield tag >> 3, pos, pos + length
        pos += length


#: Up to this many bytes, varints are decoded in Python: numpy's per-call cost is larger (random access, one record).
_PYTHON_VARINT_BYTES = 32


def decode_varints(buf: bytes, start: int, end: int) -> np.ndarray:
    if end - start <= _PYTHON_VARINT_BYTES:
        values, pos = [], start
        while pos < end:
            value, pos = read_varint(buf, pos)
            if value >> 64:
                raise ValueError("varint too long for int64 in tf.Example")
            values.append(value)
        if pos != end:
            raise ValueError("truncated varint in tf.Example")
        return np.array(values, dtype=np.uint64).view(np.int64)
    raw = np.frombuffer(buf, dtype=np.uint8, count=end - start, offset=start)
    last = np.flatnonzero(raw < 0x80)  # the final byte of each varint
    values = np.zeros(len(last), dtype=np.uint64)
    first = np.concatenate(([0], last[:-1] + 1))
    for i in range(_MAX_VARINT_BYTES):
        pos = first + i
        live = pos <= last
        if not live.any():
            break
        values[live] |= (raw[pos[live]] & np.uint8(0x7F)).astype(np.uint64) << np.uint64(7 * i)
    return values.view(np.int64)
