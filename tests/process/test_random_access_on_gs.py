"""Random access to a split on gs:// (the storage emulator, a process of its own): ranged requests, no index refused."""

from __future__ import annotations

import pytest
from synthetic_output import FEATURES, make_columns, write_output

from schemas import open_source
from schemas.errors import UserError

from conftest import BUCKET
from helpers import assert_same


def test_a_split_on_cloud_storage_reads_by_ranged_requests(tmp_path, gcs):
    """gs:// (the storage emulator): the same samples, each run of records one ranged request; no index, one line."""
    write_output(tmp_path / "out", make_columns(FEATURES, 19), [12, 7])
    for path in (tmp_path / "out").iterdir():
        gcs.put(str(path), f"{BUCKET}/ra/out/{path.name}")
    local, remote = open_source(str(tmp_path / "out")), open_source(f"gs://{BUCKET}/ra/out")
    indices = [18, 0, 1, 2, 13, 5]
    for a, b in zip(local.__getitems__(indices), remote.__getitems__(indices)):
        assert_same(a, b)
    assert_same(remote[7], local[7])
    assert remote.records([3, 4]) == local.records([3, 4])
    gcs.rm(f"{BUCKET}/ra/out/data-00001-of-00002.tfrecord.tfindex")
    with pytest.raises(UserError, match=r"data-00001-of-00002.tfrecord.tfindex is missing: random access needs"):
        open_source(f"gs://{BUCKET}/ra/out")[15]
