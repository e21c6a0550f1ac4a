"""Reassembly by reference (schemas.record_refs): keys from the records' tails, references checked, features read alone.

The outputs are written by the project's own encoder (tests/synthetic_output.py: packed or not, two
shards, one with no .tfindex); what a reference reads is compared with schemas.Reader's decoding of
the same records, and references damaged as a bucket file on disk could be must fail in one line.
"""

from __future__ import annotations

import numpy as np
import pytest
from synthetic_output import FEATURES, make_columns, write_output

from schemas import Reader, UserError
from schemas.example_codec import ExampleEncoder
from schemas.record_refs import REF_BUCKET, REF_OFFSET, REF_SIZE, REF_SLOT, ReferencedRecords
from schemas.schema import Schema
from schemas.shard_index import index_name
from schemas.tfrecord import frame

KEYS = ["index/time"]


def _output(tmp_path, per: int):
    columns = make_columns(FEATURES, 13, seed=per)
    schema = write_output(tmp_path / "out", columns, [6, 7], examples_per_record=per)
    (tmp_path / "out" / index_name(schema.splits["data"][1].file)).unlink()  # (walked instead: found by headers)
    return str(tmp_path / "out"), schema


def _scanned(path, schema) -> dict[str, np.ndarray]:
    with ReferencedRecords(path, schema, "data") as records:
        batches = [b for number in range(2) for b in records.index_batches(number, records=4)]
    refs = {name: np.concatenate([b[name] for b in batches]) for name in batches[0]}
    refs[REF_BUCKET] = np.zeros(len(refs[REF_OFFSET]), dtype=np.int64)
    return refs


@pytest.mark.parametrize("per", [1, 3], ids=["one-a-record", "packed"])
def test_a_scan_finds_every_sample_and_its_references_read_what_the_reader_decodes(tmp_path, per):
    path, schema = _output(tmp_path, per)
    want = Reader(path, "data").read_all()
    refs = _scanned(path, schema)
    assert sorted(refs["index/time"].tolist()) == list(range(13))  # every sample once (the packed ones' last padded)
    shuffled = {name: values[::-1] for name, values in refs.items()}  # (any order: they are sorted by place)
    with ReferencedRecords(path, schema, "data") as records:
        keys = np.concatenate([batch["index/time"] for batch in records.checked(shuffled, ["b"], KEYS)])
        np.testing.assert_array_equal(keys, records.refs["index/time"])
        rows = keys  # (index/time numbers the samples in the reader's order)
        for name in ("t", "w", "coord/lat", "coord/time"):  # floats read alone; an int64 one from its records
            got = np.concatenate([records.values(name, b, min(b + 5, 13)) for b in range(0, 13, 5)])
            np.testing.assert_array_equal(got, want[name][rows], err_msg=name)
        reused = np.full((5, 2, 3, 4), -1, np.float32)
        np.testing.assert_array_equal(records.feature("t", 2, 5, reused), want["t"][rows[2:5]])
        assert (reused[3:] == -1).all()  # (its first rows only)


def _refused(path, schema, refs, message: str) -> None:
    with ReferencedRecords(path, schema, "data") as records, pytest.raises(UserError, match=message) as error:
        list(records.checked(refs, ["work/chunk-000003-x.bucket"], KEYS))
    assert "\n" not in str(error.value) and str(error.value).startswith("work/chunk-000003-x.bucket: ")
    assert "run the reassembly again" in str(error.value)


@pytest.mark.parametrize("per", [1, 3], ids=["one-a-record", "packed"])
def test_references_from_a_damaged_bucket_are_refused_in_one_line_naming_it(tmp_path, per):
    path, schema = _output(tmp_path, per)
    refs = _scanned(path, schema)
    shard = str(tmp_path / "out" / schema.splits["data"][0].file)
    size = schema.splits["data"][0].bytes

    def changed(name, row, value):
        out = {k: v.copy() for k, v in refs.items()}
        out[name][row] = value
        return out

    first = int(np.flatnonzero(refs["ref/shard"] == 0)[0])
    last = int(np.flatnonzero(refs["ref/shard"] == 0)[-1])
    _refused(path, schema, changed(REF_OFFSET, last, size - 8), f"a reference to bytes {size - 8} to .* of {shard}")
    _refused(path, schema, changed(REF_SIZE, first, 10**9), f"of {shard}, which holds {size}")
    _refused(path, schema, changed(REF_OFFSET, first, -5), "a reference to bytes -5 to")
    _refused(path, schema, changed("ref/shard", first, 9), "a reference to shard 9 of 2")
    # Inside the shard but not where a record starts: its frame does not check out.
    _refused(path, schema, changed(REF_OFFSET, first, int(refs[REF_OFFSET][first]) + 1), "no whole record of")
    # A whole record, but not the sample the bucket says.
    key = int(refs["index/time"][first])
    _refused(path, schema, changed("index/time", first, key + 100), f"holds index/time = {key}, not {key + 100}")
    _refused(path, schema, changed(REF_SLOT, first, per), "not that one")
    # The record's bytes changed on disk since they were written: its CRC says so.
    with open(shard, "r+b") as stream:
        stream.seek(int(refs[REF_OFFSET][first]) + 40)
        byte = stream.read(1)
        stream.seek(-1, 1)
        stream.write(bytes([byte[0] ^ 1]))
    _refused(path, schema, refs, "data CRC mismatch")


def test_a_record_in_another_layout_is_found_by_decoding_it_whole(tmp_path):
    """Records whose features come in another order (as another writer's may): their tails are not the encoder's
    layout, so the scan reads and checks each whole record; a reference then reads its floats where they are."""
    columns = make_columns(FEATURES, 4, seed=5)
    schema = write_output(tmp_path / "out", columns, [4])
    shard = tmp_path / "out" / schema.splits["data"][0].file
    before = shard.read_bytes()
    reordered = Schema(features=tuple(reversed(FEATURES)))  # (the same entries, in another order: the same sizes)
    data = b"".join(frame(r) for r in ExampleEncoder(reordered.record_features()).encode(columns))
    assert len(data) == len(before) and data != before
    shard.write_bytes(data)
    with ReferencedRecords(str(tmp_path / "out"), schema, "data") as reading:
        batches = list(reading.index_batches(0))
        refs = {name: np.concatenate([b[name] for b in batches]) for name in batches[0]}
        refs[REF_BUCKET] = np.zeros(4, dtype=np.int64)
        assert refs["index/time"].tolist() == [0, 1, 2, 3]
        list(reading.checked(refs, ["b"], KEYS))
        np.testing.assert_array_equal(reading.values("t", 0, 4), columns["t"])
        np.testing.assert_array_equal(reading.values("coord/time", 0, 4), columns["coord/time"])


def test_a_scan_over_a_record_whose_tail_was_damaged_fails_its_crc_in_one_line(tmp_path):
    from schemas.tfrecord import CorruptRecordError

    path, schema = _output(tmp_path, 1)
    shard = tmp_path / "out" / schema.splits["data"][0].file
    data = bytearray(shard.read_bytes())
    size = int.from_bytes(data[:8], "little") + 16
    data[size - 5] |= 0x80  # the last varint of the first record, unterminated: no tail of the encoder's
    shard.write_bytes(bytes(data))
    with ReferencedRecords(path, schema, "data") as records, pytest.raises(CorruptRecordError) as error:
        list(records.index_batches(0))
    assert str(error.value) == f"{shard}: record 0: data CRC mismatch"
    assert "\n" not in str(error.value)
