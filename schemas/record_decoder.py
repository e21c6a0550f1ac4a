"""Fast batch decoding of tf.train.Example records whose layout the schema fixes (no TensorFlow).

ExampleEncoder writes every record in one layout: the float features in schema order, each
behind constant header bytes and with a fixed payload length, then the int64 features, whose
payloads are varints of varying length. One compiled regular expression matches that whole
layout, so a record is located by a single C-level match instead of a Python walk over the
protobuf; float payloads are then copied as raw bytes and the int64 payloads of a whole batch
are varint-decoded at once with numpy. A record in any other valid layout (features in another
order, extra features, as another serializer may write) falls back to a generic walk, so the
result always equals TensorFlow's ``tf.io.parse_example`` with ``FixedLenFeature`` specs.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

from schemas.example_codec import FLOAT_LIST, INT64_LIST, decode_varints, entry_header, field_header, iter_fields
from schemas.schema import Feature

_VARINT = rb"[\x80-\xff]{0,9}[\x00-\x7f]"
_LIST_FIELD = {"float32": FLOAT_LIST, "int64": INT64_LIST}


def _int_entry_pattern(name: bytes, count: int) -> bytes:
    """An int64 entry: its header (lengths vary with the payload) and exactly ``count`` varints."""
    key = re.escape(field_header(1, len(name)) + name)
    header = rb"\x0a" + _VARINT + key + rb"\x12" + _VARINT + rb"\x1a" + _VARINT + rb"\x0a" + _VARINT
    return b"(" + header + b")((?:" + _VARINT + b"){" + str(count).encode() + b"})"


class ExampleDecoder:
    """Decodes batches of serialized Examples into {name: array of shape (n, *feature.shape)}."""

    def __init__(self, features: Sequence[Feature]):
        self.features = tuple(features)
        self._floats = [f for f in self.features if f.dtype == "float32"]
        self._ints = [f for f in self.features if f.dtype == "int64"]
        parts = [rb"\x0a" + _VARINT]  # Example.features: tag and the length of everything after
        offset = 0
        self._float_offsets = []  # payload offset of each float feature after the Example header
        for feature in self._floats:
            header = entry_header(feature.name.encode(), FLOAT_LIST, 4 * feature.size)
            parts.append(re.escape(header) + b".{" + str(4 * feature.size).encode() + b"}")
            self._float_offsets.append(offset + len(header))
            offset += len(header) + 4 * feature.size
        self._float_bytes = offset  # the float entries' bytes: the same in every record of the layout
        ints = [_int_entry_pattern(f.name.encode(), f.size) for f in self._ints]
        self._pattern = re.compile(b"".join([*parts, *ints]), re.DOTALL)
        self._int_pattern = re.compile(b"".join(ints), re.DOTALL)
        # An int64 entry's header is a function of its payload length: check it against these.
        self._int_headers: list[dict[int, bytes]] = [{} for _ in self._ints]
        self._example_headers: dict[int, bytes] = {}
        self._by_name = {f.name: f for f in self.features}

    def decode_batch(self, records: Sequence[bytes], first_index: int = 0) -> dict[str, np.ndarray]:
        """Decode records into arrays with a leading record axis, each feature's dtype and shape.

        A malformed record raises ValueError naming it by position (``first_index`` + its index).
        """
        n = len(records)
        out = {f.name: np.empty((n, *f.shape), dtype=f.dtype) for f in self.features}
        float_targets = [(memoryview(out[f.name].reshape(-1).view(np.uint8)), 4 * f.size) for f in self._floats]
        int_payloads: list[list[bytes]] = [[] for _ in self._ints]
        for i, record in enumerate(records):
            located = self._locate_fast(record)
            if located is None:
                try:
                    located = self._locate_generic(record)
                except ValueError as error:
                    raise ValueError(f"record {first_index + i}: {error}") from None
            float_starts, ints = located
            view = memoryview(record)
            for (target, nbytes), start in zip(float_targets, float_starts):
                target[i * nbytes : (i + 1) * nbytes] = view[start : start + nbytes]
            for payloads, payload in zip(int_payloads, ints):
                payloads.append(payload)
        for feature, payloads in zip(self._ints, int_payloads):
            if n and feature.size:
                values = decode_varints(b"".join(payloads), 0, sum(map(len, payloads)))
                out[feature.name][...] = values.reshape(out[feature.name].shape)
        return out

    def locate(self, record: bytes) -> tuple[list[int], list[bytes]]:
        """Where each float feature's payload starts in ``record`` (in ``float_names`` order), and the int64
        features' payloads (``decode_ints``); ValueError unless it holds every feature of the schema."""
        return self._locate_fast(record) or self._locate_generic(record)

    @property
    def float_names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self._floats)

    def tail_start(self, length: int) -> int:
        """Where the int64 entries start in a record of ``length`` bytes in the encoder's layout (after the
        Example's header and the float entries, whose sizes the schema fixes)."""
        return len(self._example_header(length)) + self._float_bytes

    def tail_payloads(self, tail: bytes) -> list[bytes] | None:
        """The int64 features' payloads of a record in the encoder's layout, from its tail alone (from
        ``tail_start``); None where the tail is not such entries (another layout: locate the whole record)."""
        match = self._int_pattern.fullmatch(tail)
        if match is None:
            return None
        payloads = []
        for j in range(len(self._ints)):
            start, payload_start = match.regs[2 * j + 1]
            payload_end = match.regs[2 * j + 2][1]
            length = payload_end - payload_start
            expected = self._int_headers[j].get(length) or self._int_header(j, length)
            if payload_start - start != len(expected) or not tail.startswith(expected, start):
                return None
            payloads.append(tail[payload_start:payload_end])
        return payloads

    def decode_ints(self, rows: Sequence[Sequence[bytes]]) -> dict[str, np.ndarray]:
        """The int64 features of records from their payloads (``locate``, ``tail_payloads``), decoded at once."""
        out = {}
        for j, feature in enumerate(self._ints):
            payload = b"".join(row[j] for row in rows)
            values = decode_varints(payload, 0, len(payload)) if feature.size else np.zeros(0, np.int64)
            if values.size != len(rows) * feature.size:
                raise ValueError(f"feature {feature.name!r} holds {values.size} values in {len(rows)} records")
            out[feature.name] = values.reshape(len(rows), *feature.shape)
        return out

    def decode(self, record: bytes) -> dict[str, np.ndarray]:
        """One record as {name: array of the feature's shape}."""
        return {name: values[0] for name, values in self.decode_batch([record]).items()}

    def _example_header(self, length: int) -> bytes:
        """The Example's leading tag and length for a record of ``length`` bytes."""
        header = self._example_headers.get(length)
        if header is None:
            for size in range(2, 12):
                candidate = field_header(1, length - size)
                if len(candidate) == size:
                    header = candidate
                    break
            self._example_headers[length] = header = header or b""
        return header

    def _int_header(self, j: int, length: int) -> bytes:
        header = self._int_headers[j][length] = entry_header(self._ints[j].name.encode(), INT64_LIST, length)
        return header

    def _locate_fast(self, record: bytes) -> tuple[list[int], list[bytes]] | None:
        """Float payload offsets and int64 payloads of a record in the encoder's layout, else None.

        The regex fixes every byte of the float entries; an int64 entry's lengths vary with its
        payload, so its header is compared with the one the encoder writes for that payload length.
        """
        match = self._pattern.fullmatch(record)
        if match is None:
            return None
        header = self._example_header(len(record))
        if not header or not record.startswith(header):
            return None
        regs = match.regs
        ints = []
        for j, headers in enumerate(self._int_headers):
            start, payload_start = regs[2 * j + 1]
            payload_end = regs[2 * j + 2][1]
            expected = headers.get(payload_end - payload_start) or self._int_header(j, payload_end - payload_start)
            if payload_start - start != len(expected) or not record.startswith(expected, start):
                return None
            ints.append(record[payload_start:payload_end])
        base = len(header)  # every float payload sits at a constant offset after the Example header
        return [base + offset for offset in self._float_offsets], ints

    def _locate_generic(self, record: bytes) -> tuple[list[int], list[bytes]]:
        """Walk the protobuf for records in any other layout; the last entry of a key wins."""
        found: dict[str, tuple[int, int, int]] = {}
        for number, start, end in iter_fields(record, 0, len(record)):
            if number != 1:
                continue
            for entry_number, entry_start, entry_end in iter_fields(record, start, end):
                if entry_number == 1:
                    self._read_entry(record, entry_start, entry_end, found)
        floats, ints = [], []
        for feature in self.features:
            if feature.name not in found:
                raise ValueError(f"record has no feature {feature.name!r}")
            kind, start, end = found[feature.name]
            if kind != _LIST_FIELD[feature.dtype]:
                raise ValueError(f"feature {feature.name!r} is not stored as {feature.dtype}")
            if feature.dtype == "float32":
                if end - start != 4 * feature.size:
                    raise ValueError(
                        f"feature {feature.name!r} has {(end - start) // 4} values, schema says {feature.size}"
                    )
                floats.append(start)
            else:
                payload = record[start:end]
                count = int(np.count_nonzero(np.frombuffer(payload, np.uint8) < 0x80))
                if count != feature.size or (payload and payload[-1] >= 0x80):
                    raise ValueError(f"feature {feature.name!r} has {count} values, schema says {feature.size}")
                ints.append(payload)
        return floats, ints

    def _read_entry(self, record: bytes, start: int, end: int, found: dict) -> None:
        """Record the value list of one Features map entry, if it is a feature of the schema."""
        name, value = None, None
        for key, s, e in iter_fields(record, start, end):
            if key == 1:
                name = record[s:e].decode()
            elif key == 2:
                value = (s, e)
        if name not in self._by_name or value is None:
            return
        kind, payload = None, (value[0], value[0])
        for list_kind, s, e in iter_fields(record, *value):
            kind = list_kind
            for value_field, vs, ve in iter_fields(record, s, e):
                if value_field == 1:
                    payload = (vs, ve)
        found[name] = (kind, *payload)
