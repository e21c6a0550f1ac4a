"""Remote probes hold a bounded batch of files' bytes at once, whatever the file count (fsspec's memory://)."""

from __future__ import annotations

import gc
import threading
import time
import tracemalloc
import uuid
import weakref
from concurrent.futures.process import BrokenProcessPool

import fsspec
import numpy as np
import pytest
import xarray as xr

from planning.formats.remote_files import BlockReader, RemoteFile
from planning.formats.sources import ListedFile
from planning.inputs import probe

FILES = 24
BATCH = 3


@pytest.fixture(scope="module")
def remote_files():
    """FILES NetCDF-4 files of ~130 KB (probes fetch ~50 KB of each) in fsspec's in-memory filesystem."""
    fs = fsspec.filesystem("memory")
    folder = f"/probe-{uuid.uuid4().hex}"
    files = []
    for i in range(FILES):
        values = np.random.default_rng(i).normal(size=(1, 180, 180)).astype("f4")
        grid = {"lat": np.arange(180.0), "lon": np.arange(180.0)}
        ds = xr.Dataset({"t": (("time", "lat", "lon"), values)}, coords={"time": [float(i)], **grid})
        data = bytes(ds.to_netcdf(engine="h5netcdf"))
        fs.pipe(f"{folder}/{i:02d}.nc", data)
        fs.cat_file(f"{folder}/{i:02d}.nc", 0, 1)  # the store copies a file on its first read: not the probe's
        files.append(ListedFile(f"memory://{folder}/{i:02d}.nc", len(data), "v"))
    yield files
    fs.rm(folder, recursive=True)


def _traced_peak(files) -> tuple[list, int]:
    gc.collect()
    tracemalloc.start()
    try:
        probes = probe.probe_remote(files, "time")
        return probes, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def _key(found: probe.FileProbe) -> tuple:
    return found.path, found.fingerprint, found.sizes, found.concat_raw.tolist(), found.bytes_read


def test_remote_probes_hold_one_batch_of_files_bytes_at_a_time(remote_files, monkeypatch):
    whole, whole_peak = _traced_peak(remote_files)  # in one batch; h5py imported
    monkeypatch.setattr(probe, "FILES_PER_BATCH", BATCH)
    requests = []
    cat_ranges = type(fsspec.filesystem("memory")).cat_ranges
    monkeypatch.setattr(
        type(fsspec.filesystem("memory")),
        "cat_ranges",
        lambda fs, paths, *args, **kwargs: requests.append(len(paths)) or cat_ranges(fs, paths, *args, **kwargs),
    )
    probes, peak = _traced_peak(remote_files)
    assert all(probes) and [_key(p) for p in probes] == [_key(p) for p in whole]
    # What files share is held once: each probe keeps only its own path and concat values.
    assert all(p.sizes is probes[0].sizes and p.concat_attrs is probes[0].concat_attrs for p in probes)
    assert requests == [2 * BATCH] * (FILES // BATCH)  # a head and a tail per file, a batch at a time
    fetched = probes[0].bytes_read  # each file's two ends, ~50 KB
    # All the files' ends held at once would be FILES x fetched (as the probe in one batch holds them); a batch's,
    # with parsing's copies and what a long test session has left around (a few hundred KB), is a fraction of it.
    assert peak < FILES * fetched / 2 and peak < whole_peak / 2, (peak, fetched, whole_peak)


def test_a_file_gone_at_a_batch_boundary_is_left_to_the_full_look_and_the_rest_probed(remote_files, monkeypatch):
    monkeypatch.setattr(probe, "FILES_PER_BATCH", BATCH)
    gone = ListedFile(remote_files[BATCH - 1].path.replace(".nc", "-gone.nc"), remote_files[0].nbytes, "v")
    files = [*remote_files[: BATCH - 1], gone, *remote_files[BATCH - 1 : 2 * BATCH]]
    probes = probe.probe_remote(files, "time")
    assert probes[BATCH - 1] is None
    assert [p.path for p in probes if p is not None] == [f.path for f in files if f is not gone]


def test_a_block_reader_and_its_prefetched_bytes_go_with_their_last_reference(remote_files):
    """No reference cycle: planning makes one reader per file, and the cyclic GC may not run for thousands."""
    listed = remote_files[0]
    reader = BlockReader(RemoteFile(listed.path, listed.nbytes), 1024)
    reader.prefetch([(0, 2048)])
    reader.seek(4096)
    reader.read(10)  # a cached block
    gone = weakref.ref(reader)
    gc.disable()
    try:
        del reader
        assert gone() is None
    finally:
        gc.enable()


def _pooled(monkeypatch, files_per_task: int) -> list[int]:
    """Probe in a pool of 2 processes whatever the machine's cores; the task sizes map_in_pool was given."""
    monkeypatch.setattr(probe, "POOL_MIN_FILES", 4)
    monkeypatch.setattr(probe, "FILES_PER_TASK", files_per_task)
    monkeypatch.setattr(probe, "pool_processes", lambda: 2)
    tasks: list[int] = []
    real = probe.map_in_pool

    def counted(function, given, processes):
        tasks.extend(len(task) for task in given)
        return real(function, given, processes)

    monkeypatch.setattr(probe, "map_in_pool", counted)
    return tasks


def test_a_pool_of_processes_probes_remote_files_as_this_process_does(remote_files, monkeypatch):
    alone = probe.probe_remote(remote_files, "time")
    tasks = _pooled(monkeypatch, 5)
    pooled = probe.probe_remote(remote_files, "time")
    assert tasks == [5, 5, 5, 5, 4]  # (the in-memory store is the parent's, copied into each forked process)
    assert all(pooled) and [_key(p) for p in pooled] == [_key(p) for p in alone]
    # What files share is held once across tasks too, as in one process.
    assert all(p.sizes is pooled[0].sizes and p.concat_attrs is pooled[0].concat_attrs for p in pooled)


def test_a_file_gone_is_left_to_the_full_look_by_the_pool_and_the_rest_probed(remote_files, monkeypatch):
    _pooled(monkeypatch, 5)
    gone = ListedFile(remote_files[6].path.replace(".nc", "-gone.nc"), remote_files[0].nbytes, "v")
    files = [*remote_files[:6], gone, *remote_files[6:]]
    probes = probe.probe_remote(files, "time")
    assert probes[6] is None
    assert [p.path for p in probes if p is not None] == [f.path for f in remote_files]


def _stuck(files, concat_dim):
    """A pool process's probing that does not end before the test's limit (unless the process is killed)."""
    time.sleep(60)
    yield from ()


def test_a_pool_whose_processes_are_killed_ends_at_once(remote_files, monkeypatch):
    """A stopped build kills its child processes (pipelines.stopping): the probe ends with an error, leaving none."""
    import psutil

    _pooled(monkeypatch, 5)
    monkeypatch.setattr(probe, "_probe_batch", _stuck)  # (forked: the pool's processes run it too)
    me = psutil.Process()
    before = {child.pid for child in me.children()}

    def kill_the_pool():
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            pool = [child for child in me.children() if child.pid not in before]
            if len(pool) == 2:
                time.sleep(0.2)  # both at work on a task
                for child in pool:
                    child.kill()
                return
            time.sleep(0.01)

    killer = threading.Thread(target=kill_the_pool)
    killer.start()
    started = time.monotonic()
    with pytest.raises(BrokenProcessPool):
        probe.probe_remote(remote_files, "time")
    killer.join()
    assert time.monotonic() - started < 30
    assert {child.pid for child in me.children()} <= before
