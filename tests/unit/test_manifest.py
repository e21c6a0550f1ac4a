"""The manifest: which files of an output a build wrote (the only ones --overwrite may delete), and its checks."""

from __future__ import annotations

import json
import re

import pytest

from planning.run.manifest import Manifest, build_manifest, is_bookkeeping, manifest_from_schema
from planning.run.names import new_run_id, new_temporary_token, temporary_path
from schemas.errors import UserError
from schemas.schema import FORMAT_LISTED as SCHEMA_FORMAT

RUN = "0123456789ab"
SHARD = "data-00000-of-00002.tfrecord"


def test_a_build_owns_its_files_their_temporaries_and_its_working_directory_only():
    manifest = build_manifest(RUN, [SHARD])
    for owned in (
        SHARD,
        "schema.json",
        "stats.json",
        "parser.py",
        "generations.json",
        "_manifest.json",
        "_inventory.json",
    ):
        assert manifest.owns(owned), owned
    assert manifest.owns(temporary_path(SHARD, new_temporary_token()))
    assert manifest.owns(f"_tmp/{RUN}/buckets/00000-00003.bucket")
    not_ours = [
        "data-00001-of-00002.tfrecord",  # named like a shard, not listed
        f"{SHARD}.tmp-notatoken",
        f"{SHARD}.bak",
        f"_tmp/{new_run_id()}/x",  # another run's working directory
        f"_tmp/{RUN}",  # the directory itself is not a file of it
        f"other/{SHARD}",
    ]
    for name in not_ours:
        assert not manifest.owns(name), name


def test_a_manifest_reads_back_what_it_wrote_and_merges_of_runs_are_sets():
    manifest = build_manifest(RUN, [SHARD])
    assert Manifest.loads(manifest.dumps()) == manifest
    both = Manifest(manifest.files | {"train-00000-of-00001.tfrecord"}, manifest.runs | {"ba9876543210"})
    assert Manifest.loads(both.dumps()) == both


@pytest.mark.parametrize(
    "text", ["", "not json", "[]", '{"format": "other/1", "files": [], "runs": []}', json.dumps({"format": 1})]
)
def test_what_is_not_a_manifest_of_ours_is_none(text):
    assert Manifest.loads(text) is None


@pytest.mark.parametrize(
    ("runs", "files", "named"),
    [
        (["../../x"], [], "the run '../../x'"),
        ([RUN], ["../x"], "the file '../x'"),
        ([RUN], ["a/b"], "the file 'a/b'"),
        ([RUN], [".hidden"], "the file '.hidden'"),
        ([RUN], ["_tmp"], "the file '_tmp'"),
        ([RUN], ["a\0b"], "the file 'a\\x00b'"),
        ([RUN], [3], "the file 3"),
    ],
)
def test_a_manifest_naming_what_the_tool_never_writes_is_refused_in_one_line(runs, files, named):
    text = json.dumps({"format": "xarray-tfrecords-manifest/1", "runs": runs, "files": files})
    with pytest.raises(UserError) as raised:
        Manifest.loads(text, "out/_manifest.json")
    message = str(raised.value)
    assert "\n" not in message and message.startswith(f"output: out/_manifest.json lists {named}, "), message
    assert "delete out/_manifest.json by hand" in message


def test_an_output_from_before_manifests_is_known_by_its_schema():
    schema = {"format": SCHEMA_FORMAT, "splits": {"train": {"shards": [{"file": SHARD}]}}}
    manifest = manifest_from_schema(json.dumps(schema))
    assert manifest.owns(SHARD) and manifest.owns("schema.json") and not manifest.runs
    assert manifest_from_schema("{}") is None and manifest_from_schema("[1]") is None
    schema["splits"]["train"]["shards"] = [{"file": "../elsewhere"}]
    with pytest.raises(UserError, match=re.escape("lists the file '../elsewhere'")):
        manifest_from_schema(json.dumps(schema))


def test_bookkeeping_and_its_temporaries_ask_no_overwrite():
    assert is_bookkeeping("_manifest.json") and is_bookkeeping("_inventory.json")
    assert is_bookkeeping(temporary_path("_inventory.json", new_temporary_token()))
    assert not is_bookkeeping("schema.json") and not is_bookkeeping("_inventory.json.old")
