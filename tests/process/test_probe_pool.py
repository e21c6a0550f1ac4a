"""The local probe's pool of processes: many files probed in worker processes give what one process gives."""

from __future__ import annotations

import numpy as np

from pipelines.demo import ArchiveShape, write_archive
from planning.inputs.local_probe import probe_local_files


def test_a_pool_of_processes_probes_as_one_process_does(tmp_path, monkeypatch):
    write_archive(tmp_path, ArchiveShape(num_files=12, steps_per_file=2, levels=1, lat=4, lon=5), seed=0)
    paths = [(str(path), path.stat().st_size) for path in sorted(tmp_path.glob("*.nc"))]
    serial = probe_local_files(paths, "time")
    monkeypatch.setattr("planning.inputs.local_probe.POOL_MIN_FILES", 4)
    monkeypatch.setattr("planning.inputs.local_probe.FILES_PER_TASK", 5)
    monkeypatch.setattr("planning.inputs.local_probe.TWINS_FOR_NO_POOL", 2.0)  # a pool even for twins
    pooled = probe_local_files(paths, "time")
    assert len(pooled) == len(serial) == 12
    for one, other in zip(serial, pooled):
        assert (one.path, one.fingerprint, one.sizes, one.concat_attrs) == (
            other.path,
            other.fingerprint,
            other.sizes,
            other.concat_attrs,
        )
        np.testing.assert_array_equal(one.concat_raw, other.concat_raw)
