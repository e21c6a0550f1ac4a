"""A rerun trusts the output's _inventory.json only where it still describes the files: records stay right."""

from __future__ import annotations

import os

import numpy as np
import pandas as pd
import xarray as xr

from pipelines.build import main
from schemas import load_schema

from helpers import build_quietly, expected_feature, load_virtual_dataset, read_all_records


def _write(path, names, seed: int, day: int) -> None:
    """Plainly stored variables (read by offset), defined in the order of ``names``."""
    rng = np.random.default_rng(seed)
    data = {name: (("time", "lat", "lon"), rng.normal(280, 5, (2, 3, 4)).astype("f4")) for name in names}
    times = pd.date_range("2000-01-01", periods=2, freq="D") + pd.Timedelta(days=2 * day)
    xr.Dataset(data, coords={"time": times, "lat": np.arange(3.0), "lon": np.arange(4.0)}).to_netcdf(path)


def _assert_records_right(output, paths) -> None:
    schema = load_schema(str(output))
    records = read_all_records(output, schema)
    source = load_virtual_dataset(paths, "time")
    for i in range(len(records["t"])):
        record = {key: values[i] for key, values in records.items()}
        for name in ("t", "u"):
            np.testing.assert_array_equal(record[name], expected_feature(source, schema, name, record), err_msg=name)


def test_a_rerun_after_a_same_size_replacement_with_copied_times_writes_the_right_records(tmp_path):
    archive = tmp_path / "in"
    archive.mkdir()
    for day in range(3):
        _write(archive / f"d{day}.nc", ["t", "u"], day, day)
    paths = sorted(str(p) for p in archive.glob("*.nc"))
    config = {
        "input": {"paths": str(archive / "*.nc")},
        "variables": ["t", "u"],
        "sample": {"window": {"lat": 3, "lon": 4}},
        "output": {"path": str(tmp_path / "out")},
    }
    output = build_quietly(config, tmp_path)
    # d1 replaced as cp -p or rsync -t would leave it: same size and times, u now where t was.
    before = os.stat(archive / "d1.nc")
    _write(tmp_path / "new.nc", ["u", "t"], 7, 1)
    os.replace(tmp_path / "new.nc", archive / "d1.nc")
    os.utime(archive / "d1.nc", ns=(before.st_atime_ns, before.st_mtime_ns))
    assert os.path.getsize(archive / "d1.nc") == before.st_size
    path = tmp_path / "config.yaml"  # as build_quietly wrote it
    assert main(["--config", str(path), "--quiet", "--overwrite"]) == 0
    _assert_records_right(output, paths)
