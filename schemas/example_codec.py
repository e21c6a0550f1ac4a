"""The tf.train.Example wire format for a schema: the compiled encoder and the wire-format primitives.

No TensorFlow here (DESIGN.md, decision 1). Every float feature has a fixed length, so its
protobuf headers are the same bytes in every record: they are computed once per schema and
each record is a join of constant headers and raw little-endian payloads. int64 values are
varints of varying length; they are encoded for a whole block at once with numpy.

Wire format: Example.features = 1 (Features); Features.feature = 1, a map entry
{key = 1: string, value = 2: Feature}; Feature.float_list = 2 / int64_list = 3;
FloatList.value / Int64List.value = 1, packed. Every field here is length-delimited.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from schemas.schema import Feature

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
    for i in range(1, _MAX_VARINT_BYTES):
        nbytes += (unsigned >> np.uint64(7 * i)) != 0
    return nbytes


def varints_by_row(values: np.ndarray) -> tuple[bytes, np.ndarray]:
    """Varint-encode a (rows, k) int64 array: all rows' bytes back to back, and each row's length."""
    if values.dtype == np.bool_:  # masks: a varint of 0 or 1 is that one byte
        return values.astype(np.uint8).tobytes(), np.full(len(values), values.shape[1], dtype=np.int64)
    unsigned = np.ascontiguousarray(values, dtype=np.int64).view(np.uint64)
    nbytes = varint_lengths(unsigned.view(np.int64))
    groups = np.empty((*unsigned.shape, _MAX_VARINT_BYTES), dtype=np.uint8)
    for i in range(_MAX_VARINT_BYTES):
        more = (nbytes > i + 1).astype(np.uint8) << 7
        groups[..., i] = ((unsigned >> np.uint64(7 * i)) & np.uint64(0x7F)).astype(np.uint8) | more
    used = np.arange(_MAX_VARINT_BYTES) < nbytes[..., None]
    return groups[used].tobytes(), nbytes.reshape(len(values), -1).sum(axis=1)


def _float_rows(values, n: int, feature: Feature) -> memoryview:
    """``n`` samples' values of a float feature as little-endian float32 bytes, back to back.

    The block's own memory where it is C-contiguous little-endian float32 already (the cut's blocks are),
    so a record's join copies its values once, straight from the block; other arrays are copied once here.
    """
    values = np.asarray(values)
    if values.dtype != np.dtype("<f4") or not values.flags.c_contiguous:
        values = np.ascontiguousarray(values, dtype="<f4")
    if values.size != n * feature.size:
        raise ValueError(f"{feature.name!r}: {values.size} values for {n} samples of {feature.size}")
    return memoryview(values.reshape(-1).view(np.uint8))


class ExampleEncoder:
    """Serialises blocks of samples into tf.train.Example bytes for a fixed list of features."""

    def __init__(self, features: Sequence[Feature]):
        self.features = tuple(features)
        self._floats = [f for f in self.features if f.dtype == "float32"]
        self._ints = [f for f in self.features if f.dtype == "int64"]
        # Float features: one constant header each, laid out back to back with their payloads.
        self._float_headers = [(f, entry_header(f.name.encode(), FLOAT_LIST, 4 * f.size)) for f in self._floats]
        self._fixed_len = sum(len(header) + 4 * f.size for f, header in self._float_headers)
        # int64 features: the header depends only on the payload length; cache per length.
        self._int_headers: list[dict[int, bytes]] = [{} for _ in self._ints]
        self._example_headers: dict[int, bytes] = {}

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
        n = len(columns[self.features[0].name]) if self.features else 0
        if n == 0:
            return []  # e.g. a unit whose samples nan_policy: drop dropped every one of
        floats = [
            (header, _float_rows(columns[feature.name], n, feature), 4 * feature.size)
            for feature, header in self._float_headers
        ]
        varint_columns = []
        for feature in self._ints:
            values = np.asarray(columns[feature.name]).reshape(n, feature.size)
            data, lengths = varints_by_row(values)
            starts = np.zeros(n + 1, dtype=np.int64)
            np.cumsum(lengths, out=starts[1:])
            varint_columns.append((data, starts.tolist()))

        records = []
        pieces: list = []
        for i in range(n):
            pieces.clear()
            pieces.append(b"")  # the Example header, once the length is known
            for header, rows, width in floats:
                pieces.append(header)
                pieces.append(rows[i * width : (i + 1) * width])
            length = self._fixed_len
            for feature, headers, (data, starts) in zip(self._ints, self._int_headers, varint_columns):
                payload = data[starts[i] : starts[i + 1]]
                header = headers.get(len(payload))
                if header is None:
                    header = entry_header(feature.name.encode(), INT64_LIST, len(payload))
                    headers[len(payload)] = header
                pieces.append(header)
                pieces.append(payload)
                length += len(header) + len(payload)
            head = self._example_headers.get(length)
            if head is None:
                head = self._example_headers[length] = field_header(1, length)
            pieces[0] = head
            records.append(b"".join(pieces))
        return records


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
