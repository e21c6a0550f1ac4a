"""NetCDF-4 chunked variables: a unit reads each chunk it touches once (selected levels inside one chunk too),
the samples equal xarray's slices, and the chunks fetched weigh about the chunks needed, locally and on gs://."""

from __future__ import annotations

import collections

import numpy as np
import pytest
import xarray as xr
from netcdf4_chunked import LEVELS, SHAPE, write_chunked

from planning.config import parse_config
from planning.formats import hdf5_chunks
from planning.plan import make_plan
from planning.specs import cut_spec
from schemas.errors import UserError
from transforms.cut import cut_pieces, read_unit

from conftest import BUCKET


def _plan(paths: str, tmp_path, levels=None, budget=2e5):
    """Windows of 5 y every 3 (6 a step, crossing the y chunks), 4 x every 4; a budget of two steps a unit."""
    config = {
        "input": {"paths": paths},
        "variables": ["t", "q"],
        "sample": {"window": {"y": {"size": 5, "stride": 3}, "x": {"size": 4, "stride": 4}}, "keep": ["level"]},
        "output": {"path": str(tmp_path / "out")},
    }
    if levels is not None:
        config["select"] = {"level": [100 * i for i in levels]}
    return make_plan(parse_config(config), unit_budget_bytes=budget)


@pytest.fixture
def chunk_reads(monkeypatch):
    """Every chunk read from a file, by (file, variable, first index), as often as read."""
    seen: collections.Counter = collections.Counter()
    note = hdf5_chunks.UnitChunks.note

    def noting(self, key, dims, chunks, stored):
        seen[key] += 1
        note(self, key, dims, chunks, stored)

    monkeypatch.setattr(hdf5_chunks.UnitChunks, "note", noting)
    return seen


def _stored_chunks(path) -> int:
    """The stored bytes of every chunk of t and q (h5py's own listing of them)."""
    import h5py

    with h5py.File(path, "r") as file:
        return sum(
            file[name].id.get_chunk_info(i).size for name in ("t", "q") for i in range(file[name].id.get_num_chunks())
        )


def _build(plan):
    """Every unit read and cut: (the samples in id order, chunk bytes fetched, stored bytes of those needed)."""
    spec = cut_spec(plan)
    fetched = needed = 0
    blocks = []
    for unit in plan.units:
        slabs = read_unit(spec, plan.sources, unit)
        fetched, needed = fetched + slabs.chunks_fetched, needed + slabs.chunk_bytes
        blocks += [b.samples.to_dataset() for b in cut_pieces(spec, unit, slabs)]
    return xr.concat(blocks, "sample").sortby("sample_id"), fetched, needed


def _assert_xarray_slices(samples: xr.Dataset, path, levels=None):
    with xr.open_dataset(path, decode_times=False) as ds:
        ds = ds.load() if levels is None else ds.isel(level=levels).load()
    assert samples.sizes["sample"] == SHAPE[0] * 6 * 3  # y starts 0..15 by 3, x starts 0..8 by 4
    for i in range(samples.sizes["sample"]):
        sample = samples.isel(sample=i)
        t, y, x = (int(sample[f"index/{d}"]) for d in ("time", "y", "x"))
        for name in ("t", "q"):
            expected = ds[name].isel(time=t, y=slice(y, y + 5), x=slice(x, x + 4)).values.astype("f4")
            np.testing.assert_array_equal(sample[name].values, expected, err_msg=f"{name} at {t}, {y}, {x}")


@pytest.mark.parametrize("levels", [None, LEVELS])
def test_each_chunk_is_read_once_and_the_samples_are_xarray_slices(tmp_path, chunk_reads, levels):
    path = write_chunked(tmp_path / "a.nc")
    plan = _plan(str(path), tmp_path, levels)
    assert len(plan.units) > 1
    for unit in plan.units:  # units hold whole chunks: along time too (two steps a chunk)
        start, stop = unit.ranges[0]
        assert start % 2 == 0 and (stop % 2 == 0 or stop == SHAPE[0]), unit
    samples, fetched, needed = _build(plan)
    _assert_xarray_slices(samples, path, levels)
    assert chunk_reads and set(chunk_reads.values()) == {1}  # three levels of two runs: still one read a chunk
    assert fetched == needed == _stored_chunks(path)


def test_a_window_across_a_unit_edge_fetches_the_next_chunk_and_counts_it(tmp_path, chunk_reads):
    """A budget under a step: units split y where a chunk starts; a unit's last windows cross into the next
    unit's chunk, which it fetches too (a halo): counted as fetched, not as needed."""
    path = write_chunked(tmp_path / "a.nc")
    plan = _plan(str(path), tmp_path, budget=3e4)
    assert len({u.ranges[1] for u in plan.units}) > 1
    samples, fetched, needed = _build(plan)
    _assert_xarray_slices(samples, path)
    assert needed == _stored_chunks(path) and set(chunk_reads.values()) == {1, 2}
    import h5py

    with h5py.File(path, "r") as file:
        again = sum(file[n].id.get_chunk_info_by_coord(c).size for (_, n, c), k in chunk_reads.items() if k == 2)
    assert fetched == needed + again


def test_a_damaged_chunk_is_named_with_its_file(tmp_path):
    """The compressed bytes of one chunk overwritten (planning reads no chunk): the read names file and variable."""
    path = write_chunked(tmp_path / "a.nc")
    import h5py

    with h5py.File(path, "r") as file:
        info = file["q"].id.get_chunk_info(0)
    with open(path, "r+b") as stream:
        stream.seek(info.byte_offset)
        stream.write(b"\xff" * info.size)
    plan = _plan(str(path), tmp_path)
    with pytest.raises(UserError, match=r"a\.nc: reading 'q' failed .*the file may be truncated or corrupt"):
        read_unit(cut_spec(plan), plan.sources, plan.units[0])


def test_on_gs_each_chunk_is_fetched_once(tmp_path, gcs, chunk_reads, monkeypatch):
    """The same file on the storage emulator, three levels selected: units planned on its chunks (its metadata
    fetched at planning), each chunk's bytes in one prefetch of the build, the samples xarray's."""
    from planning.formats.remote_files import BlockReader

    path = write_chunked(tmp_path / "a.nc")
    gcs.put(str(path), f"{BUCKET}/chunks/a.nc")
    prefetched = []
    prefetch = BlockReader.prefetch

    def noting(self, ranges, parts=None):
        prefetched.extend(ranges)
        prefetch(self, ranges, parts)

    monkeypatch.setattr(BlockReader, "prefetch", noting)
    plan = _plan(f"gs://{BUCKET}/chunks/a.nc", tmp_path, LEVELS)
    assert len(plan.units) > 1 and {u.ranges[0][0] % 2 for u in plan.units} == {0}
    prefetched.clear()  # (planning's: the file's head and tail)
    samples, fetched, needed = _build(plan)
    _assert_xarray_slices(samples, path, LEVELS)
    assert set(chunk_reads.values()) == {1} and fetched == needed == _stored_chunks(path)
    import h5py

    with h5py.File(path, "r") as file:
        chunks = [file[n].id.get_chunk_info(i) for n in ("t", "q") for i in range(file[n].id.get_num_chunks())]
    for chunk in chunks:
        where = (chunk.byte_offset, chunk.byte_offset + chunk.size)
        assert sum(a <= where[0] and where[1] <= b for a, b in prefetched) == 1, where
