"""The run's files for the workers: loaded once per process, checked against planning's digest; positions round-trip."""

from __future__ import annotations

import numpy as np
import pytest

from planning.positions import Positions
from planning.run.run_files import RunFile, load_once
from planning.sampling import Axis, SampleGrid
from schemas.errors import UserError


def test_a_run_file_is_read_once_per_process_and_checked(tmp_path):
    path = tmp_path / "units.npz"
    path.write_bytes(b"planned bytes")
    file = RunFile.of(str(path), b"planned bytes")
    reads = []

    def read(url):
        reads.append(url)
        return open(url, "rb").read()

    assert load_once(file, read, bytes.upper) == b"PLANNED BYTES"
    assert load_once(file, read, bytes.upper) == b"PLANNED BYTES"
    assert reads == [str(path)]  # every DoFn set up after the first shares it
    path.write_bytes(b"planted bytes")
    other = RunFile.of(str(path), b"planned bytes!")  # the same place, another digest: read again, and refused
    with pytest.raises(UserError, match=r"units.npz: not the file this run saved for its workers") as error:
        load_once(other, read, bytes.upper)
    assert "\n" not in str(error.value)


def test_positions_travel_hollow_and_are_filled_from_their_bytes():
    grid = SampleGrid((Axis.iterate("time", 6), Axis.window("lat", 5, 2, 1)))
    coords = {"time": np.arange(6, dtype=np.int64) * 3600, "lat": np.linspace(0, 1, 5, dtype=np.float32)}
    positions = Positions(grid, "time", np.array([0, 0, 1, -1, 1, 0], dtype=np.int16), coords)
    where = [np.array([0, 3, 5]), np.array([1, 2, 3])]
    hollow = positions.hollow()
    with pytest.raises(RuntimeError, match="before their arrays were loaded"):
        hollow.split_labels(where)
    filled = hollow.filled(positions.to_bytes())
    assert filled.split_labels(where).tolist() == [0, -1, 0]
    for name, (dims, values) in positions.columns(where).items():
        assert filled.columns(where)[name][0] == dims
        np.testing.assert_array_equal(filled.columns(where)[name][1], values)
