"""The command line on a local output's own records: buckets of references, each record read where it is.

A real build (NetCDF archive, Beam), then ``python -m pipelines.reassemble`` in several chunks: what it
writes equals what the samples copied into buckets give (the path a remote or compressed output takes)
and what the library puts back from schemas.Reader; a bucket whose reference names another sample than
the record it points at stops the run with one line naming the bucket.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import xarray as xr

import schemas
import transforms.reassemble as reassemble
from pipelines.reassemble import main
from schemas.record_refs import ReferencedRecords

from helpers import build_quietly


@pytest.fixture(scope="module")
def tiles(small_archive, tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("tiles")
    config = {
        "input": {"paths": str(small_archive / "*.nc")},
        "variables": ["t", "u"],
        "sample": {"window": {"lat": 6, "lon": {"size": 5, "stride": 5}}, "keep": ["level"]},
        "output": {"path": str(tmp / "out"), "num_shards": 2},
    }
    return build_quietly(config, tmp)


def _cli(output: Path, to: Path, capsys) -> tuple[int, str]:
    code = main([str(output), "--to", str(to), "--chunk_mb", "0.05", "--quiet"])
    return code, capsys.readouterr().err


def test_references_give_what_copies_and_the_library_give(tiles, tmp_path, capsys, monkeypatch):
    checked = []
    real_checked = ReferencedRecords.checked
    monkeypatch.setattr(ReferencedRecords, "checked", lambda self, *a: checked.append(1) or real_checked(self, *a))
    code, err = _cli(tiles, tmp_path / "refs.zarr", capsys)
    assert code == 0, err
    assert len(checked) > 1  # several chunks, each read by reference
    real_plan = reassemble.ReassemblePlan.__init__

    def copying(self, *args, **kwargs):  # the plan a remote output gets: samples copied into the buckets
        real_plan(self, *args, **kwargs)
        object.__setattr__(self, "references", False)

    monkeypatch.setattr(reassemble.ReassemblePlan, "__init__", copying)
    checked.clear()
    code, err = _cli(tiles, tmp_path / "copies.zarr", capsys)
    assert code == 0, err
    assert not checked
    by_reference = xr.open_zarr(tmp_path / "refs.zarr").load()
    copied = xr.open_zarr(tmp_path / "copies.zarr").load()
    want = schemas.reassemble(str(tiles))
    assert int(want["coverage"].min()) == 0 and int(want["coverage"].max()) == 1  # (edges no tile reaches)
    for name in ("t", "u", "coverage"):
        np.testing.assert_array_equal(by_reference[name].values, copied[name].values, err_msg=name)
        np.testing.assert_array_equal(by_reference[name].values, want[name].values, err_msg=name)
    assert by_reference.attrs == copied.attrs and by_reference["t"].attrs == copied["t"].attrs


def test_a_bucket_referring_to_another_sample_is_one_line_naming_it(tiles, tmp_path, capsys, monkeypatch):
    real = ReferencedRecords.index_batches

    def swapped(self, number, records=256):  # two samples' keys traded: each points at the other's record
        for i, batch in enumerate(real(self, number, records)):
            if number == 0 and i == 0:
                lon = batch["index/lon"] = batch["index/lon"].copy()
                other = int(np.flatnonzero(lon != lon[0])[0])
                lon[[0, other]] = lon[[other, 0]]
            yield batch

    monkeypatch.setattr(ReferencedRecords, "index_batches", swapped)
    code, err = _cli(tiles, tmp_path / "x.zarr", capsys)
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith("error: ") and ".bucket: the record of " in err and "holds index/lon = " in err, err
    assert str(tiles / "data-00000-of-00002.tfrecord") in err
    assert not (tmp_path / "x.zarr").exists() and not (tmp_path / "x.zarr.parts").exists()
