"""Hostile outputs: a schema.json that names files outside the output or is malformed, a FIFO in a file's place.

Every reader (Reader, RandomAccessSource, verify_output) refuses them in one line naming the file at fault.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from synthetic_output import FEATURES, make_columns, write_output

from schemas.errors import UserError
from schemas.random_access import RandomAccessSource
from schemas.reader import Reader
from schemas.verify import VerifyError, verify_output


def _output(directory: Path) -> Path:
    """A complete two-shard output of 21 samples, with the parser.py verify_output wants."""
    write_output(directory, make_columns(FEATURES, 21), [10, 11], listed=True)  # (its tests edit the shard list)
    (directory / "parser.py").write_text("")
    return directory


@pytest.fixture
def outputs(tmp_path) -> tuple[Path, Path]:
    """This output, and another beside it whose shards a tampered schema.json could point at."""
    return _output(tmp_path / "this"), _output(tmp_path / "other")


def _edit_schema(output: Path, change) -> None:
    path = output / "schema.json"
    schema = json.loads(path.read_text())
    change(schema)
    path.write_text(json.dumps(schema))


def _first_shard(schema: dict) -> dict:
    return schema["splits"]["data"]["shards"][0]


#: What each reader does with an output: read it all, or one sample of the shard with the FIFO.
READS = {
    "Reader": lambda path: Reader(str(path), "data").read_all(),
    "RandomAccessSource": lambda path: RandomAccessSource(str(path), "data")[15],
    "verify_output": lambda path: verify_output(str(path)),
}


def _refused(read, path) -> str:
    """The one-line message a reader refuses the output with."""
    with pytest.raises(UserError) as caught:
        read(path)
    message = str(caught.value)
    assert "\n" not in message, message
    if read is READS["verify_output"]:
        assert isinstance(caught.value, VerifyError)  # what `inspect --verify` reports
    return message


@pytest.mark.parametrize("reader", sorted(READS))
@pytest.mark.parametrize(
    ("key", "name"),
    [
        ("file", "../other/data-00000-of-00002.tfrecord"),
        ("file", "/etc/passwd"),
        ("file", "sub/data-00000-of-00002.tfrecord"),
        ("file", ".."),
        ("index", "../other/data-00000-of-00002.tfrecord.tfindex"),
    ],
)
def test_a_shard_name_outside_the_output_is_refused(outputs, reader, key, name):
    this, _ = outputs
    _edit_schema(this, lambda schema: _first_shard(schema).__setitem__(key, name))
    message = _refused(READS[reader], this)
    assert message.startswith(f"{this / 'schema.json'}: ")
    assert f"splits.data.shards[0].{key}: {name!r} is not the name of a file in the output's folder" in message
    assert message.endswith("build the output again")


@pytest.mark.parametrize(
    ("reader", "victim"),
    [
        ("Reader", "data-00001-of-00002.tfrecord"),
        ("RandomAccessSource", "data-00001-of-00002.tfrecord"),
        ("RandomAccessSource", "data-00001-of-00002.tfrecord.tfindex"),
        ("verify_output", "data-00001-of-00002.tfrecord"),
        ("verify_output", "data-00001-of-00002.tfrecord.tfindex"),
        ("verify_output", "stats.json"),
        ("Reader", "schema.json"),
        ("verify_output", "schema.json"),
    ],
)
@pytest.mark.timeout(60)  # a reader that opens the FIFO blocks for ever: the alarm ends the open, the test fails
def test_a_fifo_in_a_files_place_is_refused_not_waited_on(outputs, reader, victim):
    this, _ = outputs
    (this / victim).unlink()
    os.mkfifo(this / victim)
    message = _refused(READS[reader], this)
    assert message == f"{this / victim}: not a regular file (a FIFO); build the output again"


def test_load_dataset_refuses_a_fifo_in_a_shards_place(outputs):
    """TensorFlow's reader would block on it as the numpy readers would."""
    from schemas.dataset import load_dataset

    this, _ = outputs
    shard = this / "data-00001-of-00002.tfrecord"
    shard.unlink()
    os.mkfifo(shard)
    # Refused as the pipeline is made: iterating would block inside tf.data, where no signal can end the wait.
    with pytest.raises(ValueError) as caught:
        load_dataset(str(this), "data", batch_size=4)
    assert str(caught.value) == f"{shard}: not a regular file; build the output again"


def _deep_nest(output: Path) -> str:
    (output / "schema.json").write_text("[" * 100_000 + "]" * 100_000)
    return "JSON nested too deeply to be a schema"


def _not_json(output: Path) -> str:
    (output / "schema.json").write_text('{"format": "xarray-tfrecords/1",')
    return "not JSON ("


def _edited(change, problem: str):
    def damage(output: Path) -> str:
        _edit_schema(output, change)
        return problem

    damage.__name__ = problem.split(":")[0]
    return damage


@pytest.mark.parametrize("reader", sorted(READS))
@pytest.mark.parametrize(
    "damage",
    [
        _deep_nest,
        _not_json,
        _edited(lambda s: s["splits"]["data"].__setitem__("shards", None), "splits.data.shards: None is not a list"),
        _edited(lambda s: s.__setitem__("splits", []), "splits: [] is not an object"),
        _edited(
            lambda s: _first_shard(s).__setitem__("records", "21"),
            "splits.data.shards[0].records: '21' is not a whole number",
        ),
        _edited(lambda s: _first_shard(s).__setitem__("bytes", -1), "splits.data.shards[0].bytes: -1 is negative"),
        _edited(lambda s: _first_shard(s).__setitem__("extra", 1), "splits.data.shards[0]: unknown key 'extra'"),
        _edited(lambda s: s["splits"]["data"].__setitem__("records", "21"), "splits.data.records: '21' is not a whole"),
        _edited(
            lambda s: s["features"][0].__setitem__("shape", [10**6, 10**6, 1]),
            "features[0].shape: [1000000, 1000000, 1] is 1,000,000,000,000 values, more than a record can hold",
        ),
        _edited(lambda s: s["features"][0].__setitem__("shape", None), "features[0].shape: None is not a list"),
        _edited(lambda s: s["features"][0].__setitem__("shape", [2, 3.5, 4]), "features[0].shape: 3.5 is not a whole"),
        _edited(lambda s: s["features"][0].__setitem__("dtype", "object"), "feature 't': dtype 'object' is not"),
        _edited(lambda s: s["features"][0].pop("name"), "features[0].name: None is not a string"),
        _edited(lambda s: s.__setitem__("features", {}), "features: {} is not a list"),
        _edited(lambda s: s.__setitem__("examples_per_record", 0), "examples_per_record: 0 is not between 1 and"),
        _edited(lambda s: s.__setitem__("sample", []), "sample: [] is not an object"),
    ],
)
def test_a_malformed_schema_json_is_one_line_naming_it(outputs, reader, damage):
    this, _ = outputs
    problem = damage(this)
    message = _refused(READS[reader], this)
    assert message.startswith(f"{this / 'schema.json'}: not a valid schema ({problem}"), message
    assert message.endswith("; build the output again")


def test_verify_says_the_fix_once_for_a_damaged_index(outputs):
    this, _ = outputs
    (this / "data-00000-of-00002.tfrecord.tfindex").write_text("not an index\n")
    message = _refused(READS["verify_output"], this)
    index = this / "data-00000-of-00002.tfrecord.tfindex"
    assert message == f"{index}: not an index (lines of two whole numbers); rebuild the output"


def test_verify_output_is_exported_by_schemas():
    import schemas

    assert schemas.verify_output is verify_output and schemas.VerifyError is VerifyError
    assert {"verify_output", "VerifyError"} <= set(schemas.__all__)


#: sample.axes as a build records them, for the synthetic output's features (t: level, lat, lon = 2, 3, 4).
AXES = [
    {"dim": "time", "role": "window", "size": 3},
    {"dim": "level", "role": "keep", "length": 2},
    {"dim": "lat", "role": "window", "size": 3},
    {"dim": "lon", "role": "window", "size": 4},
]


def _load_dataset(path):
    from schemas.dataset import load_dataset

    return sum(len(batch["t"]) for batch in load_dataset(str(path), "data", batch_size=8))


@pytest.mark.parametrize("reader", [*sorted(READS), "load_dataset"])
def test_a_shape_permuted_with_the_same_number_of_values_is_refused(outputs, reader):
    """Records hold values flat: shape [2, 4, 3] for [2, 3, 4] decoded silently into the wrong places."""
    read = READS.get(reader, _load_dataset)
    this, _ = outputs
    _edit_schema(this, lambda schema: schema["sample"].__setitem__("axes", AXES))
    read(this)  # as built: read
    _edit_schema(this, lambda schema: schema["features"][0].__setitem__("shape", [2, 4, 3]))
    message = _refused(read, this)
    assert message == (
        f"{this / 'schema.json'}: feature 't' is 4 long along 'lat' (shape [2, 4, 3]), but sample.axes (window) "
        "says 3; build the output again"
    )
