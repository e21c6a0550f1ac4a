"""Planning over gs:// reads each file's metadata by byte ranges: a few KB a file, never a whole file."""

from __future__ import annotations

import json

import fsspec
import numpy as np
import pytest
import xarray as xr

from planning.formats.sources import list_files
from planning.inputs.inventory import inspect_files, probe_files
from planning.inputs.metadata import inspect_file
from planning.inputs.probe import END_BYTES
from planning.inputs.probe_cache import load_probes, reuse_or_probe, save_probes

from conftest import BUCKET
from helpers import split_along_time

FORMATS = {"netcdf4": ("NETCDF4",), "classic": ("NETCDF3_64BIT", "NETCDF3_CLASSIC")}


def _same(remote, local):
    assert (remote.nbytes, remote.sizes, remote.variables) == (local.nbytes, local.sizes, local.variables)
    assert remote.coords.keys() == local.coords.keys()
    for dim, values in local.coords.items():
        assert remote.coords[dim].dtype == values.dtype, dim
        np.testing.assert_array_equal(remote.coords[dim], values)


@pytest.mark.parametrize("kind", sorted(FORMATS))
def test_remote_files_are_probed_from_a_few_kilobytes_and_equal_the_full_local_look(gcs, sample_file, tmp_path, kind):
    source = sample_file("TREFHT.B06.57.atm.1890-1999ANN.nc")
    local = split_along_time(source, tmp_path, 5, formats=FORMATS[kind], units="days since 1870-03-01 +{offset} days")
    for path in local:
        gcs.put_file(path, f"{BUCKET}/planning-{kind}/{path.rsplit('/', 1)[1]}")
    listed = list_files([f"gs://{BUCKET}/planning-{kind}/*.nc"])
    probes = probe_files(listed, "time")
    assert all(probes), "every file can be probed by byte ranges"
    assert all(0 < p.bytes_read <= 3 * END_BYTES for p in probes), [p.bytes_read for p in probes]
    assert all(p.bytes_read < listed[0].nbytes / 4 for p in probes)  # never the whole file
    for remote, path in zip(inspect_files(listed, "time", probes), local):
        _same(remote, inspect_file(path))


@pytest.mark.parametrize("name", ["uvt.nc", "eraint_uvz.nc", "TREFHT.B06.57.atm.1890-1999ANN.nc"])
def test_a_remote_classic_file_is_read_from_its_header_as_xarray_reads_it_locally(gcs, sample_file, name):
    path = sample_file(name)
    gcs.put_file(str(path), f"{BUCKET}/classic/{name}")
    remote = inspect_file(f"gs://{BUCKET}/classic/{name}")
    local = inspect_file(str(path))
    _same(remote, local)
    assert json.dumps(remote.coord_attrs, sort_keys=True) == json.dumps(local.coord_attrs, sort_keys=True)


def test_a_remote_object_rewritten_at_the_same_size_is_probed_again(gcs, tmp_path):
    written = []
    for seed in (1, 2):  # one size and structure, other values; whole numbers: no trailing CR or LF byte
        values = np.random.default_rng(seed).integers(0, 99, (3, 4)).astype("f4")
        ds = xr.Dataset({"t": (("time", "x"), values)}, coords={"time": np.arange(3.0) + 3 * seed})
        ds.to_netcdf(tmp_path / f"{seed}.nc", format="NETCDF3_64BIT")
        written.append(str(tmp_path / f"{seed}.nc"))
    url = f"gs://{BUCKET}/rewritten/a.nc"
    gcs.put_file(written[0], url)
    listed = list_files([url])
    cache = str(tmp_path / "out" / "_inventory.json")
    save_probes(cache, "time", zip(listed, probe_files(listed, "time")))
    assert reuse_or_probe(listed, load_probes(cache, "time"), lambda missing: missing)[0] is not None
    gcs.put_file(written[1], url)
    fsspec.filesystem("gs").invalidate_cache()  # another run lists afresh
    again = list_files([url])
    assert again[0].nbytes == listed[0].nbytes
    assert "generation=" in again[0].version and "crc32c=" in again[0].version
    probed = []
    reuse_or_probe(again, load_probes(cache, "time"), lambda missing: probed.extend(missing) or [None])
    assert probed == again


def test_a_pool_of_forked_processes_probes_gs_files_on_connections_of_its_own(gcs, sample_file, tmp_path, monkeypatch):
    """gcsfs keeps an event loop and open connections in the launcher, which a forked process must not use: each
    pool process makes its own (fsspec and gcsfs start afresh after a fork), and the probes equal this process's."""
    from planning.inputs import probe

    source = sample_file("TREFHT.B06.57.atm.1890-1999ANN.nc")
    local = split_along_time(source, tmp_path, 12, formats=("NETCDF4", "NETCDF3_64BIT"))
    for path in local:
        gcs.put_file(path, f"{BUCKET}/pooled/{path.rsplit('/', 1)[1]}")
    listed = list_files([f"gs://{BUCKET}/pooled/*.nc"])
    alone = probe.probe_remote(listed, "time")  # this process's loop and connections are open now
    monkeypatch.setattr(probe, "POOL_MIN_FILES", 4)
    monkeypatch.setattr(probe, "FILES_PER_TASK", 5)
    monkeypatch.setattr(probe, "pool_processes", lambda: 2)
    pooled = probe.probe_remote(listed, "time")
    assert all(alone) and {p.classic for p in alone} == {True, False}
    for one, other in zip(alone, pooled, strict=True):
        assert (one.path, one.fingerprint, one.sizes, one.bytes_read, one.classic) == (
            other.path,
            other.fingerprint,
            other.sizes,
            other.bytes_read,
            other.classic,
        )
        assert repr(one.concat_attrs) == repr(other.concat_attrs)  # (a NaN _FillValue equals no other NaN)
        np.testing.assert_array_equal(one.concat_raw, other.concat_raw)
    assert probe.probe_remote(listed, "time")[0].path == listed[0].path  # and this process's connections still work
