"""TFRecord framing: TensorFlow reads what we frame; our reader checks both CRCs."""

from __future__ import annotations

import io

import pytest
import tensorflow as tf

from schemas.tfrecord import CorruptRecordError, masked_crc, read_records, write_records

RECORDS = [b"", b"a", b"hello world" * 100, bytes(range(256)) * 40]


def test_tensorflow_reads_our_framing(tmp_path):
    path = tmp_path / "x.tfrecord"
    with open(path, "wb") as stream:
        assert write_records(stream, RECORDS) == len(RECORDS)
    assert [r.numpy() for r in tf.data.TFRecordDataset(str(path))] == RECORDS


def test_we_read_tensorflows_framing(tmp_path):
    path = tmp_path / "tf.tfrecord"
    with tf.io.TFRecordWriter(str(path)) as writer:
        for record in RECORDS:
            writer.write(record)
    with open(path, "rb") as stream:
        assert list(read_records(stream)) == RECORDS


def test_masked_crc_known_value():
    # crc32c("123456789") = 0xE3069283 (RFC 3720); masked as TFRecord does.
    crc = 0xE3069283
    assert masked_crc(b"123456789") == (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


@pytest.mark.parametrize(("offset", "message"), [(3, "length CRC"), (20, "data CRC"), (-2, "data CRC")])
def test_corruption_is_detected(offset, message):
    stream = io.BytesIO()
    write_records(stream, [b"payload-bytes-here"])
    data = bytearray(stream.getvalue())
    data[offset] ^= 0x01
    with pytest.raises(CorruptRecordError, match=message):
        list(read_records(io.BytesIO(bytes(data)), name="x"))


def test_truncation_is_detected():
    stream = io.BytesIO()
    write_records(stream, [b"payload"] * 2)
    with pytest.raises(CorruptRecordError, match="record 1: truncated"):
        list(read_records(io.BytesIO(stream.getvalue()[:-3])))
