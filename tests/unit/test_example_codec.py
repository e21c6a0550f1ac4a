"""The schema-compiled tf.Example encoder against TensorFlow's own parser and protobuf classes."""

from __future__ import annotations

import io

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from schemas import tfrecord
from schemas.example_codec import ExampleEncoder, varint
from schemas.record_decoder import ExampleDecoder
from schemas.schema import Feature

INT64_EDGES = [0, 1, 127, 128, 300, 2**31, 2**53 + 1, 2**63 - 1, -1, -128, -(2**63)]


def _spec(features):
    dtypes = {"float32": tf.float32, "int64": tf.int64}
    return {f.name: tf.io.FixedLenFeature(f.shape, dtypes[f.dtype]) for f in features}


def _reference_example(features, columns, i) -> tf.train.Example:
    example = tf.train.Example()
    for f in features:
        values = np.asarray(columns[f.name][i]).reshape(-1)
        if f.dtype == "float32":
            example.features.feature[f.name].float_list.value.extend(values.tolist())
        else:
            example.features.feature[f.name].int64_list.value.extend(values.tolist())
    return example


FEATURES = [
    Feature("t", "float32", (3, 2, 2), ("level", "lat", "lon"), "variable"),
    Feature("index/time", "int64", (), (), "index"),
    Feature("coord/time", "int64", (4,), ("time",), "coord"),
    Feature("coord/lat", "float32", (2,), ("lat",), "coord"),
    Feature("odd name é\"'\n", "float32", (1,), ("x",), "variable"),
]


def _columns(n: int, rng) -> dict[str, np.ndarray]:
    return {
        "t": rng.normal(250, 30, (n, 3, 2, 2)).astype(np.float32),
        "index/time": rng.choice(INT64_EDGES, n).astype(np.int64),
        "coord/time": rng.choice(INT64_EDGES, (n, 4)).astype(np.int64),
        "coord/lat": np.array([[np.nan, -np.inf]] * n, dtype=np.float32),
        "odd name é\"'\n": rng.normal(size=(n, 1)).astype(np.float32),
    }


def test_records_equal_protobuf_and_parse_with_tensorflow():
    columns = _columns(40, np.random.default_rng(0))
    records = ExampleEncoder(FEATURES).encode(columns)
    assert len(records) == 40
    for i, record in enumerate(records):
        assert tf.train.Example.FromString(record) == _reference_example(FEATURES, columns, i)
    parsed = tf.io.parse_example(records, _spec(FEATURES))
    for f in FEATURES:
        np.testing.assert_array_equal(parsed[f.name].numpy(), columns[f.name])


def test_strided_big_endian_and_float64_columns_encode_as_their_float32_copies():
    """Any float array encodes as its contiguous float32 copy would (the records are made from that copy; a block's
    own contiguous float32 arrays are read in place)."""
    columns = _columns(12, np.random.default_rng(1))
    wide = np.random.default_rng(2).normal(250, 30, (12, 3, 2, 5))
    varied = {
        **columns,
        "t": wide[:, :, :, 1:5:2],  # a strided view of float64, as a patch of a slab
        "coord/lat": columns["coord/lat"].astype(">f4"),
        "odd name é\"'\n": columns["odd name é\"'\n"].reshape(12),  # any shape of the right size
    }
    plain = {**columns, "t": np.ascontiguousarray(wide[:, :, :, 1:5:2], dtype="<f4")}
    encoder = ExampleEncoder(FEATURES)
    assert encoder.encode(varied) == encoder.encode(plain)


def test_a_float_column_of_another_size_is_refused_by_name():
    columns = _columns(4, np.random.default_rng(3))
    short = {**columns, "t": columns["t"][:, :1]}
    with pytest.raises(ValueError, match=r"'t': 16 values for 4 samples of 12"):
        ExampleEncoder(FEATURES).encode(short)


def test_numpy_decoder_matches_tensorflow():
    columns = _columns(25, np.random.default_rng(1))
    records = ExampleEncoder(FEATURES).encode(columns)
    decoded = ExampleDecoder(FEATURES).decode_batch(records)
    parsed = tf.io.parse_example(records, _spec(FEATURES))
    for f in FEATURES:
        np.testing.assert_array_equal(decoded[f.name], parsed[f.name].numpy())
        assert decoded[f.name].dtype == np.dtype(f.dtype)


def test_decoder_rejects_a_record_of_another_shape():
    record = ExampleEncoder(FEATURES).encode(_columns(1, np.random.default_rng(2)))[0]
    smaller = [Feature("t", "float32", (2, 2), ("lat", "lon"), "variable")]
    with pytest.raises(ValueError, match="'t' has 12 values, schema says 4"):
        ExampleDecoder(smaller).decode(record)


def test_the_longest_record_bounds_every_record_and_is_exact_for_floats():
    encoder = ExampleEncoder(FEATURES)
    columns = _columns(200, np.random.default_rng(3))
    assert max(len(r) for r in encoder.encode(columns)) <= encoder.max_record_length()
    columns["index/time"][:] = -1  # negative int64s take a varint's longest, 10 bytes
    columns["coord/time"][:] = -(2**63)
    assert {len(r) for r in encoder.encode(columns)} == {encoder.max_record_length()}
    floats = ExampleEncoder([f for f in FEATURES if f.dtype == "float32"])
    assert {len(r) for r in floats.encode(columns)} == {floats.max_record_length()}


def test_varints_match_the_scalar_reference():
    values = np.array([INT64_EDGES, INT64_EDGES[::-1]], dtype=np.int64)
    feature = Feature("i", "int64", (len(INT64_EDGES),), ("x",), "coord")
    records = ExampleEncoder([feature]).encode({"i": values})
    for record, row in zip(records, values):  # the packed values end the record
        assert record.endswith(b"".join(varint(int(v)) for v in row))


@pytest.mark.parametrize("largest", [0, 1, 127, 128, 16383, 16384, 2**35, 2**63 - 1])
def test_varints_of_values_no_wider_than_the_largest_match_the_scalar_reference(largest):
    """The encoder loops over as many varint bytes as the block's widest value takes: every narrower one still
    encodes as the reference does, and every length of the column's varints is right."""
    values = np.random.default_rng(largest % 1000).integers(0, largest, (50, 3), endpoint=True, dtype=np.int64)
    values[0, 0] = largest
    feature = Feature("i", "int64", (3,), ("x",), "coord")
    encoder = ExampleEncoder([feature])
    records = encoder.encode({"i": values})
    for record, row in zip(records, values):
        assert record.endswith(b"".join(varint(int(v)) for v in row))
    assert encoder.record_lengths({"i": values}, len(values)).tolist() == [len(r) for r in records]


@pytest.mark.parametrize("checksum", ["crc32c", "google-crc32c"])
def test_framed_rows_are_the_records_framed_whatever_their_layouts(checksum, monkeypatch):
    """Samples whose int64s take other varint lengths get other layouts (1 + 2 and 2 + 1 bytes make one);
    every row is its record framed, with either checksum library."""
    if checksum == "google-crc32c":
        monkeypatch.setattr(tfrecord, "_buffer_crc32c", None)
    columns = _columns(60, np.random.default_rng(7))
    columns["index/time"] = np.where(np.arange(60) % 3 == 0, 300, 5)  # 2 bytes or 1, interleaved
    columns["coord/time"][:] = 1
    columns["coord/time"][:20] = [[1, 300, 1, 1]] * 10 + [[300, 1, 1, 1]] * 10
    encoder = ExampleEncoder(FEATURES)
    rows = encoder.rows(columns)
    assert len(rows.arrays) == 4 and min(len(samples) for samples in rows.samples) > 1  # layouts of many samples
    assert sorted(np.concatenate(rows.samples).tolist()) == list(range(60))
    framed = [bytes(row) for row in rows.in_order()]
    assert rows.sizes().tolist() == [len(f) for f in framed]
    records = list(tfrecord.read_records(io.BytesIO(b"".join(framed))))  # both CRCs checked
    assert framed == [tfrecord.frame(record) for record in records]
    for i, record in enumerate(records):  # each sample's own values, by protobuf's parser
        assert tf.train.Example.FromString(record) == _reference_example(FEATURES, columns, i)
    assert encoder.encode(columns) == records
    assert encoder.rows({name: column[:0] for name, column in columns.items()}).in_order() == []


@given(
    shape=hnp.array_shapes(min_dims=0, max_dims=3, max_side=4),
    n=st.integers(1, 5),
    data=st.data(),
)
def test_any_shape_round_trips_through_tensorflow(shape, n, data):
    features = [
        Feature("x", "float32", shape, tuple(f"d{i}" for i in range(len(shape))), "variable"),
        Feature("i", "int64", shape, tuple(f"d{i}" for i in range(len(shape))), "index"),
    ]
    floats = data.draw(hnp.arrays(np.float32, (n, *shape), elements=st.floats(width=32, allow_nan=False)))
    ints = data.draw(hnp.arrays(np.int64, (n, *shape)))
    encoder = ExampleEncoder(features)
    records = encoder.encode({"x": floats, "i": ints})
    parsed = tf.io.parse_example(records, _spec(features))
    np.testing.assert_array_equal(parsed["x"].numpy(), floats)
    np.testing.assert_array_equal(parsed["i"].numpy(), ints)
    assert ExampleDecoder(features).decode(records[0]).keys() == {"x", "i"}
    framed = encoder.rows({"x": floats, "i": ints})  # the records as written: in any layouts, each framed
    assert [bytes(row) for row in framed.in_order()] == [tfrecord.frame(record) for record in records]


def test_masks_are_a_byte_a_value_laid_out_without_their_values_and_parse_with_tensorflow():
    features = [*FEATURES, Feature("mask/t", "int64", (3, 2, 2), ("level", "lat", "lon"), "mask", {"of": "t"})]
    columns = _columns(30, np.random.default_rng(5))
    columns["mask/t"] = np.random.default_rng(6).random((30, 3, 2, 2)) < 0.3  # bool, as the encode stage gives
    encoder = ExampleEncoder(features)
    records = encoder.encode(columns)
    as_ints = encoder.encode({**columns, "mask/t": columns["mask/t"].astype(np.int64)})
    assert records == as_ints  # the bool fast path writes the varints of 0 and 1
    ints = {name: columns[name] for name in ("index/time", "coord/time")}  # no mask column: its size is known
    assert encoder.record_lengths(ints, 30).tolist() == [len(r) for r in records]
    parsed = tf.io.parse_example(records, _spec(features))
    np.testing.assert_array_equal(parsed["mask/t"].numpy(), columns["mask/t"].astype(np.int64))
    np.testing.assert_array_equal(ExampleDecoder(features).decode_batch(records)["mask/t"], parsed["mask/t"].numpy())


@given(st.lists(st.integers(-(2**63), 2**63 - 1), max_size=12))
def test_short_and_long_runs_of_varints_decode_alike(values):
    """Short runs decode in Python (one record read at random), long ones with numpy: the same int64s."""
    from schemas.example_codec import decode_varints

    data = b"".join(varint(v & (2**64 - 1)) for v in values)
    padded = data * 4  # past the Python path's limit
    assert decode_varints(data, 0, len(data)).tolist() == values
    assert decode_varints(padded, 0, len(padded)).tolist() == values * 4
