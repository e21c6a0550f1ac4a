"""Zarr input: recognising a store, planning from its metadata alone, units on its chunks, workers' reads."""

from __future__ import annotations

import numpy as np
import pytest
import zarr
from arco_like import STATIC, arco_like, set_codecs, write_store

from planning.config import BuildConfig
from planning.formats import zarr_store
from planning.formats.zarr_store import is_store, store_input
from planning.plan import make_plan
from planning.reads import zarr_reads
from planning.specs import cut_spec
from schemas.errors import UserError
from transforms.cut import read_unit

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

    def recording(self, key, buffer):
        seen.append((key, buffer is not None))
        note(self, key, buffer)

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


def test_a_chunk_over_the_budget_is_split_along_the_window_dims(tmp_path):
    _empty_store(tmp_path / "big.zarr", 12, chunk=4)
    config = _config(
        tmp_path / "big.zarr", tmp_path, ["temperature"], window={"latitude": 1, "longitude": 2}, keep=["level"]
    )
    one_step = 37 * 4 * 8 * 4
    plan = make_plan(config, unit_budget_bytes=3 * one_step)  # one chunk (4 steps) does not fit
    time_ranges = {unit.ranges[0] for unit in plan.units}
    assert time_ranges == {(0, 4), (4, 8), (8, 12)}
    assert len(plan.units) > len(time_ranges)  # each chunk's positions split along latitude or longitude
    covered = sorted(position for unit in plan.units for position in _positions(unit))
    assert covered == sorted(set(covered)) and len(covered) == plan.num_samples


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
