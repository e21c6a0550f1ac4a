"""The manifest: which files of an output a build wrote (the only ones --overwrite may delete), and its checks."""

from __future__ import annotations

import json
import re

import pytest
from synthetic_output import FEATURES, make_columns, write_output

from planning.run.manifest import (
    FORMAT,
    FORMAT_1,
    MAX_SHARDS,
    Manifest,
    ShardRule,
    build_manifest,
    compacted,
    is_bookkeeping,
    manifest_from_schema,
    parse_shard_name,
)
from planning.run.names import new_run_id, new_temporary_token, temporary_path
from schemas.errors import UserError
from schemas.schema import FORMAT_LISTED as SCHEMA_FORMAT
from schemas.schema import shard_name
from schemas.shard_index import index_name

RUN = "0123456789ab"
SHARD = "data-00000-of-00002.tfrecord"
RULES = [ShardRule("data", 2), ShardRule("train", 16, generation=0), ShardRule("valid", 3, 2, "gzip", index=False)]


def test_a_build_owns_its_files_their_temporaries_and_its_working_directory_only():
    manifest = build_manifest(RUN, RULES)
    for owned in (
        SHARD,
        index_name(SHARD),
        "data-00001-of-00002.tfrecord",
        "train-00003-of-00016.tfrecord",
        "train-00015-of-00016.tfrecord.tfindex",
        "valid-g002-00002-of-00003.tfrecord.gz",
        "schema.json",
        "stats.json",
        "parser.py",
        "generations.json",
        "grid.npz",
        "shards.npz",
        "_manifest.json",
        "_inventory.json",
    ):
        assert manifest.owns(owned), owned
    assert manifest.owns(temporary_path(SHARD, new_temporary_token()))
    assert manifest.owns(temporary_path("train-00003-of-00016.tfrecord", RUN))  # (an in-place shard's)
    assert manifest.owns(f"_tmp/{RUN}/buckets/00000-00003.bucket")
    not_ours = [
        "data-00002-of-00002.tfrecord",  # named like a shard, beyond the rule's count
        "data-00000-of-00003.tfrecord",  # another count
        "train-00003-of-00016.tfrecord.gz",  # another compression
        "train-g001-00003-of-00016.tfrecord",  # another generation
        "train-g000-00003-of-00016.tfrecord",  # no name the tool makes (generation 0 states none)
        "train-000003-of-00016.tfrecord",  # not as shard_name pads it
        "valid-g002-00002-of-00003.tfrecord.gz.tfindex",  # a gzip shard has no index
        "test-00000-of-00001.tfrecord",  # no rule for the split
        f"{SHARD}.tmp-notatoken",
        f"{SHARD}.bak",
        f"_tmp/{new_run_id()}/x",  # another run's working directory
        f"_tmp/{RUN}",  # the directory itself is not a file of it
        f"other/{SHARD}",
        f"../{SHARD}",
    ]
    for name in not_ours:
        assert not manifest.owns(name), name


def test_names_parse_back_exactly_as_shard_name_makes_them():
    for args in [("train", 3, 16, None, 0), ("a_b", 0, 1, "gzip", 7), ("x", 123456, 2190000, None, 1234)]:
        name = shard_name(*args)
        parsed = parse_shard_name(name)
        assert (parsed.split, parsed.number, parsed.count, parsed.compression, parsed.generation) == args
        assert not parsed.index and parse_shard_name(index_name(name)).index
    for other in ["train-3-of-16.tfrecord", "train-00003-of-00016.tfrecord.zst", "-00003-of-00016.tfrecord", ""]:
        assert parse_shard_name(other) is None, other


def test_format_2_holds_rules_not_names_and_reads_back_what_it_wrote():
    manifest = build_manifest(RUN, [ShardRule("train", 2_190_000), ShardRule("valid", 50_000)])
    text = manifest.dumps()
    assert len(text) < 2_000 and json.loads(text)["format"] == FORMAT
    assert Manifest.loads(text) == manifest
    both = manifest.union(build_manifest("ba9876543210", [ShardRule("train", 4, 1)]), {RUN, "ba9876543210"})
    assert Manifest.loads(both.dumps()) == both and both.owns("train-g001-00003-of-00004.tfrecord")


def test_a_format_1_manifest_is_read_and_rewritten_as_the_rules_that_make_exactly_its_names():
    names = [shard_name("train", i, 4) for i in range(4)]
    listed = [*names, *map(index_name, names), shard_name("valid", 0, 2), "schema.json", "_manifest.json"]
    text = json.dumps({"format": FORMAT_1, "runs": [RUN], "files": listed})
    read = Manifest.loads(text)
    assert read.files == set(listed) and not read.shards
    rewritten = read.union(build_manifest("ba9876543210"), [RUN])  # (an append's)
    assert rewritten.shards == {ShardRule("train", 4)}  # valid lists 1 of its 2 shards: kept as a name
    assert rewritten.files - read.files <= {
        "stats.json",
        "parser.py",
        "generations.json",
        "grid.npz",
        "shards.npz",
        "_inventory.json",
    }
    assert shard_name("valid", 0, 2) in rewritten.files and not set(names) & rewritten.files
    candidates = [*listed, shard_name("valid", 1, 2), shard_name("train", 4, 5), index_name(shard_name("valid", 0, 2))]
    assert {n for n in candidates if read.owns(n)} == {n for n in candidates if rewritten.owns(n)} == set(listed)
    assert Manifest.loads(rewritten.dumps()) == rewritten
    assert compacted(frozenset(names)).shards == {ShardRule("train", 4, index=False)}


@pytest.mark.parametrize(
    "text", ["", "not json", "[]", '{"format": "other/1", "files": [], "runs": []}', json.dumps({"format": 1})]
)
def test_what_is_not_a_manifest_of_ours_is_none(text):
    assert Manifest.loads(text) is None


def _rule(**changes) -> dict:
    return {**ShardRule("train", 16).to_json(), **changes}


@pytest.mark.parametrize(
    ("document", "named"),
    [
        ({"runs": ["../../x"]}, "lists the run '../../x'"),
        ({"runs": ["../x"]}, "lists the run '../x'"),
        ({"files": ["../x"]}, "lists the file '../x'"),
        ({"files": ["a/b"]}, "lists the file 'a/b'"),
        ({"files": [".hidden"]}, "lists the file '.hidden'"),
        ({"files": ["_tmp"]}, "lists the file '_tmp'"),
        ({"files": ["a\0b"]}, "lists the file 'a\\x00b'"),
        ({"files": [3]}, "lists the file 3"),
        ({"shards": [_rule(split="../../x")]}, "lists the shard rule {'split': '../../x'"),
        ({"shards": [_rule(split="a/b")]}, "lists the shard rule {'split': 'a/b'"),
        ({"shards": [_rule(split="my-split")]}, "lists the shard rule {'split': 'my-split'"),
        ({"shards": [_rule(count=MAX_SHARDS + 1)]}, f"'count': {MAX_SHARDS + 1}"),
        ({"shards": [_rule(count=0)]}, "'count': 0"),
        ({"shards": [_rule(count=True)]}, "'count': True"),
        ({"shards": [_rule(generation=-1)]}, "'generation': -1"),
        ({"shards": [_rule(compression="zstd")]}, "'compression': 'zstd'"),
        ({"shards": [_rule(compression="gzip", index=True)]}, "'compression': 'gzip', 'index': True"),
        ({"shards": [{**_rule(), "glob": "*"}]}, "'glob': '*'"),
        ({"shards": ["train-*"]}, "lists the shard rule 'train-*'"),
        ({"shards": {"train": 16}}, "holds shards that are not a list"),
        ({"files_extra": ["x"]}, "holds the key 'files_extra'"),
    ],
)
def test_a_manifest_naming_what_the_tool_never_writes_is_refused_in_one_line(document, named):
    text = json.dumps({"format": FORMAT, "runs": [RUN], "files": [], "shards": [], **document})
    with pytest.raises(UserError) as raised:
        Manifest.loads(text, "out/_manifest.json")
    message = str(raised.value)
    assert "\n" not in message and message.startswith("output: out/_manifest.json "), message
    assert named in message and "which this tool never writes" in message, message
    assert "delete out/_manifest.json by hand" in message


def test_a_format_1_manifest_naming_what_the_tool_never_writes_is_refused_too():
    text = json.dumps({"format": FORMAT_1, "runs": [RUN], "files": ["../x"]})
    with pytest.raises(UserError, match=re.escape("lists the file '../x'")):
        Manifest.loads(text, "out/_manifest.json")


def test_an_output_from_before_manifests_is_known_by_its_schema():
    schema = {"format": SCHEMA_FORMAT, "splits": {"train": {"shards": [{"file": SHARD}]}}}
    manifest = manifest_from_schema(json.dumps(schema))
    assert manifest.owns(SHARD) and manifest.owns("schema.json") and not manifest.runs
    assert not manifest.owns("data-00001-of-00002.tfrecord")  # (the schema lists one of the two)
    assert manifest_from_schema("{}") is None and manifest_from_schema("[1]") is None
    schema["splits"]["train"]["shards"] = [{"file": "../elsewhere"}]
    with pytest.raises(UserError, match=re.escape("lists the file '../elsewhere'")):
        manifest_from_schema(json.dumps(schema))


def test_an_output_whose_manifest_is_gone_is_known_by_its_schemas_rules(tmp_path):
    schema = write_output(tmp_path, make_columns(FEATURES, 5), [2, 3], split="train")
    text = (tmp_path / "schema.json").read_text()
    manifest = manifest_from_schema(text)
    files = [shard.file for shard in schema.splits["train"]]
    assert files == ["train-00000-of-00002.tfrecord", "train-00001-of-00002.tfrecord"]
    assert all(manifest.owns(name) and manifest.owns(index_name(name)) for name in files)
    assert manifest.owns("shards.npz") and not manifest.runs
    assert not manifest.owns("train-00002-of-00003.tfrecord") and not manifest.owns("valid-00000-of-00002.tfrecord")
    # A rule edited to name files outside the output is no schema of ours: nothing is owned through it.
    edited = json.loads(text)
    edited["splits"]["../x"] = edited["splits"].pop("train")
    assert manifest_from_schema(json.dumps(edited)) is None


def test_bookkeeping_and_its_temporaries_ask_no_overwrite():
    assert is_bookkeeping("_manifest.json") and is_bookkeeping("_inventory.json")
    assert is_bookkeeping(temporary_path("_inventory.json", new_temporary_token()))
    assert not is_bookkeeping("schema.json") and not is_bookkeeping("_inventory.json.old")
