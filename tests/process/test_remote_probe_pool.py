"""Remote probes in a pool of forked processes: the same probes as in this process, a file gone left to the full
look, and a pool whose processes are killed ending at once."""

from __future__ import annotations

import threading
import time
from concurrent.futures.process import BrokenProcessPool

import pytest
from remote_files import memory_netcdf_files, probe_key

from planning.formats.sources import ListedFile
from planning.inputs import probe


@pytest.fixture(scope="module")
def remote_files():
    yield from memory_netcdf_files()


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
    assert all(pooled) and [probe_key(p) for p in pooled] == [probe_key(p) for p in alone]
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
