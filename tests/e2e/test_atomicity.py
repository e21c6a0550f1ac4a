"""A build killed mid-write leaves no schema.json; a rerun with --overwrite completes it cleanly."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from schemas import load_schema

from helpers import read_all_records


@pytest.fixture(scope="module")
def larger_archive(tmp_path_factory) -> Path:
    from pipelines.demo import ArchiveShape, write_archive

    directory = tmp_path_factory.mktemp("larger")
    write_archive(directory, ArchiveShape(num_files=6, steps_per_file=8, levels=10, lat=64, lon=128), seed=3)
    return directory


def _command(config: Path, *flags: str) -> list[str]:
    return [sys.executable, "-m", "pipelines.build", "--config", str(config), *flags]


def _first_shard_write(output: Path, process: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(output.glob("data-*")):
            return
        assert process.poll() is None, "the build ended before any shard was written"
        time.sleep(0.005)
    raise AssertionError("no shard appeared in time")


def test_sigkill_mid_write_then_rerun(larger_archive, tmp_path):
    output = tmp_path / "out"
    config = tmp_path / "c.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "input": {"paths": str(larger_archive / "*.nc")},
                "sample": {"window": {"lat": 8, "lon": 8}, "keep": ["level"]},
                "output": {"path": str(output), "num_shards": 12},
            }
        )
    )
    process = subprocess.Popen(
        _command(config), start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        _first_shard_write(output, process)
    finally:
        os.killpg(process.pid, signal.SIGKILL)  # the build and any worker it started
        process.wait()
    assert process.returncode == -signal.SIGKILL
    assert not (output / "schema.json").exists()
    assert any(output.iterdir())  # it was killed with work on disk

    refused = subprocess.run(_command(config), capture_output=True, text=True)
    assert refused.returncode == 2 and "already exists; pass --overwrite" in refused.stderr

    rerun = subprocess.run(_command(config, "--overwrite"), capture_output=True, text=True)
    assert rerun.returncode == 0, rerun.stderr
    schema = load_schema(str(output))
    assert schema.num_records() == 6 * 8 * 8 * 16 == schema.counts["samples_cut"]
    records = read_all_records(output, schema)  # every CRC checked
    assert len(records["t"]) == schema.num_records()
    expected = {"schema.json", "stats.json", "parser.py", "_inventory.json", *(s.file for s in schema.splits["data"])}
    assert {p.name for p in output.iterdir()} == expected  # no _tmp, no temporary shard names
