"""Planning over gs:// reads each file's metadata by byte ranges: a few KB a file, never a whole file."""

from __future__ import annotations

import json

import numpy as np
import pytest

from planning.inventory import inspect_files, probe_files
from planning.metadata import inspect_file
from planning.probe import END_BYTES
from planning.sources import list_files

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
