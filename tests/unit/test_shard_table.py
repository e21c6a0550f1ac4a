"""schema.json's shards by rule, their counts in shards.npz: read lazily, both formats alike, hostile ones refused."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from synthetic_output import FEATURES, make_columns, rewrite_counts, write_output

from schemas.errors import UserError
from schemas.metadata import load_schema
from schemas.random_access import RandomAccessSource
from schemas.reader import Reader
from schemas.schema import FORMAT, FORMAT_LISTED, Feature, Schema, Shard
from schemas.shards import (
    SHARDS_FILE,
    Generation,
    ShardList,
    ShardTable,
    generation_totals,
    listed_files,
    shard_counts,
)
from schemas.verify import verify_output

SIZES = [10, 11, 0, 7]


def _output(directory: Path, listed: bool = False) -> Path:
    write_output(directory, make_columns(FEATURES, sum(SIZES)), SIZES, listed=listed)
    (directory / "parser.py").write_text("")
    return directory


def _document(output: Path) -> dict:
    return json.loads((output / "schema.json").read_text())


def _edit(output: Path, change) -> None:
    document = _document(output)
    change(document)
    (output / "schema.json").write_text(json.dumps(document))


def test_both_formats_read_the_same_samples_and_shards(tmp_path):
    ruled, listed = _output(tmp_path / "ruled"), _output(tmp_path / "listed", listed=True)
    assert _document(ruled)["format"] == FORMAT and _document(listed)["format"] == FORMAT_LISTED
    assert _document(ruled)["splits"]["data"]["shards"] == len(SIZES)  # a count, not a list
    by_rule, by_list = load_schema(str(ruled)), load_schema(str(listed))
    assert isinstance(by_rule.splits["data"], ShardList) and isinstance(by_list.splits["data"], tuple)
    assert list(by_rule.splits["data"]) == list(by_list.splits["data"]) and by_rule.splits["data"][-1].records == 7
    assert by_rule.splits["data"][1:3] == by_list.splits["data"][1:3]
    assert listed_files(by_rule.splits) == listed_files(by_list.splits)
    assert generation_totals(by_rule.splits, 0) == generation_totals(by_list.splits, 0)
    assert (
        generation_totals(by_rule.splits, 0)["records"] == sum(SIZES)
        and not generation_totals(by_rule.splits, 1)["shards"]
    )
    for key in ("records", "examples", "bytes"):
        assert shard_counts(by_rule.splits["data"], key).tolist() == shard_counts(by_list.splits["data"], key).tolist()
    one, other = Reader(str(ruled), "data").read_all(), Reader(str(listed), "data").read_all()
    for name in one:
        np.testing.assert_array_equal(one[name], other[name])
    assert (
        RandomAccessSource(str(ruled), "data")[20]["index/time"]
        == RandomAccessSource(str(listed), "data")[20]["index/time"]
    )
    verify_output(str(ruled))
    verify_output(str(listed))


def test_opening_reads_no_sidecar_and_the_totals_come_from_schema_json(tmp_path):
    output = _output(tmp_path / "out")
    (output / SHARDS_FILE).unlink()
    schema = load_schema(str(output))
    assert schema.num_examples("data") == sum(SIZES) and schema.num_records() == sum(SIZES)
    assert len(schema.splits["data"]) == len(SIZES)
    assert next(iter(listed_files(schema.splits))).startswith("data-0000")  # names by rule: no sidecar read
    with pytest.raises(UserError, match=rf"{SHARDS_FILE}: missing, but schema.json names it"):
        schema.splits["data"][0]


def test_a_schema_json_stays_the_same_size_whatever_its_shard_count():
    def size(shards: int) -> int:
        rule = Generation(0, shards, None, True, 0, 0, 0)
        table = ShardTable.from_arrays(
            {"train": (rule,)}, {key: np.full(shards, 5) for key in ("records", "examples", "bytes")}
        )
        schema = Schema((Feature("x", "float32", (), (), "variable"),), {"train": table.split("train")})
        return len(schema.dumps()), len(table.data())

    (few, _), (many, many_sidecar) = size(4), size(50_000)
    assert many - few <= 64 and many < 2000  # (the digits of the counts, the sidecar's size and digest)
    assert many_sidecar < 50_000 * 8 + 1000  # 4 bytes a count, examples left out where they equal records


def test_an_append_generation_is_one_more_rule(tmp_path):
    output = _output(tmp_path / "out")
    schema = load_schema(str(output))
    table = schema.shard_table
    later = Generation(1, 2, None, True, 0, 0, 0)
    counts = {key: np.concatenate([table.counts()[key], [3, 4]]) for key in ("records", "examples", "bytes")}
    appended = ShardTable.from_arrays({"data": (*table.rules["data"], later)}, counts)
    names = [shard.file for shard in appended.split("data")]
    assert names[-2:] == ["data-g001-00000-of-00002.tfrecord", "data-g001-00001-of-00002.tfrecord"]
    assert [s.generation for s in appended.split("data")] == [0] * len(SIZES) + [1, 1]
    assert appended.total("data", "records") == sum(SIZES) + 7


def _cut(output: Path) -> None:
    data = (output / SHARDS_FILE).read_bytes()
    (output / SHARDS_FILE).write_bytes(data[:-10])


def _flipped(output: Path) -> None:
    data = bytearray((output / SHARDS_FILE).read_bytes())
    data[-3] ^= 0xFF  # (a count's byte: the size stays)
    (output / SHARDS_FILE).write_bytes(bytes(data))


def _counts_off(output: Path) -> None:
    """A sidecar with a valid digest whose counts do not add up to schema.json's totals."""
    document = _document(output)
    rewrite_counts(output, lambda counts: counts["records"].__setitem__(0, counts["records"][0] + 1))
    _edit(output, lambda forged: forged.update(splits=document["splits"]))


def _negative(output: Path) -> None:
    def change(counts):
        counts["bytes"][0] = -5
        counts["bytes"][1] += 5  # (the total stays)

    rewrite_counts(output, change)


@pytest.mark.parametrize(
    "damage, refused",
    [
        (lambda output: (output / SHARDS_FILE).unlink(), "missing, but schema.json names it"),
        (_cut, "bytes where schema.json says"),
        (_flipped, "not the file schema.json was written with"),
        (_counts_off, "its shards' records add up to 29, but schema.json says 28"),
        (_negative, "holds a negative count"),
    ],
)
def test_a_sidecar_missing_cut_replaced_or_disagreeing_is_refused_in_one_line(tmp_path, damage, refused):
    output = _output(tmp_path / "out")
    damage(output)
    schema = load_schema(str(output))  # (opening reads no sidecar)
    for read in (
        lambda: list(schema.splits["data"]),
        lambda: Reader(str(output), "data").read_all(),
        lambda: verify_output(str(output)),
    ):
        with pytest.raises(UserError) as caught:
            read()
        message = str(caught.value)
        assert "\n" not in message and refused in message and SHARDS_FILE in message, message
        assert "build the output again" in message or "build it again" in message


def _rule(document: dict) -> dict:
    return document["splits"]["data"]["generations"][0]


@pytest.mark.parametrize(
    "change, refused",
    [
        (lambda d: _rule(d).update(shards=2**40), "is more shards than an output can hold"),
        (lambda d: d["splits"]["data"].update(records=1), "splits.data.records: 1, but its generations' add up to 28"),
        (lambda d: d["shards"].update(count=5), "shards.count: 5, but the splits' rules name 4 shards"),
        (lambda d: d["shards"].update(file="../other/shards.npz"), "is not the name of a file in the output's folder"),
        (lambda d: d["shards"].update(sha256="0" * 10), "is not a sha256 in hex"),
        (lambda d: _rule(d).update(compression="zstd"), "is not null or 'gzip'"),
        (lambda d: _rule(d).pop("compression"), "compression: missing"),
        (lambda d: _rule(d).update(records=-1), "is negative"),
        (lambda d: d["splits"]["data"].update(start=1), "splits.data.start: 1, but the splits before it hold 0"),
        (lambda d: d["splits"].update({"../up": d["splits"].pop("data")}), "its shards' names"),
    ],
)
def test_a_schema_json_whose_rules_are_absurd_is_refused_at_open(tmp_path, change, refused):
    output = _output(tmp_path / "out")
    _edit(output, change)
    with pytest.raises(UserError) as caught:
        load_schema(str(output))
    message = str(caught.value)
    assert "\n" not in message and refused in message and "schema.json" in message, message


def test_a_schema_made_in_memory_is_written_by_rule_only_where_its_names_follow_it():
    feature = (Feature("x", "float32", (), (), "variable"),)
    ruled = Schema(feature, {"data": (Shard("data-00000-of-00001.tfrecord", 3, 10),)}).by_rule()
    assert ruled.to_json()["format"] == FORMAT and set(ruled.files()) == {"schema.json", SHARDS_FILE}
    odd = Schema(feature, {"data": (Shard("mine.tfrecord", 3, 10),)})
    assert odd.by_rule() is odd and odd.to_json()["format"] == FORMAT_LISTED and set(odd.files()) == {"schema.json"}


def test_shard_results_combine_as_arrays_in_any_grouping_and_a_shard_reported_twice_is_a_bug():
    import pickle

    from planning.run.contracts import ShardResult
    from planning.run.shard_counts import ShardCounts

    results = [ShardResult("train", n, f"train-{n:05d}-of-00005.tfrecord", 10 + n, 100 + n, 10 + n) for n in (4, 0, 2)]
    one, other = ShardCounts.of(results[:1]), pickle.loads(pickle.dumps(ShardCounts.of(results[1:])))
    one.absorb(other)
    seen, counts = one.dense("train", 5)
    assert seen.tolist() == [True, False, True, False, True]
    assert counts["records"].tolist() == [10, 0, 12, 0, 14] and counts["bytes"].tolist() == [100, 0, 102, 0, 104]
    assert one.indexed("train") == {False} and one.named("train")[1] == "train-00004-of-00005.tfrecord"
    assert not one.dense("val", 2)[0].any()
    one.add(results[0])
    with pytest.raises(RuntimeError, match="reported twice"):
        one.dense("train", 5)
    with pytest.raises(RuntimeError, match="outside 0-2"):
        ShardCounts.of(results).dense("train", 3)
