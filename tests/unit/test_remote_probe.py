"""Remote probes hold a bounded batch of files' bytes at once, whatever the file count (fsspec's memory://)."""

from __future__ import annotations

import gc
import tracemalloc
import weakref

import fsspec
import pytest
from remote_files import memory_netcdf_files, probe_key

from planning.formats.remote_files import BlockReader, RemoteFile
from planning.formats.sources import ListedFile
from planning.inputs import probe

FILES = 24
BATCH = 3


@pytest.fixture(scope="module")
def remote_files():
    yield from memory_netcdf_files()


def _traced_peak(files) -> tuple[list, int]:
    gc.collect()
    tracemalloc.start()
    try:
        probes = probe.probe_remote(files, "time")
        return probes, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


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
    assert all(probes) and [probe_key(p) for p in probes] == [probe_key(p) for p in whole]
    # What files share is held once: each probe keeps only its own path and concat values.
    assert all(p.sizes is probes[0].sizes and p.concat_attrs is probes[0].concat_attrs for p in probes)
    assert requests == [2 * BATCH] * (FILES // BATCH)  # a head and a tail per file, a batch at a time
    fetched = probes[0].bytes_read  # each file's two ends, ~50 KB
    # All the files' ends held at once would be FILES x fetched (as the probe in one batch holds them); a batch's,
    # with parsing's copies and what a long test session has left around (a few hundred KB), is a fraction of it.
    assert peak < FILES * fetched / 2 and peak < whole_peak / 2, (peak, fetched, whole_peak)


def test_a_small_file_is_fetched_whole_in_one_request(monkeypatch):
    files = next(memory_netcdf_files(side=40))  # ~15 KB: its head and tail meet
    assert all(f.nbytes < 2 * probe.END_BYTES for f in files)
    ranges = []
    cat_ranges = type(fsspec.filesystem("memory")).cat_ranges
    monkeypatch.setattr(
        type(fsspec.filesystem("memory")),
        "cat_ranges",
        lambda fs, paths, starts, ends, **kwargs: (
            ranges.extend(zip(starts, ends)) or cat_ranges(fs, paths, starts, ends, **kwargs)
        ),
    )
    probes = probe.probe_remote(files, "time")
    monkeypatch.undo()
    assert all(probes) and ranges == [(0, f.nbytes) for f in files]  # one request a file, the whole file
    assert [p.bytes_read for p in probes] == [f.nbytes for f in files]
    monkeypatch.setattr(probe, "END_BYTES", 4096)  # ends that no longer meet: a head and a tail, as a large file's
    monkeypatch.setattr(probe, "_BLOCK", 1024)
    in_two = probe.probe_remote(files, "time")
    assert all(p.bytes_read < f.nbytes for p, f in zip(in_two, files))
    assert [probe_key(p)[:4] for p in probes] == [probe_key(p)[:4] for p in in_two]


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
