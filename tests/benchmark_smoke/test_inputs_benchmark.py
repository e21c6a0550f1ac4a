"""The GRIB-and-references benchmark (``benchmarks.inputs_vs_netcdf``) prints every row, the reference's shards
byte-identical to the NetCDF files'; its cached GRIB copy and reference are made again when the archive changes."""

from __future__ import annotations

import json
import os

import pytest

from conftest import REPO
from helpers import run_benchmark

pytest.importorskip("cfgrib", reason="the GRIB row reads GRIB with cfgrib (grib extras)")
pytest.importorskip("kerchunk", reason="the reference row writes a kerchunk reference (virtual extras)")

ROWS = [
    "as GRIB 2 files and a kerchunk reference vs NetCDF files QUICK",
    "NetCDF files",
    "GRIB 2 files",
    "kerchunk reference",
    "GRIB 2 files / NetCDF",
    "kerchunk reference / NetCDF",
    "kerchunk reference: shards byte-identical to NetCDF's: True",
    "GRIB 2 files: values packed to 16 bits",
]


def test_quick_inputs_benchmark_prints_every_row_and_identical_reference_shards(tmp_path):
    result_file = tmp_path / "inputs.json"
    kept = tmp_path / "out" / "quick-patches-4f" / "pipeline" / "data-00000-of-00002.tfrecord"
    kept.parent.mkdir(parents=True)
    kept.write_bytes(b"another benchmark's output (benchmarks.run --keep-outputs)")
    printed = run_benchmark(
        "benchmarks.inputs_vs_netcdf", "--quick", "--workdir", str(tmp_path), "--json", str(result_file)
    )
    for row in ROWS:
        assert row in printed, f"no row {row!r} in:\n{printed}"
    results = json.loads(result_file.read_text())
    assert results["failed"] == [] and results["reference_identical"] is True
    rows = results["rows"]
    assert list(rows) == ["NetCDF files", "GRIB 2 files", "kerchunk reference"]
    # Every input gave every sample; the reference's build counted the byte ranges it fetched, the files' did not.
    assert {row["samples"] for row in rows.values()} == {32}
    assert rows["kerchunk reference"]["fetched_mb"] > 0 and rows["kerchunk reference"]["needed_mb"] > 0
    assert all(row["rchar"] > 0 and row["peak_rss"] > 0 for row in rows.values())
    assert kept.exists() and not list(kept.parent.parent.glob("inputs-*"))  # its own outputs removed, no other

    # The same through python -m benchmarks.run --only inputs: its section in the report, the cached copies reused.
    printed = run_benchmark("benchmarks.run", "--only", "inputs", "--quick", "--workdir", str(tmp_path))
    assert "kerchunk reference: shards byte-identical to NetCDF's: True" in printed and "== targets ==" in printed
    assert "[inputs] writing" not in printed


def test_run_includes_the_inputs_benchmark_only_when_asked(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO))  # benchmarks/ is not an installed package
    from benchmarks import run

    assert "inputs" in run.COMPETITORS and "inputs" not in run.DEFAULT_COMPETITORS


def test_the_cached_grib_files_and_reference_are_made_again_from_a_changed_archive(tmp_path, monkeypatch, capsys):
    """A NetCDF file rewritten since the reference was made: its byte ranges may hold other bytes now, so a cached
    reference (or GRIB copy) would build wrong numbers without a word; a GRIB file gone is written again."""
    monkeypatch.syspath_prepend(str(REPO))  # benchmarks/ is not an installed package
    from benchmarks import datasets
    from benchmarks.inputs_vs_netcdf import ensure_grib, ensure_references

    spec = datasets.patches(1, quick=True)
    archive = datasets.ensure_archive(tmp_path, spec)
    grib, references = tmp_path / "grib", tmp_path / "refs.json"
    first = ensure_grib(archive, grib)
    ensure_references(archive, references)
    capsys.readouterr()
    assert ensure_grib(archive, grib) == first and ensure_references(archive, references) == references
    assert "[inputs] writing" not in capsys.readouterr().out  # unchanged: reused

    first[1].unlink()
    assert ensure_grib(archive, grib) == first and first[1].exists()
    assert "writing GRIB 2 files" in capsys.readouterr().out
    changed = datasets.input_files(archive)[0]
    stat = changed.stat()
    os.utime(changed, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    (tmp_path / "refs.json.converted.json").write_text("{half written")
    ensure_references(archive, references)
    ensure_grib(archive, grib)
    printed = capsys.readouterr().out
    assert "writing the kerchunk reference" in printed and "writing GRIB 2 files" in printed
