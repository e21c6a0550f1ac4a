"""Damaged shards under the TensorFlow readers: load_dataset and parser.py end in one line naming the shard.

A shard cut short at a record boundary, emptied, or with records appended would otherwise be read as a
short or long epoch without a word; a record whose length header says 2**40 (its checksum valid) would
end the process inside TensorFlow's reader. The numpy readers name the record instead of a MemoryError.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from synthetic_output import FEATURES, make_columns, write_output

from schemas.errors import UserError
from schemas.parser_codegen import render_parser
from schemas.reader import Reader
from schemas.shard_index import index_name
from schemas.tfrecord import CorruptRecordError, frame_header
from schemas.verify import VerifyError, verify_output

from helpers import import_generated_parser

SHARD = "data-00001-of-00002.tfrecord"
#: Samples in the output, and in its second shard.
SAMPLES, IN_SHARD = 21, 11


def _output(directory: Path, compression: str | None = None, listed: bool = False) -> Path:
    columns = make_columns(FEATURES, SAMPLES)
    schema = write_output(directory, columns, [10, IN_SHARD], compression=compression, listed=listed)
    (directory / "parser.py").write_text(render_parser(schema, str(directory)))
    return directory


def _offsets(output: Path) -> list[int]:
    """Where each record of the second shard starts (from its index)."""
    return [int(line.split()[0]) for line in (output / index_name(SHARD)).read_text().splitlines()]


def _cut_at_record(output: Path) -> None:
    os.truncate(output / SHARD, _offsets(output)[4])  # an interrupted copy, at a record boundary


def _emptied(output: Path) -> None:
    os.truncate(output / SHARD, 0)


def _appended(output: Path) -> None:
    shard = output / SHARD
    shard.write_bytes(shard.read_bytes() + shard.read_bytes()[: _offsets(output)[3]])  # its first 3 records again


def _huge_length(output: Path) -> None:
    """Record 5's length header says 2**40 bytes, its own checksum valid (only the length's value is wrong)."""
    with open(output / SHARD, "r+b") as stream:
        stream.seek(_offsets(output)[5])
        stream.write(frame_header(2**40))


def _load_dataset(output: Path):
    from schemas.dataset import load_dataset

    return load_dataset(str(output), "data", batch_size=4)


def _parser(output: Path):
    return import_generated_parser(output).make_dataset("data", batch_size=4)


TF_READERS = {"load_dataset": _load_dataset, "parser.py": _parser}


def _samples(dataset) -> int:
    return sum(len(batch["index/time"]) for batch in dataset.as_numpy_iterator())


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    return _output(tmp_path_factory.mktemp("tf_trust") / "out")


@pytest.fixture
def output(pristine, tmp_path) -> Path:
    """A fresh copy of the pristine output to damage."""
    copy = tmp_path / "out"
    copy.mkdir()
    for file in pristine.iterdir():
        (copy / file.name).write_bytes(file.read_bytes())
    (copy / "parser.py").write_text(render_parser(_schema(pristine), str(copy)))
    return copy


def _schema(output: Path):
    from schemas.metadata import load_schema

    return load_schema(str(output))


@pytest.mark.parametrize("reader", sorted(TF_READERS))
def test_an_intact_output_is_read_whole(output, reader):
    assert _samples(TF_READERS[reader](output)) == SAMPLES


@pytest.mark.parametrize("reader", sorted(TF_READERS))
@pytest.mark.parametrize(
    ("damage", "found"),
    [(_cut_at_record, "cut"), (_emptied, "emptied"), (_appended, "appended")],
)
def test_a_shard_of_another_size_is_refused_before_reading(output, reader, damage, found):
    listed = (output / SHARD).stat().st_size
    damage(output)
    size = (output / SHARD).stat().st_size
    with pytest.raises(ValueError) as caught:
        TF_READERS[reader](output)
    assert str(caught.value) == (
        f"{output / SHARD}: {size} bytes on disk, schema.json says {listed} (the shard was cut short, emptied or "
        "written to since); build the output again"
    )
    if reader == "load_dataset":
        assert isinstance(caught.value, UserError)


def _changed_after_opening(output: Path, reader: str, damage) -> str:
    """The error that ends iterating a dataset made before ``damage``: what the size check at open cannot see."""
    import tensorflow as tf

    dataset = TF_READERS[reader](output)
    damage(output)
    with pytest.raises(tf.errors.InvalidArgumentError) as caught:
        _samples(dataset)
    return caught.value.message


@pytest.mark.parametrize("reader", sorted(TF_READERS))
def test_a_shard_cut_after_opening_ends_the_epoch_with_its_name(output, reader):
    message = _changed_after_opening(output, reader, _cut_at_record)
    assert f"{output / SHARD}: 4 records, but schema.json lists {IN_SHARD} (the shard changed" in message


@pytest.mark.parametrize("reader", sorted(TF_READERS))
def test_records_appended_after_opening_end_the_epoch_naming_the_first_extra_one(output, reader):
    message = _changed_after_opening(output, reader, _appended)
    assert f"{output / SHARD}: record {IN_SHARD}: more records than the {IN_SHARD} schema.json lists" in message


def test_a_compressed_shard_holding_fewer_records_is_counted(tmp_path):
    """A gzip shard cannot be walked without decompressing it: its records are counted as they are read."""
    import tensorflow as tf

    output = _output(tmp_path / "out", compression="gzip", listed=True)  # (its shard list edited below)
    shard = output / (SHARD + ".gz")
    short = gzip.compress(gzip.decompress(shard.read_bytes())[:100])  # not even one whole record
    shard.write_bytes(short)
    schema = json.loads((output / "schema.json").read_text())
    schema["splits"]["data"]["shards"][1]["bytes"] = len(short)  # the size check passes: only the count can tell
    (output / "schema.json").write_text(json.dumps(schema))
    with pytest.raises(tf.errors.DataLossError):  # TensorFlow's own: a record cut short
        _samples(_load_dataset(output))
    records = gzip.decompress((output / "data-00000-of-00002.tfrecord.gz").read_bytes())
    shard.write_bytes(gzip.compress(records))  # the first shard's 10 records where 11 are listed
    schema["splits"]["data"]["shards"][1]["bytes"] = shard.stat().st_size
    (output / "schema.json").write_text(json.dumps(schema))
    with pytest.raises(tf.errors.InvalidArgumentError) as caught:
        _samples(_load_dataset(output))
    assert f"{shard}: 10 records, but schema.json lists {IN_SHARD}" in caught.value.message


_HUGE = "its length header says 1099511627776 bytes, past the shard's end"


def test_an_absurd_length_header_is_named_not_a_crash(output):
    """TensorFlow would allocate 2**40 bytes and end the process: run where a crash cannot take pytest down."""
    _huge_length(output)
    script = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(Path(__file__).parents[1])!r})
        from helpers import import_generated_parser
        from schemas.dataset import load_dataset
        for make in (lambda: load_dataset({str(output)!r}, "data", batch_size=4),
                     lambda: import_generated_parser({str(output)!r}).make_dataset("data", batch_size=4)):
            try:
                sum(1 for _ in make())
            except ValueError as error:
                print(type(error).__name__, error)
        """
    )
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    expected = f"{output / SHARD}: record 5: {_HUGE} at byte {(output / SHARD).stat().st_size}; the shard is damaged"
    lines = run.stdout.splitlines()
    assert [line.split(" ", 1)[0] for line in lines] == ["UserError", "ValueError"], run.stdout
    assert all(expected in line for line in lines), run.stdout


def test_the_numpy_readers_name_the_record_with_an_absurd_length(output):
    _huge_length(output)
    size = (output / SHARD).stat().st_size
    with pytest.raises(CorruptRecordError) as caught:
        Reader(str(output), "data").read_all()
    assert str(caught.value) == f"{output / SHARD}: record 5: {_HUGE} at byte {size}"
    with pytest.raises(VerifyError) as caught:
        verify_output(str(output))
    assert str(caught.value) == (
        f"{output / SHARD}: record 5: {_HUGE} at byte {size}; the shard is damaged: build the output again"
    )


def test_a_length_header_past_the_end_of_a_compressed_shard_costs_no_more_memory_than_it_holds(tmp_path):
    """A gzip shard's decompressed size is unknown: the record's data is asked for in pieces, never all at once."""
    output = _output(tmp_path / "out", compression="gzip")
    shard = output / (SHARD + ".gz")
    records = bytearray(gzip.decompress(shard.read_bytes()))
    records[:12] = frame_header(2**40)
    shard.write_bytes(gzip.compress(bytes(records)))
    with pytest.raises(CorruptRecordError) as caught:
        list(Reader(str(output), "data").iter_records(Reader(str(output), "data").shards[1]))
    assert str(caught.value) == f"{shard}: record 0: truncated data"


def test_the_check_at_open_reads_headers_alone(output):
    """A record's data changed (its CRC wrong) passes the walk of the headers: TensorFlow finds it as it reads."""
    import tensorflow as tf

    with open(output / SHARD, "r+b") as stream:
        stream.seek(_offsets(output)[2] + 12 + 3)
        byte = stream.read(1)
        stream.seek(-1, os.SEEK_CUR)
        stream.write(bytes([byte[0] ^ 0xFF]))
    dataset = _load_dataset(output)  # opens: the walk passes
    with pytest.raises(tf.errors.DataLossError):
        _samples(dataset)


@pytest.mark.parametrize(
    ("argument", "value"),
    [("epoch", "x"), ("epoch", -1), ("epoch", 1.5), ("epoch", True), ("epoch", 2**64), ("seed", "s"), ("seed", 2.0)],
)
def test_an_epoch_or_seed_that_is_no_order_is_one_line_before_tf_data(output, argument, value):
    """Refused as load_dataset is called: inside tf.data it came wrapped in TensorFlow's text, with a traceback."""
    from schemas.dataset import load_dataset

    arguments = {"epoch": 0, argument: value}
    with pytest.raises(UserError) as caught:
        load_dataset(str(output), "data", batch_size=4, **arguments)
    message = str(caught.value)
    assert message.startswith(f"load_dataset({argument}=...): {value!r} is ") and message.count("\n") == 0
    assert message.endswith("2**64-1") or message.endswith("in that range"), message


def test_the_epoch_order_reads_every_sample_once(output):
    from schemas.dataset import load_dataset

    batches = load_dataset(str(output), "data", batch_size=4, epoch=2**64 - 1, seed=3).as_numpy_iterator()
    assert sorted(i for batch in batches for i in batch["index/time"].tolist()) == list(range(SAMPLES))


@pytest.mark.parametrize("damage", [_cut_at_record, _huge_length])
def test_the_epoch_order_checks_the_shards_at_open(output, damage):
    from schemas.dataset import load_dataset

    damage(output)
    with pytest.raises(UserError) as caught:
        load_dataset(str(output), "data", batch_size=4, epoch=1)
    assert str(caught.value).startswith(f"{output / SHARD}: ")
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("per_record", [1, 4])
@pytest.mark.parametrize(
    "options",
    [{}, {"shuffle_buffer": 8, "seed": 1}, {"drop_remainder": True}, {"num_parallel_reads": 1}],
    ids=["plain", "shuffled", "drop_remainder", "one_reader"],
)
def test_every_sample_is_read_once_whatever_the_options(tmp_path, per_record, options):
    """The records are counted in chunks of each shard: chunks batch into whole batches, records of every shard."""
    from schemas.dataset import load_dataset

    output = tmp_path / "out"
    write_output(output, make_columns(FEATURES, SAMPLES), [10, IN_SHARD], examples_per_record=per_record)
    batches = list(load_dataset(str(output), "data", batch_size=4, **options).as_numpy_iterator())
    seen = [i for batch in batches for i in batch["index/time"].tolist()]
    assert [len(batch["index/time"]) for batch in batches[:-1]] == [4] * (len(batches) - 1)
    if options.get("drop_remainder"):
        assert len(seen) == SAMPLES // 4 * 4 and len(set(seen)) == len(seen)
    else:
        assert sorted(seen) == list(range(SAMPLES))


@pytest.mark.parametrize("damage", [_cut_at_record, _emptied, _appended], ids=["cut", "emptied", "appended"])
def test_random_access_refuses_a_shard_of_another_size_at_open(output, damage):
    """open_source (and so shuffled_stream) served the samples before a cut and failed mid-epoch at the first after
    it; a shard written to since was read as if whole. Refused at open now, naming the shard, as load_dataset does."""
    from schemas.random_access import open_source
    from schemas.stream import shuffled_stream

    assert len(open_source(str(output))) == SAMPLES
    damage(output)
    for open_it in (lambda: open_source(str(output)), lambda: shuffled_stream(str(output), seed=1)):
        with pytest.raises(UserError) as caught:
            open_it()
        assert str(caught.value).startswith(f"{output / SHARD}: ") and "bytes on disk, schema.json says" in str(
            caught.value
        )
