"""Probing files as twins of one probed through HDF5: the probes HDF5 gives, for files differing only in values."""

from __future__ import annotations

import dataclasses

import netCDF4
import numpy as np
import pytest

from planning.inputs import local_probe, probe_pool, twin_probe
from planning.inputs.local_probe import _probe_serially, probe_local


def _write(path, step: int, *, units="hours since 2000-01-01", lat_step=1.0, history=None, time_options=None, lat=4):
    """One NetCDF-4 file of 2 steps: t (time, lat, lon) stored plainly, a time coordinate, a lat grid."""
    with netCDF4.Dataset(path, "w") as nc:
        nc.createDimension("time", (time_options or {}).pop("size", 2))
        nc.createDimension("lat", lat)
        nc.createDimension("lon", 5)
        time = nc.createVariable("time", (time_options or {}).pop("dtype", "f8"), ("time",), **(time_options or {}))
        time.units = units
        time[:] = [2 * step, 2 * step + 1]
        nc.createVariable("lat", "f8", ("lat",))[:] = np.arange(lat) * lat_step
        t = nc.createVariable("t", "f4", ("time", "lat", "lon"))
        t[:] = np.random.default_rng(step).random((2, lat, 5))
        if history is not None:
            nc.history = history
    return str(path), path.stat().st_size


def _same(left, right) -> bool:
    one, other = dataclasses.asdict(left), dataclasses.asdict(right)
    raw = one.pop("concat_raw"), other.pop("concat_raw")
    same_raw = (raw[0] is None and raw[1] is None) or (
        raw[0].dtype == raw[1].dtype and np.array_equal(raw[0], raw[1]) and raw[0].flags.writeable
    )
    return same_raw and one == other


@pytest.fixture
def hdf5_probes(monkeypatch):
    """Counts the files probed through HDF5's API (the rest were twins)."""
    calls = []
    probe = local_probe._probe_open_hdf5

    def counted(*args, **kwargs):
        calls.append(args[2])
        return probe(*args, **kwargs)

    monkeypatch.setattr(local_probe, "_probe_open_hdf5", counted)
    return calls


def _check(files, hdf5_probes):
    """The probes of ``files`` in one process, and the files of them probed through HDF5; each equals HDF5's."""
    twins = _probe_serially("time", None, files)
    through_hdf5 = list(hdf5_probes)
    hdf5_probes.clear()
    alone = [probe_local(path, nbytes, "time") for path, nbytes in files]  # each through HDF5
    assert len(hdf5_probes) == len(files)
    assert all(_same(a, b) for a, b in zip(twins, alone))
    return twins, through_hdf5


def test_files_written_alike_are_probed_as_twins_and_equal_hdf5_probes(tmp_path, hdf5_probes):
    files = [_write(tmp_path / f"f{i}.nc", i) for i in range(6)]
    probes = _probe_serially("time", None, files)
    assert len(hdf5_probes) == 2  # the first two (the second makes the pattern); the others compared byte for byte
    hdf5_probes.clear()
    _check(files, hdf5_probes)
    assert [p.concat_raw.tolist() for p in probes] == [[2 * i, 2 * i + 1] for i in range(6)]
    assert len({p.layouts["t"][3] for p in probes}) == 6  # each file's own layout check


@pytest.mark.parametrize(
    "odd",
    [
        {"units": "hours since 2000-01-02"},  # an attribute of the same length, another value
        {"lat_step": 2.0},  # another grid, same size
        {"history": "made on Tuesday"},  # metadata the others lack
    ],
)
def test_a_file_differing_outside_its_values_is_probed_through_hdf5(tmp_path, hdf5_probes, odd):
    files = [_write(tmp_path / f"f{i}.nc", i) for i in range(4)]
    files.insert(3, _write(tmp_path / "odd.nc", 9, **odd))
    hdf5_probes.clear()
    probes, through_hdf5 = _check(files, hdf5_probes)
    assert files[3][0] in through_hdf5 and files[2][0] not in through_hdf5  # (the third: a twin)
    odd_probe, first = probes[3], probes[0]
    assert odd_probe.path.endswith("odd.nc")
    if "units" in odd:
        assert odd_probe.concat_attrs["units"] == odd["units"]
    if "lat_step" in odd:
        assert odd_probe.fingerprint != first.fingerprint


@pytest.mark.parametrize(
    "time_options",
    [
        {"dtype": np.dtype(">f8"), "endian": "big"},  # big-endian: held in native order, as HDF5 probes hold it
        {"size": None, "chunksizes": (1,)},  # unlimited: chunks in order
        {"zlib": True, "chunksizes": (2,)},  # compressed: only HDF5 decodes it, so no twins
    ],
)
def test_concat_coordinates_stored_otherwise_probe_as_hdf5_does(tmp_path, hdf5_probes, time_options):
    files = [_write(tmp_path / f"f{i}.nc", i, time_options=dict(time_options)) for i in range(4)]
    probes, through_hdf5 = _check(files, hdf5_probes)
    assert len(through_hdf5) == (4 if time_options.get("zlib") else 2)
    assert [p.concat_raw.tolist() for p in probes] == [[2 * i, 2 * i + 1] for i in range(4)]
    assert all(p.concat_raw.dtype.isnative for p in probes)


def test_archives_whose_files_all_differ_stop_being_compared(tmp_path, hdf5_probes, monkeypatch):
    files = [_write(tmp_path / f"f{i}.nc", i, history=f"file {i}") for i in range(8)]  # one size, other bytes
    made = []
    make = twin_probe.make_twin
    monkeypatch.setattr(twin_probe, "make_twin", lambda *args: made.append(args) or make(*args))
    hdf5_probes.clear()
    probes = _probe_serially("time", None, files)
    assert len(hdf5_probes) == 8 and len(made) == twin_probe.MAX_MISSES
    alone = [probe_local(path, nbytes, "time") for path, nbytes in files]
    assert all(_same(a, b) for a, b in zip(probes, alone))


def test_twins_are_probed_without_a_pool_of_processes(tmp_path, monkeypatch):
    files = [_write(tmp_path / f"f{i}.nc", i) for i in range(24)]
    monkeypatch.setattr(local_probe, "POOL_MIN_FILES", 4)
    monkeypatch.setattr(local_probe, "FILES_PER_TASK", 20)  # the first 20: 18 twins, so no pool for the rest

    def no_pool(*args, **kwargs):
        raise AssertionError("a pool was started for twins")

    monkeypatch.setattr(probe_pool, "ProcessPoolExecutor", no_pool)
    probes = local_probe.probe_local_files(files, "time")
    assert [p.concat_raw[0] for p in probes] == [2 * i for i in range(24)]
    files.insert(3, _write(tmp_path / "odd.nc", 99, units="hours since 2000-01-02"))  # 15 twins of 20: a pool
    with pytest.raises(AssertionError, match="a pool was started"):
        local_probe.probe_local_files(files, "time")


def test_files_of_sizes_of_their_own_make_no_patterns(tmp_path, monkeypatch):
    """Each file its own size (as compressed files are): all probed through HDF5, no pattern made or held."""
    files = [_write(tmp_path / f"f{i}.nc", i, lat=4 + 100 * i) for i in range(6)]
    made = []
    monkeypatch.setattr(twin_probe, "make_twin", lambda *args: made.append(args))
    twins = twin_probe.Twins()
    probes = _probe_serially("time", None, files, twins)
    assert made == [] and twins.matched == 0 and all(p is not None for p in probes)
