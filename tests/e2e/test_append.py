"""--append: a new generation holds exactly the samples a full rebuild adds; old shards untouched; stats merged."""

from __future__ import annotations

import errno
import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml

from pipelines import graph
from pipelines.build import main
from pipelines.inspect import main as inspect_main
from planning.run.manifest import Manifest
from schemas import load_schema
from schemas.random_access import open_source
from schemas.reader import Reader
from schemas.schema import FORMAT, FORMAT_LISTED, SHARDS_FILE
from schemas.stream import shuffled_stream
from transforms import finalize

from helpers import import_generated_parser, parse_with_generated_parser

SPLITS = ("train", "val")
#: Held by generation 0: the first three of five files (a time window of 3 makes samples straddle them).
HELD_FILES = 3


def _config(archive: Path, output: Path, **changes) -> dict:
    config = {
        "input": {"paths": str(archive / "*.nc"), "concat_dim": "time"},
        "variables": ["t", "u"],
        "sample": {"window": {"time": {"size": 3}}, "keep": ["level", "lat", "lon"]},
        # val ends inside the new files: the new steps after it make samples outside every split.
        "splits": {"train": {"time": [None, "2020-01-02"]}, "val": {"time": ["2020-01-03", "2020-01-04T12"]}},
        "stats": {"per": ["level"]},
        "output": {"path": str(output), "num_shards": 2},
    }
    for key, value in changes.items():
        section, name = key.split("__")
        config[section] = {**config.get(section, {}), name: value}
    return config


def _build(config: dict, directory: Path, *flags: str) -> int:
    path = directory / f"config-{len(list(directory.glob('config-*')))}.yaml"
    path.write_text(yaml.safe_dump(config))
    return main(["--config", str(path), "--quiet", *flags])


def _hashes(output: Path, names=None) -> dict[str, str]:
    names = names if names is not None else [p.name for p in output.iterdir() if p.is_file()]
    return {name: hashlib.sha256((output / name).read_bytes()).hexdigest() for name in names}


def _shard_files(output: Path) -> list[str]:
    schema = load_schema(str(output))
    return [name for shards in schema.splits.values() for s in shards for name in (s.file, s.index)]


@pytest.fixture(scope="module")
def archive(tmp_path_factory) -> Path:
    from pipelines.demo import ArchiveShape, write_archive

    directory = tmp_path_factory.mktemp("growing")
    write_archive(directory, ArchiveShape(num_files=5, steps_per_file=4, levels=2, lat=8, lon=10), seed=4)
    return directory


@pytest.fixture(scope="module")
def appended(archive, tmp_path_factory) -> dict:
    """Generation 0 from the first files, then --append of the rest; and a full rebuild of all of them."""
    work = tmp_path_factory.mktemp("appended")
    files = sorted(str(p) for p in archive.glob("*.nc"))
    output, full = work / "out", work / "full"
    assert _build(_config(archive, output, input__paths=files[:HELD_FILES]), work) == 0
    before = _hashes(output, _shard_files(output))
    stats0 = json.loads((output / "stats.json").read_text())
    assert _build(_config(archive, output), work, "--append") == 0
    assert _build(_config(archive, full), work) == 0
    return {"output": output, "full": full, "before": before, "stats0": stats0, "work": work}


def _by_sample(columns: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    order = np.argsort(columns["index/time"], kind="stable")
    return {name: values[order] for name, values in columns.items()}


@pytest.mark.parametrize("split", SPLITS)
def test_the_generations_hold_the_samples_of_a_full_rebuild(appended, split):
    """Read with TensorFlow through each output's own parser: the same samples, keys and values, as multisets."""
    union = _by_sample(parse_with_generated_parser(appended["output"], split))
    rebuilt = _by_sample(parse_with_generated_parser(appended["full"], split))
    assert union.keys() == rebuilt.keys()
    assert len(np.unique(union["index/time"])) == len(union["index/time"])  # no sample cut twice
    for name in union:
        np.testing.assert_array_equal(union[name], rebuilt[name], err_msg=name)


def test_the_new_generation_holds_the_straddling_samples_and_drops_those_outside_the_splits(appended):
    schema = load_schema(str(appended["output"]))
    generations = {s.generation for shards in schema.splits.values() for s in shards}
    assert generations == {0, 1}
    assert all(s.generation == 0 for s in schema.splits["train"])  # train ended inside the held steps
    new = [s for s in schema.splits["val"] if s.generation == 1]
    assert new and all("-g001-" in s.file for s in new)
    # The windows reaching from the held steps into the new ones (and only those) were cut now.
    index = open_source(str(appended["output"]), "val")
    assert len(index) == schema.num_examples("val")
    rebuilt = load_schema(str(appended["full"]))
    assert schema.counts == rebuilt.counts and schema.sample == rebuilt.sample
    record = json.loads((appended["output"] / "generations.json").read_text())["generations"][1]
    assert record["counts"]["samples_outside_splits"] > 0  # new steps after val's range: dropped, counted


def test_old_shards_and_their_indexes_are_byte_identical(appended):
    assert _hashes(appended["output"], list(appended["before"])) == appended["before"]
    manifest = Manifest.loads((appended["output"] / "_manifest.json").read_text())
    # Named by a rule per split of each generation, not file by file: every shard of both generations is owned.
    assert all(manifest.owns(name) for name in _shard_files(appended["output"])) and not manifest.runs
    assert {(rule.split, rule.generation) for rule in manifest.shards} == {("train", 0), ("val", 0), ("val", 1)}
    assert inspect_main([str(appended["output"]), "--verify"]) == 0


def _assert_close(got, want, path=""):
    if isinstance(want, dict):
        assert got.keys() == want.keys(), path
        for key in want:
            _assert_close(got[key], want[key], f"{path}.{key}")
    elif isinstance(want, list):
        assert len(got) == len(want), path
        for i, (a, b) in enumerate(zip(got, want)):
            _assert_close(a, b, f"{path}[{i}]")
    elif isinstance(want, float) and not isinstance(got, int):
        assert abs(got - want) <= 1e-12 * max(abs(got), abs(want)), (path, got, want)
    else:
        assert got == want, path  # counts exactly


def test_statistics_equal_a_full_rebuild(appended):
    union = json.loads((appended["output"] / "stats.json").read_text())
    rebuilt = json.loads((appended["full"] / "stats.json").read_text())
    own = union.pop("generations")
    rebuilt.pop("generations")
    _assert_close(union, rebuilt)
    # Each generation's own statistics are kept, and generation 0's normalisation as it was.
    assert [g["generation"] for g in own] == [0, 1]
    assert own[0]["normalization"] == appended["stats0"]["normalization"]
    assert own[0]["splits"] == appended["stats0"]["splits"]
    assert own[1]["splits"]["val"]["samples"] == union["splits"]["val"]["samples"] - own[0]["splits"]["val"]["samples"]
    # The regenerated parser normalises with the merged statistics.
    assert json.dumps(union["normalization"]["t"]["mean"])[:20] in (appended["output"] / "parser.py").read_text()


def test_an_append_to_an_output_over_the_field_keeps_it_and_equals_a_rebuild(archive, tmp_path, capsys):
    """stats.over: field: the new generation counts its new steps of each split once; the merge is the field's."""
    import xarray as xr

    files = sorted(str(p) for p in archive.glob("era5_*.nc"))
    output, full = tmp_path / "out", tmp_path / "full"
    assert _build(_config(archive, output, input__paths=files[:HELD_FILES], stats__over="field"), tmp_path) == 0
    # The output's config holds: appending over the samples is refused, and changes nothing.
    before = _hashes(output)
    assert "stats.over: 'samples' differs from the 'field'" in _refused(_config(archive, output), tmp_path, capsys)
    assert _hashes(output) == before
    assert _build(_config(archive, output, stats__over="field"), tmp_path, "--append") == 0
    assert _build(_config(archive, full, stats__over="field"), tmp_path) == 0
    union, rebuilt = (json.loads((path / "stats.json").read_text()) for path in (output, full))
    assert union["over"] == rebuilt["over"] == "field" and len(union.pop("generations")) == 2
    rebuilt.pop("generations")
    _assert_close(union, rebuilt)
    with xr.open_mfdataset(files) as data:  # val: every step of its range once, each level apart
        val = data["t"].sel(time=slice("2020-01-03", "2020-01-04T12")).transpose("time", "level", ...).values
    values = np.moveaxis(val.astype(np.float32).astype(np.float64), 1, 0).reshape(val.shape[1], -1)
    stored = union["splits"]["val"]["variables"]["t"]
    assert stored["count"] == [values.shape[1]] * len(values)
    np.testing.assert_allclose(stored["mean"], values.mean(axis=1), rtol=1e-9, atol=0)
    np.testing.assert_allclose(stored["variance"], values.var(axis=1), rtol=1e-9, atol=0)


def test_readers_see_one_dataset(appended):
    from schemas import load_dataset

    output = str(appended["output"])
    total = load_schema(output).num_examples("val")
    assert sum(int(b["t"].shape[0]) for b in load_dataset(output, "val", batch_size=2)) == total
    stream = iter(shuffled_stream(output, "val", seed=3))
    seen = [int(next(stream)["index/time"]) for _ in range(total)]  # one epoch: every sample of every generation
    assert sorted(seen) == sorted(Reader(output, "val").read_all()["index/time"].tolist())


def test_nothing_to_append_changes_nothing(appended, archive, capsys):
    output = appended["output"]
    before = _hashes(output)
    capsys.readouterr()
    assert _build(_config(archive, output), appended["work"], "--append") == 0
    assert "nothing to append" in capsys.readouterr().out
    assert _hashes(output) == before


def _refused(config: dict, directory: Path, capsys) -> str:
    capsys.readouterr()
    assert _build(config, directory, "--append") == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    return lines[0]


@pytest.fixture
def generation0(archive, tmp_path) -> tuple[Path, list[str]]:
    """A fresh generation 0 of the first files (for tests that break an append)."""
    files = sorted(str(p) for p in archive.glob("*.nc"))
    output = tmp_path / "out"
    assert _build(_config(archive, output, input__paths=files[:HELD_FILES]), tmp_path) == 0
    return output, files


def test_hostile_appends_are_refused_in_one_line_and_change_nothing(generation0, archive, tmp_path, capsys):
    output, files = generation0
    before = _hashes(output)
    line = _refused(_config(archive, output, shuffle__seed=7), tmp_path, capsys)
    assert "shuffle.seed" in line
    line = _refused(_config(archive, output, output__num_shards=3), tmp_path, capsys)
    assert "output.num_shards" in line
    # The files the output holds must be named with the new ones.
    line = _refused(_config(archive, output, input__paths=files[HELD_FILES:]), tmp_path, capsys)
    assert "every file the output was built from" in line
    # A held file changed (here: replaced by a copy with other bytes and size).
    moved = tmp_path / "moved"
    moved.mkdir()
    for path in files:
        shutil.copy(path, moved)
    with open(moved / Path(files[0]).name, "ab") as grown:
        grown.write(b"\0" * 64)
    line = _refused(_config(archive, output, input__paths=str(moved / "*.nc")), tmp_path, capsys)
    assert "not those the output was built from" in line
    # A new file overlapping the steps the output holds.
    (moved / Path(files[0]).name).unlink()
    shutil.copy(files[0], moved)
    shutil.copy(files[1], moved / "zz_again.nc")
    line = _refused(_config(archive, output, input__paths=str(moved / "*.nc")), tmp_path, capsys)
    assert "zz_again.nc" in line and "overlaps" in line
    assert _hashes(output) == before
    assert _build(_config(archive, output), tmp_path, "--overwrite", "--append") == 2


def test_earlier_contiguous_steps_are_a_backfill_keeping_every_index_written(archive, tmp_path):
    """Steps before the output's first, contiguous with it: a new generation whose indices count back from 0.

    Generation 0 holds the second and third files; the first append adds the first file (before them)
    and the fourth (after), the second the fifth. The union is the full rebuild with index/time shifted
    by the steps added before (the records already written keep theirs); reassembling its records
    gives the source back.
    """
    files = sorted(str(p) for p in archive.glob("*.nc"))
    output, full = tmp_path / "out", tmp_path / "full"
    strided = {"window": {"time": {"size": 3, "stride": 2}}, "keep": ["level", "lat", "lon"]}

    def config(path, paths=None):
        return {**_config(archive, path, **({"input__paths": paths} if paths else {})), "sample": strided}

    assert _build(config(output, files[1:3]), tmp_path) == 0
    before = _hashes(output, _shard_files(output))
    assert _build(config(output, files[:4]), tmp_path, "--append") == 0
    assert _build(config(output), tmp_path, "--append") == 0
    assert _build(config(full), tmp_path) == 0
    assert _hashes(output, list(before)) == before
    schema, rebuilt = load_schema(str(output)), load_schema(str(full))
    origin = 4  # the steps of the file added before generation 0's first
    concat = next(a for a in schema.sample["axes"] if a["dim"] == "time")
    assert concat["index_origin"] == origin and schema.counts == rebuilt.counts
    for split in SPLITS:
        union = _by_sample(parse_with_generated_parser(output, split))
        want = _by_sample(parse_with_generated_parser(full, split))
        assert union.keys() == want.keys() and len(union["index/time"]) == len(want["index/time"])
        assert (union["index/time"] < 0).any() == (split == "train")  # the backfilled samples are train's
        np.testing.assert_array_equal(union.pop("index/time") + origin, want.pop("index/time"))
        for name in union:
            np.testing.assert_array_equal(union[name], want[name], err_msg=f"{split} {name}")
        assert [r - origin for r in rebuilt.sample["splits"][split]["index_range"]] == (
            schema.sample["splits"][split]["index_range"]
        )
    _assert_close(
        {k: v for k, v in json.loads((output / "stats.json").read_text()).items() if k != "generations"},
        {k: v for k, v in json.loads((full / "stats.json").read_text()).items() if k != "generations"},
    )
    assert inspect_main([str(output), "--verify"]) == 0
    from schemas import reassemble

    back = reassemble(str(output), Reader(str(output), "train"), split="train")
    import xarray as xr

    with xr.open_mfdataset(files, combine="by_coords") as source:
        want = source["t"].sel(time=back["time"]).load()
    covered = back["coverage"].values > 0
    assert covered[:origin].all()  # the backfilled steps are placed before the held ones
    np.testing.assert_array_equal(back["t"].values[covered], want.values.astype(np.float32)[covered])
    # The reassembly pipeline (samples bucketed by output chunk) places them the same way.
    from pipelines.reassemble import main as reassemble_main

    assert reassemble_main([str(output), "--split", "train", "--to", str(tmp_path / "back.zarr"), "--quiet"]) == 0
    with xr.open_zarr(tmp_path / "back.zarr") as written:
        np.testing.assert_array_equal(written["t"].values, back["t"].values)
        np.testing.assert_array_equal(written["coverage"].values, back["coverage"].values)


def test_earlier_steps_with_a_gap_or_off_the_stride_are_refused(archive, tmp_path, capsys):
    files = sorted(str(p) for p in archive.glob("*.nc"))
    output = tmp_path / "out"

    def config(paths, **changes):
        return {**_config(archive, output, input__paths=paths, **changes), "splits": {}}

    assert _build(config(files[2:]), tmp_path) == 0
    before = _hashes(output)
    line = _refused(config([files[0], *files[2:]]), tmp_path, capsys)
    assert "not one step before it" in line and "add the missing files" in line
    assert _hashes(output) == before
    strided = tmp_path / "strided"
    window = {"window": {"time": {"size": 3, "stride": 3}}, "keep": ["level", "lat", "lon"]}
    assert _build({**config(files[2:]), "sample": window, "output": {"path": str(strided)}}, tmp_path) == 0
    line = _refused({**config(files[1:]), "sample": window, "output": {"path": str(strided)}}, tmp_path, capsys)
    assert "not a multiple of sample.stride 3" in line


def test_an_output_of_an_earlier_version_without_the_keys_added_since_appends(generation0, archive, tmp_path):
    """schema.json records the resolved config; an earlier version's lacks today's keys (stats.tendency, ...)."""
    output, _ = generation0
    document = json.loads((output / "schema.json").read_text())
    for section, key in (("stats", "tendency"), ("stats", "over"), ("sample", "time_features"), ("sample", "roles")):
        del document["config"][section][key]
    del document["sources"]["generations_sha256"]  # (recorded since 2026-12-03)
    (output / "schema.json").write_text(json.dumps(document, indent=1))
    assert _build(_config(archive, output), tmp_path, "--append") == 0
    assert load_schema(str(output)).sources["generations"] == 2


def test_statistics_edited_in_generations_json_are_refused_and_change_nothing(generation0, archive, tmp_path, capsys):
    """An append merges its statistics with those generations.json holds: an edit that keeps the file well-formed
    (a count 500x, a mean above the maximum) would make stats.json and the parser's normalisation wrong."""
    output, _ = generation0
    path = output / "generations.json"
    document = json.loads(path.read_text())
    split = next(iter(document["generations"][0]["splits"].values()))
    moments = next(iter(split["moments"].values()))
    moments["count"] = np.asarray(moments["count"]) * 500
    moments["count"], moments["mean"] = moments["count"].tolist(), 1000.0
    path.write_text(json.dumps(document, indent=1) + "\n")
    before = _hashes(output)
    line = _refused(_config(archive, output), tmp_path, capsys)
    assert "generations.json is not what the output's last commit recorded" in line, line
    assert _hashes(output) == before


def test_an_output_without_generations_is_refused(generation0, archive, tmp_path, capsys):
    output, _ = generation0
    (output / "generations.json").unlink()
    assert "rebuild it once with --overwrite" in _refused(_config(archive, output), tmp_path, capsys)
    assert "no complete output" in _refused(_config(archive, tmp_path / "none"), tmp_path, capsys)


def _fail_before_commit(monkeypatch):
    def fail(output, shards):
        raise RuntimeError("injected: the append fails after writing its shards")

    monkeypatch.setattr(finalize, "_check_shards_exist", fail)


def test_a_failed_append_leaves_the_output_whole_and_a_rerun_completes_it(generation0, archive, tmp_path, monkeypatch):
    output, _ = generation0
    before = _hashes(output, [*_shard_files(output), "schema.json", "stats.json", "parser.py", "generations.json"])
    _fail_before_commit(monkeypatch)
    assert _build(_config(archive, output), tmp_path, "--append") != 0
    assert _hashes(output, list(before)) == before
    assert not list(output.glob("*-g001-*")) and not (output / "_tmp").exists()  # its own files removed
    assert inspect_main([str(output), "--verify"]) == 0
    monkeypatch.undo()
    assert _build(_config(archive, output), tmp_path, "--append") == 0
    assert load_schema(str(output)).sources["generations"] == 2
    assert inspect_main([str(output), "--verify"]) == 0


def test_a_killed_append_leaves_the_output_verifiable_and_a_rerun_removes_what_it_left(
    generation0, archive, tmp_path, monkeypatch
):
    """A kill cleans nothing up: its shards stay beside the committed ones until the rerun."""
    output, _ = generation0
    before = _hashes(output, _shard_files(output))
    _fail_before_commit(monkeypatch)
    monkeypatch.setattr(graph, "_remove_run_files", lambda *args: True)  # as killed: nothing removed
    assert _build(_config(archive, output), tmp_path, "--append") != 0
    left = sorted(output.glob("*-g001-*.tfrecord"))
    assert left
    # Killed mid-write, a shard's temporary would be left too.
    (output / f"{left[0].name}.tmp-0123abcd").write_bytes(b"partial")
    assert inspect_main([str(output), "--verify"]) == 0
    monkeypatch.undo()
    assert _build(_config(archive, output), tmp_path, "--append") == 0
    assert _hashes(output, list(before)) == before
    listed = set(_shard_files(output))
    assert not [p.name for p in output.iterdir() if p.is_file() and ".tfrecord" in p.name and p.name not in listed]
    assert not (output / "_tmp").exists()
    assert inspect_main([str(output), "--verify"]) == 0


#: The committed output's metadata, which a failed append must leave (or put back) as it was.
COMMITTED = ("schema.json", "stats.json", "parser.py", "generations.json", "_manifest.json")


def _normalized_reads_work(output: Path) -> None:
    from schemas.dataset import load_dataset

    assert len(Reader(str(output), "train", normalize=True).read_all()["index/time"]) > 0
    assert sum(int(b["t"].shape[0]) for b in load_dataset(str(output), "train", normalize=True, batch_size=64)) > 0


def test_an_append_killed_during_its_commit_leaves_readers_right_and_any_next_run_puts_it_back(
    generation0, archive, tmp_path, monkeypatch, capsys
):
    """Reported: killed between parser.py and schema.json, the generated parser served the uncommitted generation;
    killed after stats.json, every normalize=True read was refused and "nothing to append" repaired nothing.

    Killed here after renaming generations.json, stats.json and parser.py into place, before schema.json: each
    reader refuses the mix in one line, --verify reports it, and the next append, even one with nothing to
    append, puts the committed files back."""
    from schemas.dataset import load_dataset
    from schemas.errors import UserError

    from helpers import import_generated_parser

    output, files = generation0
    before = _hashes(output, COMMITTED)
    _fail_renaming(monkeypatch, output / "schema.json", KeyboardInterrupt)  # as a kill: nothing after it runs
    monkeypatch.setattr(finalize, "restore_committed", lambda *args: False, raising=False)  # (a kill puts nothing back)
    monkeypatch.setattr(graph, "_remove_run_files", lambda *args: True)  # nor removes anything
    assert _build(_config(archive, output), tmp_path, "--append") != 0
    monkeypatch.undo()
    assert load_schema(str(output)).sources["generations"] == 1  # the old commit stands
    assert _hashes(output, ["stats.json", "parser.py"]) != {k: before[k] for k in ("stats.json", "parser.py")}
    for read in (
        lambda: Reader(str(output), "train", normalize=True),
        lambda: load_dataset(str(output), "train", normalize=True),
    ):
        with pytest.raises(UserError, match=r"holds the statistics of 2 generation\(s\) but schema.json commits 1"):
            read()
    parser = import_generated_parser(output)
    with pytest.raises(ValueError, match=r"commits 1 generation\(s\), not the 2 this parser.py was written for"):
        parser.make_dataset("train")
    capsys.readouterr()
    assert inspect_main([str(output), "--verify"]) != 0
    assert "commits 1" in capsys.readouterr().err
    # The next run into the output, here one with nothing to append, puts the committed files back.
    assert _build(_config(archive, output, input__paths=files[:HELD_FILES]), tmp_path, "--append") == 0
    assert "nothing to append" in capsys.readouterr().out
    assert _hashes(output, COMMITTED[:-1]) == {k: before[k] for k in COMMITTED[:-1]}
    _normalized_reads_work(output)
    assert len(parse_with_generated_parser(output, "train")["index/time"]) > 0
    assert inspect_main([str(output), "--verify"]) == 0
    assert _build(_config(archive, output), tmp_path, "--append") == 0  # and the append completes
    assert load_schema(str(output)).sources["generations"] == 2
    _normalized_reads_work(output)
    assert inspect_main([str(output), "--verify"]) == 0


def _fail_renaming(monkeypatch, destination: Path, error) -> None:
    """Make the rename of a file into ``destination`` (the commit's, whichever code does it) raise ``error``."""
    from apache_beam.io.filesystems import FileSystems

    rename = FileSystems.rename

    def failing(sources, destinations, *args, **kwargs):
        if str(destination) in destinations:
            raise error
        return rename(sources, destinations, *args, **kwargs)

    monkeypatch.setattr(FileSystems, "rename", failing)


def _full_disk(name: str):
    def fail(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", name)

    return fail


@pytest.mark.parametrize("where", ["writing stats.json", "renaming schema.json"])
def test_an_append_failing_during_its_commit_leaves_the_committed_files_as_they_were(
    generation0, archive, tmp_path, monkeypatch, where
):
    """Reported: failed on a full disk after replacing stats.json and generations.json, the output's normalised reads
    were refused for good. A failure while writing the metadata changes none of it; one while renaming it into
    place puts the committed files back; the manifest is the one before the append, byte for byte."""
    output, _ = generation0
    before = _hashes(output, COMMITTED)
    if where == "writing stats.json":
        write, fail = finalize.write_atomically, _full_disk("stats.json")
        monkeypatch.setattr(
            finalize,
            "write_atomically",
            lambda p, *a, **k: (fail if str(p).endswith("stats.json") else write)(p, *a, **k),
        )
    else:
        _fail_renaming(monkeypatch, output / "schema.json", OSError(errno.EIO, "Input/output error"))
    assert _build(_config(archive, output), tmp_path, "--append") != 0
    monkeypatch.undo()
    assert _hashes(output, COMMITTED) == before
    assert not list(output.glob("*-g001-*")) and not (output / "_tmp").exists()
    _normalized_reads_work(output)
    assert inspect_main([str(output), "--verify"]) == 0
    assert _build(_config(archive, output), tmp_path, "--append") == 0


def test_a_refused_append_writes_nothing_to_the_manifest(generation0, archive, tmp_path, monkeypatch, capsys):
    """Reported: an append refused after planning (here: no room on the disk for its shards) left a run and shard
    names that do not exist in _manifest.json."""
    from transforms import in_place

    output, _ = generation0
    before = _hashes(output)
    usage = in_place.shutil.disk_usage

    def full(path):
        return usage(path)._replace(free=0)

    monkeypatch.setattr(in_place.shutil, "disk_usage", full)
    line = _refused(_config(archive, output), tmp_path, capsys)
    assert "the disk has 0.0 MB free" in line, line
    del before["_inventory.json"]  # (the new files' probes: a help for the next run, kept)
    assert _hashes(output, list(before)) == before
    assert not (output / "_tmp").exists()


def _same_samples(output: str, reference: Path) -> None:
    for split in SPLITS:
        got, want = (_by_sample(Reader(str(path), split).read_all()) for path in (output, reference))
        assert got.keys() == want.keys()
        for name in want:
            np.testing.assert_array_equal(got[name], want[name], err_msg=f"{split} {name}")


def test_steps_appended_to_a_zarr_store_are_a_new_generation(appended, archive, tmp_path, capsys):
    """For a store, what the output does not hold is the steps appended to it after its last one."""
    import xarray as xr

    with xr.open_mfdataset(sorted(archive.glob("*.nc")), combine="by_coords") as ds:
        whole = ds[["t", "u"]].load()
    store, output = tmp_path / "store.zarr", tmp_path / "out"
    whole.isel(time=slice(0, 4 * HELD_FILES)).to_zarr(store, mode="w", consolidated=True)
    assert _build(_config(archive, output, input__paths=str(store)), tmp_path) == 0
    capsys.readouterr()
    assert _build(_config(archive, output, input__paths=str(store)), tmp_path, "--append") == 0
    assert "nothing to append" in capsys.readouterr().out
    whole.isel(time=slice(4 * HELD_FILES, None)).to_zarr(store, append_dim="time", consolidated=True)
    assert _build(_config(archive, output, input__paths=str(store)), tmp_path, "--append") == 0
    _same_samples(str(output), appended["full"])
    assert inspect_main([str(output), "--verify"]) == 0


def test_an_append_to_a_gs_output(appended, archive, gcs, tmp_path):
    from conftest import BUCKET

    files = sorted(str(p) for p in archive.glob("*.nc"))
    output = f"gs://{BUCKET}/append/out"
    assert _build(_config(archive, output, input__paths=files[:HELD_FILES]), tmp_path) == 0
    old = {name: gcs.cat(f"{output}/{name}") for name in gcs_names(output)}
    assert _build(_config(archive, output), tmp_path, "--append") == 0
    assert {name: gcs.cat(f"{output}/{name}") for name in old} == old
    _same_samples(output, appended["full"])
    assert inspect_main([output, "--verify"]) == 0


def gcs_names(output: str) -> list[str]:
    schema = load_schema(output)
    return [name for shards in schema.splits.values() for s in shards for name in (s.file, s.index) if name]


def test_new_steps_outside_every_split_are_a_generation_without_shards(appended, archive, tmp_path, capsys):
    """val ends inside the fourth file: the fifth's samples are dropped, counted, and not planned again."""
    files = sorted(str(p) for p in archive.glob("*.nc"))
    output = tmp_path / "out"
    assert _build(_config(archive, output, input__paths=files[:4]), tmp_path) == 0
    before = _hashes(output, _shard_files(output))
    capsys.readouterr()
    assert _build(_config(archive, output), tmp_path, "--append") == 0
    printed = capsys.readouterr().out
    assert "Appended generation 1: 0 samples in 0 shard(s)" in printed and "outside" in printed
    assert _hashes(output, _shard_files(output)) == before
    assert load_schema(str(output)).counts == load_schema(str(appended["full"])).counts
    _same_samples(str(output), appended["full"])
    assert _build(_config(archive, output), tmp_path, "--append") == 0
    assert "nothing to append" in capsys.readouterr().out


def test_a_zarr_store_rewritten_with_earlier_steps_backfills_a_gs_output(appended, archive, gcs, tmp_path):
    """A store that now starts earlier (rewritten, as stores cannot grow at their start) and a gs:// output: the
    earlier steps are a backfill, the later ones an append; the union is the full rebuild, shifted."""
    import xarray as xr

    from conftest import BUCKET

    with xr.open_mfdataset(sorted(archive.glob("*.nc")), combine="by_coords") as ds:
        whole = ds[["t", "u"]].load()
    store, output = tmp_path / "store.zarr", f"gs://{BUCKET}/backfill/out"
    origin = 3  # a multiple of the samples' stride (3)
    whole.isel(time=slice(origin, 16)).to_zarr(store, mode="w", consolidated=True)
    assert _build(_config(archive, output, input__paths=str(store)), tmp_path) == 0
    old = {name: gcs.cat(f"{output}/{name}") for name in gcs_names(output)}
    whole.to_zarr(store, mode="w", consolidated=True)
    assert _build(_config(archive, output, input__paths=str(store)), tmp_path, "--append") == 0
    assert {name: gcs.cat(f"{output}/{name}") for name in old} == old
    schema = load_schema(output)
    assert next(a for a in schema.sample["axes"] if a["dim"] == "time")["index_origin"] == origin
    for split in SPLITS:
        got, want = (_by_sample(Reader(str(path), split).read_all()) for path in (output, appended["full"]))
        assert got.keys() == want.keys()
        np.testing.assert_array_equal(got.pop("index/time") + origin, want.pop("index/time"))
        for name in want:
            np.testing.assert_array_equal(got[name], want[name], err_msg=f"{split} {name}")
    assert inspect_main([output, "--verify"]) == 0


def _without_formulas(output: Path) -> None:
    """schema.json as a version before year_progress followed model calendars wrote it: sources without formulas."""
    document = json.loads((output / "schema.json").read_text())
    for feature in document["features"]:
        if feature["role"] == "time_feature":
            for key in ("formula", "calendar", "longitude"):
                feature["source"].pop(key, None)
    (output / "schema.json").write_text(json.dumps(document, indent=1))


def test_an_append_refuses_to_mix_time_features_computed_otherwise(archive, tmp_path, capsys):
    """An output whose day_progress was UTC (written before it followed an iterated longitude) takes no generation
    of local solar time; its year_progress in the standard calendar, unchanged, takes one."""
    files = sorted(str(p) for p in archive.glob("*.nc"))
    sample = {"window": {"time": {"size": 3}}, "keep": ["level", "lat"]}  # lon iterated: one a sample
    for features, refusal in ((["day_progress"], "day_progress_sin was written as"), (["year_progress"], None)):
        output = tmp_path / features[0]
        config = {**_config(archive, output), "sample": {**sample, "time_features": features}}
        assert _build({**config, "input": {**config["input"], "paths": files[:HELD_FILES]}}, tmp_path) == 0
        _without_formulas(output)
        if refusal is None:
            assert _build(config, tmp_path, "--append") == 0
            assert load_schema(str(output)).sources["generations"] == 2
            continue
        before = _hashes(output)
        line = _refused(config, tmp_path, capsys)
        assert refusal in line and "(UTC)" in line and "'lon'" in line and "rebuild with --overwrite" in line, line
        assert _hashes(output) == before


def _future_config(archive: Path, output: Path, test_from: str, **changes) -> dict:
    """Splits fixed once for all: test begins where generation 0's steps end, or after them."""
    splits = {
        "train": {"time": [None, "2020-01-02"]},
        "val": {"time": ["2020-01-03", "2020-01-03T12"]},
        "test": {"time": [test_from, "2020-01-05T18"]},
    }
    sample = {"window": {"time": {"size": 3, "stride": 1}}, "keep": ["level", "lat", "lon"]}
    return {**_config(archive, output, **changes), "splits": splits, "sample": sample}


@pytest.mark.parametrize(
    ("test_from", "why"),
    [
        ("2020-01-04", "[2020-01-04, 2020-01-05T18] lies after the input's last step"),  # no step of it yet
        ("2020-01-03T18", "no whole sample fits in its steps yet"),  # one step of it, a window takes three
    ],
)
def test_a_split_with_no_data_yet_builds_empty_and_an_append_fills_it(archive, tmp_path, capsys, test_from, why):
    files = sorted(str(p) for p in archive.glob("*.nc"))
    output, full = tmp_path / "out", tmp_path / "full"
    capsys.readouterr()
    assert _build(_future_config(archive, output, test_from, input__paths=files[:HELD_FILES]), tmp_path) == 0
    assert f"test: no data yet ({why}" in capsys.readouterr().out  # the build summary
    schema = load_schema(str(output))
    assert schema.num_examples("test") == 0 and schema.splits["test"] == ()
    assert why in schema.sample["splits"]["test"]["no_data_yet"]
    assert inspect_main([str(output)]) == 0
    shown = capsys.readouterr().out
    assert "test: 0 samples: no data yet" in shown and why in shown
    assert inspect_main([str(output), "--verify"]) == 0
    assert "test 0 samples" in capsys.readouterr().out
    # Every reader refuses it in one line naming the split and why (not an epoch of nothing).
    from schemas import load_dataset

    parser = import_generated_parser(output)
    readers = [
        lambda: Reader(str(output), "test"),
        lambda: open_source(str(output), "test"),
        lambda: load_dataset(str(output), "test"),
        lambda: shuffled_stream(str(output), "test", seed=0),
        lambda: parser.make_dataset("test", batch_size=2),
    ]
    for read in readers:
        with pytest.raises(ValueError, match=r"split 'test' holds no samples yet \(.*; .*append"):
            next(iter(read()))
    assert Reader(str(output), "train").num_records > 0  # the others read as ever
    from pipelines.reassemble import main as reassemble_main

    capsys.readouterr()
    assert reassemble_main([str(output), "--split", "test", "--to", str(tmp_path / "test.nc"), "--quiet"]) == 2
    assert "split 'test' holds no samples yet" in capsys.readouterr().err  # (was: ZeroDivisionError)
    # The append brings its steps: the test split is then what a build of every file makes.
    assert _build(_future_config(archive, output, test_from), tmp_path, "--append") == 0
    assert _build(_future_config(archive, full, test_from), tmp_path) == 0
    schema = load_schema(str(output))
    assert schema.num_examples("test") > 0 and "no_data_yet" not in schema.sample["splits"]["test"]
    union = _by_sample(parse_with_generated_parser(output, "test"))
    rebuilt = _by_sample(parse_with_generated_parser(full, "test"))
    for name in rebuilt:
        np.testing.assert_array_equal(union[name], rebuilt[name], err_msg=name)


@pytest.mark.parametrize(
    ("test_from", "changes", "expected"),
    [
        # Its statistics would normalise every split: none to compute yet.
        ("2020-01-04", {"stats__reference_split": "test"}, "stats.reference_split: 'test' holds no sample yet"),
        # Between two steps of the input, inside it: no append ever brings a step there.
        ("2020-01-01T01", {}, "holds no time step of the input"),
    ],
)
def test_an_empty_split_is_refused_where_no_append_fills_it(archive, tmp_path, capsys, test_from, changes, expected):
    files = sorted(str(p) for p in archive.glob("*.nc"))
    config = _future_config(archive, tmp_path / "out", test_from, input__paths=files[:HELD_FILES], **changes)
    if test_from == "2020-01-01T01":
        config["splits"] = {"train": {"time": ["2020-01-02", None]}, "test": {"time": [test_from, "2020-01-01T02"]}}
    capsys.readouterr()
    assert _build(config, tmp_path) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and expected in lines[0], lines
    assert not (tmp_path / "out" / "schema.json").exists()


def _add_in_place(path: Path, variable: str, amount: float) -> None:
    """Change a file's values where it lies, as a correction tool would: its size and steps stay the same."""
    import netCDF4

    with netCDF4.Dataset(path, "a") as ds:
        ds[variable][:] = ds[variable][:] + amount


def test_a_held_file_changed_in_place_is_refused_naming_it(archive, tmp_path, capsys):
    """Reported: a held file's values changed in place (same size and steps), then --append of every file: the
    output held old and new values of the same cells, and statistics unlike a rebuild's, without a word."""
    copied = tmp_path / "archive"
    shutil.copytree(archive, copied)
    files = sorted(str(p) for p in copied.glob("*.nc"))
    output = tmp_path / "out"
    assert _build(_config(copied, output, input__paths=files[:HELD_FILES]), tmp_path) == 0
    size = Path(files[2]).stat().st_size
    _add_in_place(Path(files[2]), "t", 100.0)
    assert Path(files[2]).stat().st_size == size
    before = _hashes(output)
    line = _refused(_config(copied, output), tmp_path, capsys)
    assert files[2] in line and "changed since the output was built from it" in line and "--overwrite" in line, line
    assert _hashes(output) == before


def test_an_output_recording_no_versions_appends_checking_paths_sizes_and_ranges(generation0, archive, tmp_path):
    """Generations recorded before versions were: an append checks what they record, and still adds the new files."""
    output, _ = generation0
    path = output / "generations.json"
    document = json.loads(path.read_text())
    for entry in document["generations"]:
        del entry["versions"]
    path.write_text(json.dumps(document, indent=1) + "\n")
    schema = json.loads((output / "schema.json").read_text())
    from planning.run import generations as records

    schema["sources"][records.DIGEST_KEY] = records.digest(document["generations"])
    (output / "schema.json").write_text(json.dumps(schema, indent=1))
    assert _build(_config(archive, output), tmp_path, "--append") == 0
    assert load_schema(str(output)).sources["generations"] == 2
    assert json.loads(path.read_text())["generations"][1]["versions"]  # recorded from now on


def test_a_new_file_whose_units_differ_is_refused_naming_both_files(archive, tmp_path, capsys):
    """A new file in degC among held files in K: refused at planning, as a build refuses it, nothing written."""
    import netCDF4

    copied = tmp_path / "archive"
    shutil.copytree(archive, copied)
    files = sorted(str(p) for p in copied.glob("*.nc"))
    output = tmp_path / "out"
    assert _build(_config(copied, output, input__paths=files[:HELD_FILES]), tmp_path) == 0
    with netCDF4.Dataset(files[HELD_FILES], "a") as ds:
        ds["t"][:] = ds["t"][:] - 273.15
        ds["t"].units = "degC"
    before = _hashes(output)
    line = _refused(_config(copied, output), tmp_path, capsys)
    assert f"{files[HELD_FILES]}: variable 't' has units 'degC' but 'K' in {files[0]}" in line, line
    assert _hashes(output) == before


def test_an_append_failing_after_its_commit_keeps_the_shards_schema_json_lists(
    generation0, archive, tmp_path, monkeypatch
):
    """Stopped once schema.json names its shards (here: its last bookkeeping fails), the clean-up of a failed run
    must not remove them: the output it committed stays whole, and the next append has nothing to add."""
    output, _ = generation0

    def fail(*args):
        raise RuntimeError("injected: the run fails after its commit")

    monkeypatch.setattr(graph, "record_complete", fail)
    assert _build(_config(archive, output), tmp_path, "--append") != 0
    monkeypatch.undo()
    schema = load_schema(str(output))
    assert schema.sources["generations"] == 2 and list(output.glob("*-g001-*"))
    assert inspect_main([str(output), "--verify"]) == 0
    _normalized_reads_work(output)
    assert _build(_config(archive, output), tmp_path, "--append") == 0  # nothing to append; no file foreign
    assert load_schema(str(output)).sources["generations"] == 2


def test_a_gs_append_killed_during_its_commit_is_put_back_by_the_next_run(archive, gcs, tmp_path, monkeypatch):
    """The commit's staging, copies and renames on an object store (renames are copies there): killed before
    schema.json, the next append into the output puts the committed metadata back, then completes."""
    from conftest import BUCKET

    files = sorted(str(p) for p in archive.glob("*.nc"))
    output = f"gs://{BUCKET}/append-killed/out"
    assert _build(_config(archive, output, input__paths=files[:HELD_FILES]), tmp_path) == 0
    names = ("schema.json", "stats.json", "parser.py", "generations.json")
    before = {name: gcs.cat(f"{output}/{name}") for name in names}
    _fail_renaming(monkeypatch, f"{output}/schema.json", KeyboardInterrupt)  # as a kill
    monkeypatch.setattr(finalize, "restore_committed", lambda *args: False)  # (a kill puts nothing back)
    monkeypatch.setattr(graph, "_remove_run_files", lambda *args: True)  # nor removes anything
    assert _build(_config(archive, output), tmp_path, "--append") != 0
    monkeypatch.undo()
    gcs.invalidate_cache()
    assert gcs.cat(f"{output}/stats.json") != before["stats.json"]  # the uncommitted generation's
    assert inspect_main([output, "--verify"]) != 0
    assert _build(_config(archive, output, input__paths=files[:HELD_FILES]), tmp_path, "--append") == 0
    gcs.invalidate_cache()
    assert {name: gcs.cat(f"{output}/{name}") for name in names} == before
    assert inspect_main([output, "--verify"]) == 0
    assert len(Reader(output, "train", normalize=True).read_all()["index/time"]) > 0


def test_an_append_to_an_output_whose_parser_was_removed_writes_it_anew(generation0, archive, tmp_path):
    output, _ = generation0
    (output / "parser.py").unlink()
    assert _build(_config(archive, output), tmp_path, "--append") == 0
    assert len(parse_with_generated_parser(output, "val")["index/time"]) == load_schema(str(output)).num_examples("val")


def test_a_commit_stopped_on_a_worker_is_put_back_by_the_launchers_clean_up(
    generation0, archive, tmp_path, monkeypatch
):
    """On a remote runner the commit runs on a worker: killed there between two renames (it puts nothing back), the
    job fails, and the launcher's clean-up of the run puts the committed files back before removing the rest."""
    output, _ = generation0
    before = _hashes(output, COMMITTED)
    _fail_renaming(monkeypatch, output / "schema.json", KeyboardInterrupt)
    monkeypatch.setattr(finalize, "restore_committed", lambda *args: False)  # (the worker's, killed)
    assert _build(_config(archive, output), tmp_path, "--append") != 0
    monkeypatch.undo()
    assert _hashes(output, COMMITTED) == before
    assert not (output / "_tmp").exists() and not list(output.glob("*-g001-*"))
    assert inspect_main([str(output), "--verify"]) == 0


def test_an_output_of_the_first_format_is_appended_to_in_the_second(appended, archive, tmp_path):
    """schema.json listing every shard (as outputs of earlier versions hold it): appended to, the output's shards are
    then described by rule, their counts in shards.npz, the same shards and samples as an append to a new output."""
    files = sorted(str(p) for p in archive.glob("*.nc"))
    output = tmp_path / "old"
    assert _build(_config(archive, output, input__paths=files[:HELD_FILES]), tmp_path) == 0
    (output / "schema.json").write_text(load_schema(str(output)).dumps(listed=True))
    (output / SHARDS_FILE).unlink()
    assert json.loads((output / "schema.json").read_text())["format"] == FORMAT_LISTED
    before = _hashes(output, _shard_files(output))
    assert _build(_config(archive, output), tmp_path, "--append") == 0
    for appended_to in (output, appended["output"]):
        assert json.loads((appended_to / "schema.json").read_text())["format"] == FORMAT
    schema, new = load_schema(str(output)), load_schema(str(appended["output"]))
    for split in SPLITS:
        assert list(schema.splits[split]) == list(new.splits[split])
        union = _by_sample(parse_with_generated_parser(output, split))
        want = _by_sample(parse_with_generated_parser(appended["output"], split))
        for name in want:
            np.testing.assert_array_equal(union[name], want[name], err_msg=name)
    assert _hashes(output, list(before)) == before
    assert inspect_main([str(output), "--verify"]) == 0
