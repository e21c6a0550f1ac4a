"""The numpy reader: equal to TensorFlow's parser bit for bit, gzip and packed shards, corruption caught."""

from __future__ import annotations

import gzip
import io
import random

import fsspec
import numpy as np
import pytest
import tensorflow as tf
from synthetic_output import FEATURES, make_columns, write_output

from schemas.example_codec import ExampleEncoder
from schemas.reader import Reader, read_split, rebatch, shuffled
from schemas.record_decoder import ExampleDecoder
from schemas.schema import Feature
from schemas.tfrecord import CorruptRecordError, frame, read_records

_TF_DTYPES = {"float32": tf.float32, "int64": tf.int64}


def tf_parse(records: list[bytes], features) -> dict[str, np.ndarray]:
    spec = {f.name: tf.io.FixedLenFeature(f.shape, _TF_DTYPES[f.dtype]) for f in features}
    return {name: value.numpy() for name, value in tf.io.parse_example(tf.constant(records), spec).items()}


def assert_identical(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    """Same names, dtypes, shapes and bytes (so NaN payloads and -0.0 count too)."""
    assert sorted(got) == sorted(want)
    for name, values in want.items():
        assert got[name].dtype == values.dtype and got[name].shape == values.shape, name
        assert got[name].tobytes() == values.tobytes(), name


def records_of(path) -> list[bytes]:
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rb") as stream:
        return list(read_records(stream))


def records_of_bytes(data: bytes) -> list[bytes]:
    return list(read_records(io.BytesIO(data)))


@pytest.mark.parametrize("compression", [None, "gzip"])
@pytest.mark.parametrize("examples_per_record", [1, 4])
def test_reader_equals_tensorflow_and_the_written_samples(tmp_path, compression, examples_per_record):
    columns = make_columns(FEATURES, 23)
    schema = write_output(
        tmp_path, columns, [10, 0, 13], compression=compression, examples_per_record=examples_per_record
    )
    record_features = schema.record_features()
    for shard in schema.splits["data"]:
        assert shard.file.endswith(".tfrecord.gz" if compression else ".tfrecord")
        records = records_of(tmp_path / shard.file)
        if not records:
            continue
        # What TensorFlow reads from the same file (GZIP as tf.data reads it) equals our decoding.
        options = "GZIP" if compression else ""
        tf_records = [r.numpy() for r in tf.data.TFRecordDataset(str(tmp_path / shard.file), options)]
        assert tf_records == records
        assert_identical(ExampleDecoder(record_features).decode_batch(records), tf_parse(records, record_features))
    assert_identical(read_split(str(tmp_path)), columns)
    examples = list(Reader(str(tmp_path)))
    assert len(examples) == 23
    assert examples[5]["t"].shape == (2, 3, 4) and examples[5]["w"].shape == () and examples[5]["w"].dtype == np.float32
    assert [int(e["index/time"]) for e in examples] == list(range(23))


def test_records_in_another_layout_decode_like_tensorflow():
    """Features in another order, an extra feature, a duplicate key: the generic path, same answer."""
    columns = make_columns(FEATURES, 6, seed=3)
    records = []
    for i in range(6):
        feature = {}
        for f in reversed(FEATURES):
            values = columns[f.name][i].reshape(-1).tolist()
            if f.dtype == "float32":
                feature[f.name] = tf.train.Feature(float_list=tf.train.FloatList(value=values))
            else:
                feature[f.name] = tf.train.Feature(int64_list=tf.train.Int64List(value=values))
        feature["extra"] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"ignored"]))
        records.append(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
    ours = ExampleDecoder(FEATURES).decode_batch(records)
    assert_identical(ours, tf_parse(records, FEATURES))
    assert_identical(ours, {name: values for name, values in columns.items()})


def test_fast_decoder_equals_the_generic_decoder():
    features = (
        *FEATURES,
        Feature("big", "int64", (40,), ("x",), "variable"),
        Feature("e", "float32", (0,), ("y",), "coord"),
    )
    columns = make_columns(features, 50, seed=5)
    records = ExampleEncoder(features).encode(columns)
    decoder = ExampleDecoder(features)
    assert all(decoder._locate_fast(r) is not None for r in records)  # the encoder's layout takes the fast path
    generic = ExampleDecoder(features)
    generic._locate_fast = lambda record: None  # force the protobuf walk every other layout takes
    assert_identical(decoder.decode_batch(records), generic.decode_batch(records))


@pytest.mark.parametrize(
    ("features", "message"),
    [
        ((Feature("missing", "float32", (), (), "variable"),), "record 1: record has no feature 'missing'"),
        ((Feature("w", "float32", (2,), ("x",), "variable"),), "feature 'w' has 1 values, schema says 2"),
        ((Feature("w", "int64", (), (), "variable"),), "feature 'w' is not stored as int64"),
        ((Feature("index/time", "int64", (2,), ("x",), "index"),), "feature 'index/time' has 1 values, schema says 2"),
    ],
)
def test_records_that_do_not_match_the_schema_are_errors(features, message):
    records = ExampleEncoder(FEATURES).encode(make_columns(FEATURES, 2))
    with pytest.raises(ValueError, match=message):
        ExampleDecoder(features).decode_batch(records, first_index=1)
    with pytest.raises(tf.errors.InvalidArgumentError):  # TensorFlow refuses them too
        tf_parse(records, features)


@pytest.mark.parametrize("compression", [None, "gzip"])
def test_corruption_is_detected_and_names_the_shard(tmp_path, compression):
    write_output(tmp_path, make_columns(FEATURES, 20), [20], compression=compression)
    shard = next(tmp_path.glob("data-*"))
    raw = gzip.decompress(shard.read_bytes()) if compression else shard.read_bytes()

    def damaged(data: bytes, message: str):
        shard.write_bytes(gzip.compress(data) if compression else data)
        with pytest.raises(CorruptRecordError, match=f"{shard.name}: .*{message}"):
            list(Reader(str(tmp_path)))

    flipped = bytearray(raw)
    ninth = sum(len(frame(r)) for r in records_of_bytes(raw)[:9])
    flipped[ninth + 12 + 5] ^= 0x01  # inside record 9's data, past its 12-byte header
    damaged(bytes(flipped), "record 9: data CRC mismatch")
    damaged(raw[: len(raw) - 7], "record 19: truncated data")
    damaged(raw + frame(b"\x0a\x00"), "21 records, but schema.json says 20")
    if compression:
        shard.write_bytes(gzip.compress(raw)[:-20])
        with pytest.raises(CorruptRecordError, match=shard.name):
            list(Reader(str(tmp_path)))


def test_batches_cross_shard_boundaries(tmp_path):
    columns = make_columns(FEATURES, 30)
    write_output(tmp_path, columns, [7, 0, 11, 12], examples_per_record=3)
    reader = Reader(str(tmp_path))
    batches = list(reader.iter_batches(8))
    assert [len(b["t"]) for b in batches] == [8, 8, 8, 6]
    assert_identical({k: np.concatenate([b[k] for b in batches]) for k in columns}, columns)
    assert [len(b["t"]) for b in reader.iter_batches(8, drop_remainder=True)] == [8, 8, 8]
    blocks = [{"a": np.arange(n)} for n in (3, 0, 1, 9)]
    assert [b["a"].tolist() for b in rebatch(blocks, 5)] == [[0, 1, 2, 0, 0], [1, 2, 3, 4, 5], [6, 7, 8]]


def test_reads_through_fsspec_urls(tmp_path):
    columns = make_columns(FEATURES, 9)
    write_output(tmp_path, columns, [4, 5], compression="gzip")
    memory = fsspec.filesystem("memory")
    for path in tmp_path.iterdir():
        memory.pipe(f"/xtf-reader-test/{path.name}", path.read_bytes())
    try:
        assert_identical(read_split("memory://xtf-reader-test"), columns)
        assert_identical(read_split(f"file://{tmp_path}"), columns)
    finally:
        memory.rm("/xtf-reader-test", recursive=True)


def test_shuffled_is_a_seeded_permutation():
    items = list(range(100))
    first = list(shuffled(items, 10, np.random.default_rng(1)))
    assert sorted(first) == items and first != items
    assert first == list(shuffled(items, 10, np.random.default_rng(1)))
    assert first != list(shuffled(items, 10, np.random.default_rng(2)))
    assert list(shuffled(items, 0, np.random.default_rng(1))) == items
    random.shuffle(items)  # a buffer larger than the input still returns every item once
    assert sorted(shuffled(items, 1000, np.random.default_rng(1))) == sorted(items)


def test_normalising_with_a_mask_that_schema_json_lacks_is_one_line(tmp_path):
    """stats.json is read from disk: a `filled` entry naming no feature is refused up front, not a KeyError later."""
    import json

    from schemas.errors import UserError

    write_output(tmp_path, make_columns(FEATURES, 4), [4])
    stats = {"normalization": {"w": {"mean": 0.0, "std": 2.0, "filled": {"mask": "mask/w"}}}}
    (tmp_path / "stats.json").write_text(json.dumps(stats))
    with pytest.raises(UserError, match=r"filled points of 'w' by the feature 'mask/w', which schema\.json lacks"):
        Reader(str(tmp_path), normalize=True)
    stats["normalization"]["w"]["filled"] = {"equal_to": 0.0, "where": True}  # found by value: no mask needed
    (tmp_path / "stats.json").write_text(json.dumps(stats))
    raw, normalized = Reader(str(tmp_path)).read_all()["w"], Reader(str(tmp_path), normalize=True).read_all()["w"]
    np.testing.assert_array_equal(normalized, np.where(raw == 0, 0, raw / np.float32(2)))
