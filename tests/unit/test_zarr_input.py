"""Zarr input: recognising a store, planning from its metadata alone, units on its chunks, workers' reads."""

from __future__ import annotations

import collections

import numpy as np
import pytest
import xarray as xr
import zarr
from arco_like import STATIC, arco_like, set_codecs, write_store

from planning.config import BuildConfig
from planning.formats import zarr_store
from planning.formats.zarr_paths import is_store, store_input
from planning.plan import make_plan
from planning.reads import zarr_reads
from planning.run.contracts import SAMPLE_ID
from planning.sampling import unit_pieces
from planning.specs import cut_spec
from schemas.errors import UserError
from transforms.cut import cut_pieces, cut_unit, read_unit

pytestmark = pytest.mark.filterwarnings("ignore:Consolidated metadata:UserWarning")

COORDS = {"time", "level", "latitude", "longitude"}
METADATA = {"zarr.json", ".zgroup", ".zattrs", ".zarray", ".zmetadata"}


def _is_metadata(key: str) -> bool:
    return key.rsplit("/", 1)[-1] in METADATA


@pytest.fixture
def keys_read(monkeypatch) -> list[tuple[str, bool]]:
    """Every key the stores are asked for, and whether it was there."""
    seen = []
    note = zarr_store.RecordingStore._note

    def recording(self, key, buffer, byte_range=None):
        seen.append((key, buffer is not None))
        note(self, key, buffer, byte_range)

    monkeypatch.setattr(zarr_store.RecordingStore, "_note", recording)
    monkeypatch.setattr(zarr_reads, "_OPENED", {})
    return seen


def _config(store, tmp_path, variables=("temperature", "2m_temperature", STATIC), **sample) -> BuildConfig:
    return BuildConfig.model_validate(
        {
            "input": {"paths": [str(store)], "concat_dim": "time"},
            "variables": list(variables),
            "sample": sample or {"window": {"latitude": 5, "longitude": 6}, "keep": ["level"]},
            "output": {"path": str(tmp_path / "out")},
        }
    )


def test_what_names_a_store(tmp_path):
    assert is_store("gs://gcp-public-data-arco-era5/ar/full_37-1h-0p25deg-chunk-1.zarr-v3")
    assert is_store(str(tmp_path / "era5.zarr/"))
    assert not is_store(str(tmp_path / "*.nc")) and not is_store("gs://bucket/era5/2020.nc")
    unnamed = tmp_path / "unnamed"
    unnamed.mkdir()
    assert not is_store(str(unnamed))
    (unnamed / "zarr.json").write_text("{}")
    assert is_store(str(unnamed))
    assert store_input([str(tmp_path / "*.nc")]) is None
    assert store_input([str(unnamed) + "/"]) == str(unnamed)
    with pytest.raises(UserError, match=r"is a Zarr store but .* is another Zarr store"):
        store_input([str(unnamed), "b.zarr"])


@pytest.mark.parametrize(("zarr_format", "consolidated"), [(3, True), (3, False), (2, True), (2, False)])
def test_planning_reads_metadata_and_coordinates_only(tmp_path, keys_read, zarr_format, consolidated):
    store = write_store(arco_like(steps=6), tmp_path / "arco.zarr", zarr_format, consolidated)
    plan = make_plan(_config(store, tmp_path))
    assert plan.zarr_store == str(store) and plan.num_samples == 6 * 2 * 3
    found = [key for key, there in keys_read if there]
    chunks = {key.split("/")[0] for key in found if not _is_metadata(key)}
    assert chunks == COORDS  # the dim coordinates, and no data variable's chunk
    if consolidated:  # one object holds every array's metadata
        metadata = {key for key in found if _is_metadata(key)}
        assert metadata == ({"zarr.json"} if zarr_format == 3 else {".zgroup", ".zattrs", ".zmetadata"})


def _empty_store(path, steps: int, chunk: int) -> None:
    """A v3 store with coordinates and metadata but no data chunk written (as a store allocated ahead)."""
    group = zarr.create_group(path, attributes={})
    time = group.create_array("time", shape=(steps,), dtype="int64", dimension_names=["time"])
    time[:] = np.arange(steps)
    time.attrs.update({"units": "hours since 1959-01-01", "calendar": "proleptic_gregorian"})
    for name, size in (("level", 37), ("latitude", 4), ("longitude", 8)):
        group.create_array(name, shape=(size,), dtype="float32", dimension_names=[name])[:] = np.arange(size)
    dims = ["time", "level", "latitude", "longitude"]
    for name in ("temperature", "geopotential"):
        group.create_array(
            name, shape=(steps, 37, 4, 8), chunks=(chunk, 37, 4, 8), dtype="float32", dimension_names=dims
        )
    zarr.consolidate_metadata(path)


def test_a_hundred_thousand_steps_plan_without_reading_a_chunk(tmp_path, keys_read):
    _empty_store(tmp_path / "big.zarr", 100_000, chunk=4)
    config = _config(
        tmp_path / "big.zarr", tmp_path, ["temperature"], window={"latitude": 2, "longitude": 8}, keep=["level"]
    )
    plan = make_plan(config)
    assert plan.num_samples == 100_000 * 2 and len(plan.units) > 1
    assert not [key for key, _ in keys_read if key.startswith("temperature/c/")]
    for unit in plan.units:  # every unit starts at a chunk and ends at one (or at the end)
        start, stop = unit.ranges[0]
        assert start % 4 == 0 and (stop % 4 == 0 or stop == 100_000), unit


def test_a_chunk_over_the_budget_is_one_unit_cut_in_pieces_on_its_worker(tmp_path):
    _empty_store(tmp_path / "big.zarr", 12, chunk=4)
    config = _config(
        tmp_path / "big.zarr", tmp_path, ["temperature"], window={"latitude": 1, "longitude": 2}, keep=["level"]
    )
    one_step = 37 * 4 * 8 * 4
    plan = make_plan(config, unit_budget_bytes=3 * one_step)  # one chunk (4 steps) does not fit
    # A chunk is never split between units (each would fetch and decode it whole) ...
    assert [unit.ranges[0] for unit in plan.units] == [(0, 4), (4, 8), (8, 12)]
    assert all(unit.ranges[1:] == ((0, 4), (0, 4)) for unit in plan.units)
    # ... its worker cuts it in pieces that fit the budget instead, covering each position once.
    pieces = [piece for unit in plan.units for piece in unit_pieces(unit, plan.pieces)]
    assert len(pieces) > len(plan.units)
    covered = sorted(position for piece in pieces for position in _positions(piece))
    assert covered == sorted(set(covered)) and len(covered) == plan.num_samples


def test_units_hold_whole_chunks_along_the_window_dims_too(tmp_path):
    """Chunks of 4 latitudes: units start and end at them whatever the budget; pieces are cut inside."""
    ds = arco_like(steps=2, lat=16, lon=8)
    store = tmp_path / "arco.zarr"
    ds[["temperature"]].to_zarr(store, encoding={"temperature": {"chunks": (1, 37, 4, 8)}}, zarr_format=3)
    config = _config(store, tmp_path, ["temperature"], window={"latitude": 3, "longitude": 8}, keep=["level"])
    plan = make_plan(config, unit_budget_bytes=2e4)  # under one chunk
    for unit in plan.units:
        start, stop = unit.ranges[1]  # window 3, stride 3: position p starts at latitude 3p
        assert (3 * start) // 4 != (3 * start - 3) // 4 or start == 0, unit
        assert stop == 5 or (3 * stop) // 4 != (3 * stop - 3) // 4, unit
    assert len({unit.ranges[1] for unit in plan.units}) > 1 and plan.pieces


def _fetched(keys_read) -> collections.Counter:
    return collections.Counter(k for k, there in keys_read if there and "/c/" in k and k.split("/")[0] not in COORDS)


@pytest.mark.parametrize("levels", [None, [500, 700, 850]])
def test_each_chunk_is_fetched_once_whatever_the_budget_and_levels(tmp_path, keys_read, levels):
    """ARCO's chunking (a step of every level over the whole globe), a budget under one chunk, all levels or
    three selected ones (three runs of each chunk): every chunk is fetched once, by one unit, and the blocks of
    the pieces are the unit's block."""
    store = write_store(arco_like(steps=3, lat=16, lon=24), tmp_path / "arco.zarr")
    config = _config(
        store, tmp_path, ["temperature", "2m_temperature"], window={"latitude": 4, "longitude": 4}, keep=["level"]
    )
    if levels:
        config = BuildConfig.model_validate(config.model_dump() | {"select": {"level": levels}})
    plan = make_plan(config, unit_budget_bytes=2e4)
    spec = cut_spec(plan)
    keys_read.clear()
    fetched = needed = 0
    for unit in plan.units:
        slabs = read_unit(spec, plan.sources, unit)
        fetched, needed = fetched + slabs.bytes_read, needed + slabs.chunk_bytes
        blocks = list(cut_pieces(spec, unit, slabs))
        assert len(blocks) > 1 and [b.piece for b in blocks] == list(range(len(blocks)))
        whole = cut_unit(spec, plan.sources, unit).samples.to_dataset()
        joined = xr.concat([b.samples.to_dataset() for b in blocks], "sample").sortby(SAMPLE_ID)
        xr.testing.assert_identical(joined, whole)
    counts = _fetched(keys_read)
    assert counts and set(counts.values()) == {2}  # once by the units' reads, once by the whole-unit checks
    assert fetched == needed > 0


def test_a_window_across_chunks_reads_its_halo_and_counts_it(tmp_path, keys_read):
    """Pairs of steps, a step per chunk: each unit fetches the next step's chunk too, which another unit owns."""
    store = write_store(arco_like(steps=4), tmp_path / "arco.zarr")
    sample = {"window": {"latitude": 5, "longitude": 6}, "offsets": {"time": [0, 1]}}
    plan = make_plan(_config(store, tmp_path, ["2m_temperature"], **sample), unit_budget_bytes=3e3)
    assert [unit.ranges[0] for unit in plan.units] == [(0, 1), (1, 2), (2, 3)]  # a step per unit
    spec = cut_spec(plan)
    keys_read.clear()
    reads = [read_unit(spec, plan.sources, unit) for unit in plan.units]
    counts = _fetched(keys_read)
    assert counts["2m_temperature/c/0/0/0"] == 1 and counts["2m_temperature/c/1/0/0"] == 2
    chunk = reads[0].chunk_bytes
    assert all(r.chunk_bytes == chunk and r.bytes_read == 2 * chunk for r in reads)


def _positions(unit):
    ranges = [range(*r) for r in unit.ranges]
    return [(t, y, x) for t in ranges[0] for y in ranges[1] for x in ranges[2]]


def test_a_unit_reads_only_its_chunks(tmp_path, keys_read):
    store = write_store(arco_like(steps=12), tmp_path / "arco.zarr")
    config = _config(store, tmp_path)
    plan = make_plan(config, unit_budget_bytes=4e5)  # a few steps per unit
    unit = plan.units[1]
    begin, end = unit.ranges[0]
    assert 0 < begin < end < 12
    keys_read.clear()
    slabs = read_unit(cut_spec(plan), plan.sources, unit)
    chunks = {key for key, _ in keys_read if "/c/" in key and key.split("/")[0] not in COORDS}
    expected = {f"{name}/c/{t}/0/0/0" for name in ("temperature",) for t in range(begin, end)}
    expected |= {f"2m_temperature/c/{t}/0/0" for t in range(begin, end)} | {f"{STATIC}/c/0/0"}
    assert chunks == expected
    assert slabs.values["temperature"].shape == (end - begin, 37, 10, 18)
    assert slabs.bytes_read > 0


def test_a_codec_the_worker_lacks_is_named(tmp_path, keys_read):
    """Planned where the codec is at hand, read where it is not (here: the store rewritten to zfpy, not installed)."""
    store = write_store(arco_like(steps=2), tmp_path / "arco.zarr")
    plan = make_plan(_config(store, tmp_path, variables=("temperature",)))
    set_codecs(store, "temperature", [{"name": "numcodecs.zfpy", "configuration": {"mode": 4}}])
    with pytest.raises(
        UserError, match=r"arco.zarr: codec 'zfpy' is not available; install zfpy \(pip install zfpy\)$"
    ):
        read_unit(cut_spec(plan), plan.sources, plan.units[0])


def test_a_sharded_store_fetches_each_inner_chunk_once(tmp_path, monkeypatch):
    """Zarr v3 shards (two inner chunks each along latitude): units hold whole shards, each byte range is fetched
    once, and the stored bytes counted are those fetched."""
    ds = arco_like(steps=2, lat=10, lon=18)[["temperature"]]
    store = tmp_path / "sharded.zarr"
    encoding = {"temperature": {"chunks": (1, 37, 5, 18), "shards": (1, 37, 10, 18)}}
    ds.to_zarr(store, encoding=encoding, zarr_format=3, consolidated=True)
    plan = make_plan(_config(store, tmp_path, ["temperature"]), unit_budget_bytes=2e4)
    seen = []
    note = zarr_store.RecordingStore._note

    def recording(self, key, buffer, byte_range=None):
        if buffer is not None and key.startswith("temperature/c/"):
            seen.append((key, repr(byte_range)))
        note(self, key, buffer, byte_range)

    monkeypatch.setattr(zarr_store.RecordingStore, "_note", recording)
    monkeypatch.setattr(zarr_reads, "_OPENED", {})
    spec = cut_spec(plan)
    reads = [read_unit(spec, plan.sources, unit) for unit in plan.units]
    assert len(plan.units) == 2 and plan.pieces  # a shard a unit, in pieces
    assert seen and len(seen) == len(set(seen))
    assert sum(r.bytes_read for r in reads) == sum(r.chunk_bytes for r in reads) > 0
