"""--overwrite deletes exactly what earlier builds recorded in the output's manifest, and nothing of anyone else's."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest
import yaml

import transforms.finalize as finalize
from pipelines.build import main
from schemas import load_schema


def _config(archive: Path, output: Path, num_shards: int = 2) -> dict:
    return {
        "input": {"paths": str(archive / "*.nc")},
        "variables": ["t"],
        "sample": {"window": {"lat": 10, "lon": 12}, "keep": ["level"]},
        "output": {"path": str(output), "num_shards": num_shards},
    }


def _build(config: dict, tmp_path: Path, *flags: str) -> int:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return main(["--config", str(path), "--quiet", *flags])


def _tree(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def _one_error_line(capsys) -> str:
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    return lines[0]


def test_a_directory_of_the_users_own_files_is_never_emptied(small_archive, tmp_path, capsys):
    """The files of the fault campaign: names like ours, none of them ours."""
    output = tmp_path / "d"
    (output / "_tmp").mkdir(parents=True)
    (output / "parser.py").write_text("print('my parser')\n")
    (output / "schema.json").write_text(json.dumps({"mine": 1}))
    (output / "stats.json").write_text("{}")
    (output / "_tmp" / "thesis_draft.tex").write_text("\\chapter{One}")
    (output / "train-00000-of-00001.tfrecord.bak").write_bytes(b"backup")
    (output / "train-00000-of-00010.tfrecord").write_bytes(b"another tool's shard")
    before = _tree(output)
    for flags in ((), ("--overwrite",)):
        assert _build(_config(small_archive, output), tmp_path, *flags) == 2
        line = _one_error_line(capsys)
        assert "did not write" in line and "_tmp/thesis_draft.tex" in line and "and 3 more" in line, line
        assert _tree(output) == before  # not one file touched, none added


def test_overwrite_replaces_an_earlier_output_entirely_and_refuses_a_foreign_file_added_to_it(
    small_archive, tmp_path, capsys
):
    output = tmp_path / "out"
    assert _build(_config(small_archive, output, num_shards=3), tmp_path) == 0
    assert len(list(output.glob("data-*.tfrecord"))) == 3
    notes = output / "notes.txt"
    notes.write_text("mine")
    before = _tree(output)
    assert _build(_config(small_archive, output, num_shards=2), tmp_path, "--overwrite") == 2
    assert "notes.txt" in _one_error_line(capsys) and _tree(output) == before
    notes.unlink()
    assert _build(_config(small_archive, output, num_shards=2), tmp_path, "--overwrite") == 0
    # The three old shards are gone (their names are not the new ones): only the new output is left.
    schema = load_schema(str(output))
    expected = {"schema.json", "stats.json", "parser.py", "_inventory.json", "_manifest.json"}
    assert {p.name for p in output.iterdir()} == expected | {s.file for s in schema.splits["data"]}
    assert len(schema.splits["data"]) == 2


def test_an_output_written_before_manifests_is_replaced_by_what_its_schema_lists(small_archive, tmp_path):
    output = tmp_path / "out"
    assert _build(_config(small_archive, output), tmp_path) == 0
    (output / "_manifest.json").unlink()  # as an older version left it
    assert _build(_config(small_archive, output, num_shards=1), tmp_path, "--overwrite") == 0
    assert len(load_schema(str(output)).splits["data"]) == 1
    assert len(list(output.glob("data-*"))) == 1


def test_a_run_that_fails_while_finishing_leaves_no_shard_and_the_rerun_needs_no_overwrite(
    small_archive, tmp_path, capsys, monkeypatch
):
    """The disk fills up in the final step: the shards are committed, schema.json cannot be written."""
    output = tmp_path / "out"
    real_write = finalize.write_atomically

    def full_disk(path, chunks, *args, **kwargs):
        if path.endswith("schema.json"):
            raise OSError(errno.ENOSPC, "No space left on device", path)
        return real_write(path, chunks, *args, **kwargs)

    monkeypatch.setattr(finalize, "write_atomically", full_disk)
    assert _build(_config(small_archive, output), tmp_path) == 1
    line = _one_error_line(capsys)
    fix = "free some space, or write the output elsewhere (--output)"
    assert line == f"error: {output / 'schema.json'}: no space left on device; {fix}"
    assert sorted(p.name for p in output.rglob("*")) == ["_inventory.json", "_manifest.json"]
    monkeypatch.undo()
    assert _build(_config(small_archive, output), tmp_path) == 0
    assert load_schema(str(output)).num_records() > 0


@pytest.mark.parametrize("leftover", ["_tmp/{run}/buckets/shard-00000/unit-000000.bucket", "{shard}.tmp-{run}"])
def test_what_a_killed_run_left_is_cleared_by_overwrite(small_archive, tmp_path, capsys, leftover):
    output = tmp_path / "out"
    assert _build(_config(small_archive, output), tmp_path) == 0
    # A later run, killed outright: it had recorded itself in the manifest, cleared the old
    # output's schema.json, and left a temporary behind.
    manifest = json.loads((output / "_manifest.json").read_text())
    assert manifest["runs"] == []  # a complete output lists no run
    run = "0123456789ab"
    (output / "_manifest.json").write_text(json.dumps({**manifest, "runs": [run]}))
    (output / "schema.json").unlink()
    name = leftover.format(run=run, shard=sorted(p.name for p in output.glob("data-*"))[0])
    (output / name).parent.mkdir(parents=True, exist_ok=True)
    (output / name).write_bytes(b"half")
    assert _build(_config(small_archive, output), tmp_path) == 2
    assert "pass --overwrite" in _one_error_line(capsys)
    assert _build(_config(small_archive, output), tmp_path, "--overwrite") == 0
    assert not (output / name).exists() and not (output / "_tmp").exists()
    # A working directory of a run the manifest does not list is not ours.
    stranger = output / "_tmp" / "fedcba987654" / "x.bucket"
    stranger.parent.mkdir(parents=True)
    stranger.write_bytes(b"?")
    assert _build(_config(small_archive, output), tmp_path, "--overwrite") == 2
    assert "_tmp/fedcba987654/x.bucket" in _one_error_line(capsys) and stranger.exists()
