"""The summary an append prints counts what the append did: its own dropped samples, not earlier generations'."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from pipelines.build import main
from schemas import load_schema


@pytest.fixture(scope="module")
def archive(tmp_path_factory) -> list[Path]:
    """Three files of four 6-hourly steps: 2020-01-01, -02 and -03."""
    from pipelines.demo import ArchiveShape, write_archive

    directory = tmp_path_factory.mktemp("summary_archive")
    return sorted(write_archive(directory, ArchiveShape(num_files=3, steps_per_file=4, levels=2, lat=4, lon=6)))


def _build(tmp_path: Path, files: list[Path], splits: dict, capsys, *flags: str) -> str:
    config = {
        "input": {"paths": [str(p) for p in files]},
        "variables": ["t"],
        "sample": {"window": {"lat": 2, "lon": 3}, "keep": ["level"]},
        "splits": splits,
        "output": {"path": str(tmp_path / "out")},
    }
    path = tmp_path / f"config{len(flags)}.yaml"
    path.write_text(yaml.safe_dump(config))
    capsys.readouterr()
    assert main(["--config", str(path), *flags]) == 0
    return capsys.readouterr().out


def test_an_append_that_drops_nothing_says_nothing_of_the_first_builds_drops(archive, tmp_path, capsys):
    # The first day's last step lies outside both splits: the first build drops its samples; the third day is valid.
    splits = {"train": {"time": [None, "2020-01-01T12"]}, "valid": {"time": ["2020-01-02", None]}}
    first = _build(tmp_path, archive[:2], splits, capsys)
    per_step = 2 * 2  # 2 x 2 windows of 2 x 3 on the 4 x 6 grid
    assert f"  dropped: {per_step:,} outside or across splits" in first, first
    appended = _build(tmp_path, archive, splits, capsys, "--append")
    assert "Appended generation 1: 16 samples" in appended and "dropped" not in appended, appended
    assert load_schema(str(tmp_path / "out")).counts["samples_outside_splits"] == per_step  # the output's


def test_an_append_names_only_its_own_drops(archive, tmp_path, capsys):
    # train ends at noon of the first day: the first build drops its last step; the append, every step of its day.
    splits = {"train": {"time": [None, "2020-01-01T12"]}}
    first = _build(tmp_path, archive[:1], splits, capsys)
    per_step = 2 * 2
    assert f"  dropped: {per_step:,} outside or across splits" in first, first
    appended = _build(tmp_path, archive[:2], splits, capsys, "--append")
    dropped = [line for line in appended.splitlines() if "dropped" in line]
    assert dropped == [f"  dropped of the new steps' samples: {4 * per_step:,} outside or across splits"], appended
