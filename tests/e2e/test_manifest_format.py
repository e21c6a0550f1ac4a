"""_manifest.json by rules (format 2): written by builds and appends, read from outputs of format 1, refused when
edited into what the tool never writes; --overwrite deletes what its rules own and nothing named like it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from pipelines.build import main
from planning.run.manifest import FORMAT, FORMAT_1, Manifest, ShardRule
from schemas import load_schema

from conftest import BUCKET

METADATA = {"schema.json", "stats.json", "parser.py", "generations.json", "grid.npz", "shards.npz", "_inventory.json"}


def _config(archive: Path, output: str, num_shards: int, paths: list[str] | None = None) -> dict:
    return {
        "input": {"paths": paths or str(archive / "*.nc"), "concat_dim": "time"},
        "variables": ["t"],
        "sample": {"window": {"lat": 10, "lon": 12}, "keep": ["level"]},
        "output": {"path": output, "num_shards": num_shards},
    }


def _build(config: dict, directory: Path, *flags: str) -> int:
    path = directory / f"config-{len(list(directory.glob('config-*')))}.yaml"
    path.write_text(yaml.safe_dump(config))
    return main(["--config", str(path), "--quiet", *flags])


def _tree(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def _error(capsys) -> str:
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    return lines[0]


def _as_format_1(output: Path) -> None:
    """The manifest as an earlier version wrote it: every file of the output by name."""
    names = sorted(p.name for p in output.iterdir() if p.is_file())
    document = {"format": FORMAT_1, "runs": [], "files": names}
    (output / "_manifest.json").write_text(json.dumps(document, indent=1))


def test_a_build_records_rules_and_overwrite_clears_a_format_1_output_but_no_lookalike(small_archive, tmp_path, capsys):
    output = tmp_path / "out"
    assert _build(_config(small_archive, str(output), 3), tmp_path) == 0
    document = json.loads((output / "_manifest.json").read_text())
    assert document["format"] == FORMAT and not document["runs"]
    assert document["shards"] == [ShardRule("data", 3).to_json()]
    assert set(document["files"]) == METADATA | {"_manifest.json"}  # a fixed few names, whatever the shard count
    _as_format_1(output)
    # Named like a shard of ours, but no rule (and no list) makes it: someone else's, so --overwrite refuses.
    lookalike = output / "data-00000-of-00007.tfrecord"
    lookalike.write_bytes(b"another run's shard")
    before = _tree(output)
    assert _build(_config(small_archive, str(output), 2), tmp_path, "--overwrite") == 2
    assert "did not write (data-00000-of-00007.tfrecord)" in _error(capsys) and _tree(output) == before
    lookalike.unlink()
    assert _build(_config(small_archive, str(output), 2), tmp_path, "--overwrite") == 0
    shards = load_schema(str(output)).splits["data"]
    assert {p.name for p in output.iterdir()} == METADATA - {"grid.npz"} | {"_manifest.json"} | {
        name for s in shards for name in (s.file, s.index)
    }
    assert Manifest.loads((output / "_manifest.json").read_text()).shards == {ShardRule("data", 2)}


def test_an_append_to_a_format_1_output_rewrites_its_manifest_as_rules(small_archive, tmp_path):
    output = tmp_path / "out"
    files = sorted(str(p) for p in small_archive.glob("*.nc"))
    config = _config(small_archive, str(output), 2, files[:2])
    config["sample"] = {"window": {"time": {"size": 2}}, "keep": ["level", "lat", "lon"]}
    assert _build(config, tmp_path) == 0
    _as_format_1(output)
    assert _build({**config, "input": {**config["input"], "paths": files}}, tmp_path, "--append") == 0
    document = json.loads((output / "_manifest.json").read_text())
    assert document["format"] == FORMAT and set(document["files"]) <= METADATA | {"_manifest.json"}
    manifest = Manifest.loads(json.dumps(document))
    assert {(rule.split, rule.generation) for rule in manifest.shards} == {("data", 0), ("data", 1)}
    shards = load_schema(str(output)).splits["data"]
    assert all(manifest.owns(name) for s in shards for name in (s.file, s.index))


@pytest.mark.parametrize(
    ("rule", "shown"),
    [
        ({"split": "../thesis", "count": 1, "generation": 0, "compression": None, "index": True}, "'../thesis'"),
        ({"split": "data", "count": 10**12, "generation": 0, "compression": None, "index": True}, "1000000000000"),
        ({"split": "data", "count": 1, "generation": 0, "compression": None, "index": True, "prefix": "/"}, "prefix"),
    ],
)
def test_a_build_refuses_an_edited_rule_in_one_line_and_deletes_nothing(small_archive, tmp_path, capsys, rule, shown):
    output = tmp_path / "out"
    assert _build(_config(small_archive, str(output), 1), tmp_path) == 0
    document = json.loads((output / "_manifest.json").read_text())
    (output / "_manifest.json").write_text(json.dumps({**document, "shards": [rule]}))
    before = _tree(output)
    assert _build(_config(small_archive, str(output), 1), tmp_path, "--overwrite") == 2
    line = _error(capsys)
    assert f"output: {output / '_manifest.json'} lists the shard rule" in line and shown in line, line
    assert f"delete {output / '_manifest.json'} by hand" in line and _tree(output) == before


def test_a_run_id_that_is_a_path_is_refused(small_archive, tmp_path, capsys):
    output = tmp_path / "out"
    assert _build(_config(small_archive, str(output), 1), tmp_path) == 0
    document = json.loads((output / "_manifest.json").read_text())
    (output / "_manifest.json").write_text(json.dumps({**document, "runs": ["../x"]}))
    assert _build(_config(small_archive, str(output), 1), tmp_path, "--overwrite") == 2
    assert "lists the run '../x', which this tool never writes" in _error(capsys)


def test_on_gs_overwrite_deletes_the_rules_shards_in_batches_and_keeps_a_lookalike(
    gcs, small_archive, tmp_path, capsys
):
    output = f"gs://{BUCKET}/manifest/out"
    assert _build(_config(small_archive, output, 3), tmp_path) == 0
    document = json.loads(gcs.cat(f"{output}/_manifest.json"))
    assert document["format"] == FORMAT and document["shards"] == [ShardRule("data", 3).to_json()]
    lookalike = f"{output}/data-00001-of-00004.tfrecord"
    gcs.pipe(lookalike, b"not ours")
    assert _build(_config(small_archive, output, 2), tmp_path, "--overwrite") == 2
    assert "data-00001-of-00004.tfrecord" in _error(capsys)
    gcs.invalidate_cache()
    assert gcs.cat(lookalike) == b"not ours" and gcs.exists(f"{output}/data-00002-of-00003.tfrecord")
    gcs.rm(lookalike)
    assert _build(_config(small_archive, output, 2), tmp_path, "--overwrite") == 0
    gcs.invalidate_cache()
    names = {path.rsplit("/", 1)[-1] for path in gcs.find(output.removeprefix("gs://"))}
    shards = {f"data-0000{i}-of-00002.tfrecord{suffix}" for i in range(2) for suffix in ("", ".tfindex")}
    assert names == METADATA - {"grid.npz"} | {"_manifest.json"} | shards
