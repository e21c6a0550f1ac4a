"""When the machine fails a build (full disk, read-only output, a closed pipe): one line, and nothing half-written."""

from __future__ import annotations

import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml

from pipelines.build import main


@pytest.fixture
def mounted(tmp_path):
    """``mounted(size, read_only)``: a fresh tmpfs of ``size`` under tmp_path (needs root; skipped without)."""
    points = []

    def mount(size: str, read_only: bool = False) -> Path:
        point = tmp_path / f"fs-{uuid.uuid4().hex[:6]}"
        point.mkdir()
        options = f"size={size}" + (",ro" if read_only else "")
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(point)], capture_output=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here (needs root): {done.stderr.decode().strip()}")
        points.append(point)
        return point

    yield mount
    for point in points:
        subprocess.run(["umount", "-l", str(point)], check=False)


def _config(small_archive: Path, tmp_path: Path, output: Path, in_place: bool = True) -> Path:
    path = tmp_path / "c.yaml"
    config = {
        "input": {"paths": str(small_archive / "*.nc")},
        "sample": {"window": {"lat": 4, "lon": 4}, "keep": ["level"]},
        "output": {"path": str(output), "num_shards": 4, "in_place": in_place},
    }
    path.write_text(yaml.safe_dump(config))
    return path


def _one_line(capsys) -> str:
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1, lines
    return lines[0]


@pytest.mark.parametrize("in_place", [True, False], ids=["in place: refused first", "bucket files: meets it"])
def test_a_full_disk_is_one_line_and_leaves_only_the_bookkeeping(small_archive, tmp_path, mounted, capsys, in_place):
    """Records written in place have a known size: a disk without room fails before any unit runs (exit 2). Other
    writes meet the full disk as they go (exit 1). Either way: one line, and only the bookkeeping is left."""
    disk = mounted("160k")  # the manifest and the probes fit; the shards (about 600 KB) do not
    output = disk / "out"
    code = main(["--config", str(_config(small_archive, tmp_path, output, in_place=in_place)), "--quiet"])
    line = _one_line(capsys)
    fix = "free some space, or write the output elsewhere (--output)"
    if in_place:
        assert code == 2
        sizes = r"the shards need 0\.\d MB and the disk has 0\.\d MB free"
        assert re.fullmatch(rf"error: {re.escape(str(output))}: {sizes}; {re.escape(fix)}", line), line
    else:
        assert code == 1
        assert line.startswith(f"error: {output}") and line.endswith(f"no space left on device; {fix}"), line
    assert "Traceback" not in line
    assert sorted(p.name for p in output.rglob("*")) == ["_inventory.json", "_manifest.json"]


def test_a_read_only_output_is_one_line(small_archive, tmp_path, mounted, capsys):
    output = mounted("1m", read_only=True) / "out"
    assert main(["--config", str(_config(small_archive, tmp_path, output)), "--quiet"]) == 1
    assert _one_line(capsys) == (
        f"error: {output}: read-only file system; the filesystem is read-only: write the output elsewhere (--output)"
    )


def test_a_reader_that_goes_away_does_not_fail_a_finished_build(small_archive, tmp_path):
    """`build ... | head -1`: the build completes and exits 0, with no traceback."""
    output = tmp_path / "out"
    command = [sys.executable, "-m", "pipelines.build", "--config", str(_config(small_archive, tmp_path, output))]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    process.stdout.close()  # as `head -1` does after its line: every later write meets a closed pipe
    err = process.stderr.read()
    assert process.wait(timeout=300) == 0, err
    assert "Traceback" not in err and "BrokenPipe" not in err
    assert (output / "schema.json").exists()
