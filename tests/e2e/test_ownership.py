"""--overwrite deletes exactly what earlier builds recorded in the output's manifest, and nothing of anyone else's."""

from __future__ import annotations

import errno
import json
import re
from pathlib import Path

import pytest
import yaml

import pipelines.graph as graph
import transforms.files as file_helpers
import transforms.finalize as finalize
from pipelines.build import main
from pipelines.output import prepare_output, record_complete, remove_run_files
from planning.run.cancellation import allow_writes
from planning.run.manifest import FORMAT as MANIFEST_FORMAT
from planning.run.manifest import ShardRule, build_manifest
from schemas import load_schema
from schemas.errors import UserError


@pytest.fixture(autouse=True)
def _writes_allowed():
    """Tests here call prepare_output directly, as a build does after allow_writes (a failed build cancels writes)."""
    allow_writes()


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
    expected = {"schema.json", "stats.json", "parser.py", "generations.json", "shards.npz", "_inventory.json"}
    expected.add("_manifest.json")
    assert {p.name for p in output.iterdir()} == expected | {
        n for s in schema.splits["data"] for n in (s.file, s.index)
    }
    assert len(schema.splits["data"]) == 2


def test_an_output_written_before_manifests_is_replaced_by_what_its_schema_lists(small_archive, tmp_path):
    output = tmp_path / "out"
    assert _build(_config(small_archive, output), tmp_path) == 0
    (output / "_manifest.json").unlink()  # as an older version left it
    assert _build(_config(small_archive, output, num_shards=1), tmp_path, "--overwrite") == 0
    assert len(load_schema(str(output)).splits["data"]) == 1
    assert len(list(output.glob("data-*.tfrecord"))) == len(list(output.glob("data-*.tfindex"))) == 1


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


# A manifest is data from the disk: the paths in it are untrusted (issue 21, items 1 and 3).

RUN = "0123456789ab"


def _victim(tmp_path: Path) -> Path:
    """A folder of someone's work beside the output, that no build may touch."""
    victim = tmp_path / "thesis"
    (victim / RUN).mkdir(parents=True)
    (victim / "chapter1.tex").write_text("\\chapter{One}")
    (victim / RUN / "figure.pdf").write_bytes(b"%PDF")
    return victim


def _manifest(output: Path, runs: list, files: list | None = None) -> None:
    output.mkdir(parents=True, exist_ok=True)
    document = {"format": MANIFEST_FORMAT, "runs": runs, "files": files or ["schema.json", "_manifest.json"]}
    (output / "_manifest.json").write_text(json.dumps(document))


def test_a_plain_build_refuses_a_manifest_whose_run_is_a_path_and_deletes_nothing(small_archive, tmp_path, capsys):
    """The issue's case: `"runs": ["/home/me/thesis"]` deleted that folder, on a plain build, with exit 0."""
    victim = _victim(tmp_path)
    output = tmp_path / "out"
    _manifest(output, [str(victim)])
    before = _tree(victim)
    assert _build(_config(small_archive, output), tmp_path) == 2
    line = _one_error_line(capsys)
    assert f"lists the run {str(victim)!r}, which this tool never writes" in line, line
    assert f"delete {output / '_manifest.json'} by hand" in line, line
    assert _tree(victim) == before


@pytest.mark.parametrize(
    ("runs", "files", "named"),
    [
        (["../../thesis"], None, "run '../../thesis'"),
        (["{victim}"], None, "run '{victim}'"),
        (["0123456789AB"], None, "run '0123456789AB'"),  # not a run id as the tool draws them
        ([7], None, "run 7"),
        ([], ["../thesis/chapter1.tex"], "file '../thesis/chapter1.tex'"),
        ([], ["{victim}/chapter1.tex"], "file '{victim}/chapter1.tex'"),
        ([], [".."], "file '..'"),
        ([], ["_tmp"], "file '_tmp'"),
    ],
)
def test_a_manifest_naming_what_the_tool_never_makes_is_refused(tmp_path, runs, files, named):
    victim = _victim(tmp_path)
    output = tmp_path / "out"
    fill = {"victim": victim}
    _manifest(
        output,
        [r.format(**fill) if isinstance(r, str) else r for r in runs],
        [f.format(**fill) for f in files or []] or None,
    )
    before = _tree(victim)
    with pytest.raises(UserError, match=re.escape(f"lists the {named.format(**fill)}")):
        prepare_output(str(output), True, build_manifest("fedcba987654", [ShardRule("data", 1)]))
    assert _tree(victim) == before


@pytest.mark.parametrize("link", ["_tmp", f"_tmp/{RUN}"])
def test_a_linked_working_directory_is_never_followed(tmp_path, link):
    """`_tmp` (or a run's directory) as a link to someone's folder: a plain run id used to delete inside it."""
    victim = _victim(tmp_path)
    before = _tree(victim)
    output = tmp_path / "out"
    _manifest(output, [RUN])
    (output / link).parent.mkdir(parents=True, exist_ok=True)
    (output / link).symlink_to(victim if link == "_tmp" else victim / RUN, target_is_directory=True)
    manifest = build_manifest("fedcba987654", [ShardRule("data", 1)])
    for overwrite in (False, True):
        with pytest.raises(UserError, match=f"did not write \\({re.escape(link)}\\)"):
            prepare_output(str(output), overwrite, manifest)
    # A failed run's clean-up does not follow it either (a link in the run's own place goes, never its target).
    remove_run_files(str(output), build_manifest(RUN, []), None)
    assert _tree(victim) == before


def test_a_folder_without_a_build_record_is_refused_from_its_own_listing(tmp_path, monkeypatch):
    """--output ~ (or /): refused from the folder's listing, not after walking every file under it (11 s for a home
    folder of 300,000 files; minutes on a network one). An empty subfolder, as before, is no reason to refuse."""
    from pipelines import output as module

    home = tmp_path / "home"
    (home / "projects" / "thesis").mkdir(parents=True)
    (home / "projects" / "thesis" / "chapter1.tex").write_text("\\chapter{One}")
    (home / "notes.txt").write_text("mine")
    (home / "empty").mkdir()

    def no_walk(*args, **kwargs):
        raise AssertionError("walked the folder")

    monkeypatch.setattr(module, "_walk_local", no_walk)
    manifest = build_manifest("fedcba987654", [ShardRule("data", 1)])
    for overwrite in (False, True):
        with pytest.raises(UserError, match=r"did not write \(notes.txt, projects/\)"):
            prepare_output(str(home), overwrite, manifest)
    assert (home / "projects" / "thesis" / "chapter1.tex").read_text() == "\\chapter{One}"
    monkeypatch.undo()
    only_empty = tmp_path / "fresh"
    (only_empty / "empty").mkdir(parents=True)
    prepare_output(str(only_empty), False, manifest)  # (nothing in it is anyone's)
    assert (only_empty / "_manifest.json").is_file()


def test_a_link_named_like_a_shard_is_not_ours(tmp_path):
    victim = _victim(tmp_path)
    output = tmp_path / "out"
    _manifest(output, [], ["data-00000-of-00001.tfrecord", "schema.json", "_manifest.json"])
    (output / "data-00000-of-00001.tfrecord").symlink_to(victim / "chapter1.tex")
    with pytest.raises(UserError, match=r"did not write \(data-00000-of-00001.tfrecord\)"):
        prepare_output(str(output), True, build_manifest("fedcba987654", [ShardRule("data", 1)]))
    assert (victim / "chapter1.tex").read_text() == "\\chapter{One}"


def test_what_a_crash_left_while_writing_bookkeeping_needs_no_overwrite(tmp_path):
    """A full disk (or a kill) while _manifest.json was written left `_manifest.json.tmp-*`: every rerun was refused."""
    output = tmp_path / "out"
    output.mkdir()
    for name in ("_manifest.json.tmp-0badc0de", "_inventory.json.tmp-1234abcd", "_inventory.json.tmp"):
        (output / name).write_text('{"format": "xarray-tfrecords-inventory/3", "fi')  # cut short
    manifest = build_manifest("fedcba987654", [ShardRule("data", 1)])
    prepare_output(str(output), False, manifest)
    assert sorted(p.name for p in output.iterdir()) == ["_manifest.json"]
    # Only the names the tool makes: another temporary-looking name is someone else's.
    (output / "_manifest.json.tmp-mine").write_text("x")
    with pytest.raises(UserError, match=r"did not write \(_manifest.json.tmp-mine\)"):
        prepare_output(str(output), True, manifest)


def test_a_full_disk_while_the_manifest_is_written_leaves_nothing_that_blocks_a_rerun(
    small_archive, tmp_path, capsys, monkeypatch
):
    """The disk fills up as the manifest's last bytes are flushed, at close."""
    output = tmp_path / "out"
    real_create = file_helpers.FileSystems.create

    def create(path, *args, **kwargs):
        stream = real_create(path, *args, **kwargs)
        if "_manifest.json" in path:
            real_close = stream.close

            def close():
                real_close()
                raise OSError(errno.ENOSPC, "No space left on device", path)

            stream.close = close
        return stream

    monkeypatch.setattr(file_helpers.FileSystems, "create", create)
    assert _build(_config(small_archive, output), tmp_path) == 1
    assert "no space left on device" in _one_error_line(capsys)
    assert not [p.name for p in output.rglob("*") if ".tmp-" in p.name]
    monkeypatch.undo()
    assert _build(_config(small_archive, output), tmp_path) == 0


def test_a_build_whose_output_another_build_took_over_reports_no_success(small_archive, tmp_path, capsys, monkeypatch):
    """Builds whose locks do not meet (gs://, other users, other $TMPDIR): the one displaced must not say it wrote."""
    output = tmp_path / "out"
    other = json.dumps({"format": MANIFEST_FORMAT, "runs": ["fedcba987654"], "files": ["schema.json"]})
    real_save = graph.save_probes

    def then_another_build_clears_the_output(*args, **kwargs):
        real_save(*args, **kwargs)
        (output / "_manifest.json").write_text(other)  # what the other build's prepare_output writes

    monkeypatch.setattr(graph, "save_probes", then_another_build_clears_the_output)
    assert _build(_config(small_archive, output), tmp_path) == 2
    line = _one_error_line(capsys)
    assert line.startswith(f"error: output: another build replaced {output} while this one ran"), line
    assert not (output / "schema.json").exists()
    # What the other build owns now is left to it.
    assert (output / "_manifest.json").read_text() == other


def test_record_complete_refuses_an_output_another_build_took_over(tmp_path):
    output = tmp_path / "out"
    mine = build_manifest(RUN, [ShardRule("data", 1)])
    prepare_output(str(output), False, mine)
    record_complete(str(output), mine)  # still ours: recorded complete
    prepare_output(str(output), False, build_manifest("fedcba987654", []))
    with pytest.raises(UserError, match="another build replaced"):
        record_complete(str(output), mine)
    assert json.loads((output / "_manifest.json").read_text())["runs"] == ["fedcba987654"]
