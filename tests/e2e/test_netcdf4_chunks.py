"""A build over a chunked, compressed NetCDF-4 file (three of five levels selected): the summary weighs the chunks
fetched against those needed, and TensorFlow's parser reads records equal to xarray's slices."""

from __future__ import annotations

import re

import numpy as np
import xarray as xr
import yaml
from netcdf4_chunked import LEVELS, write_chunked

from pipelines.build import main
from schemas import load_schema

from helpers import expected_feature, parse_with_generated_parser


def test_a_chunked_file_builds_reading_each_chunk_once(tmp_path, capsys):
    path = write_chunked(tmp_path / "a.nc")
    config = {
        "input": {"paths": str(path)},
        "variables": ["t", "q"],
        "sample": {"window": {"y": {"size": 5, "stride": 3}, "x": {"size": 4, "stride": 4}}, "keep": ["level"]},
        "select": {"level": [100 * i for i in LEVELS]},
        "output": {"path": str(tmp_path / "out"), "num_shards": 2},
    }
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    assert main(["--config", str(tmp_path / "config.yaml"), "--quiet"]) == 0
    out = capsys.readouterr().out
    found = re.search(r"read [\d.]+ MB from NetCDF-4 chunks for [\d.]+ MB of chunks needed \(([\d.]+)x", out)
    assert found and float(found.group(1)) <= 1.1, out
    schema = load_schema(str(tmp_path / "out"))
    records = parse_with_generated_parser(tmp_path / "out")
    with xr.open_dataset(path, decode_times=False) as ds:
        source = ds.isel(level=LEVELS).load()
    count = len(records["index/time"])
    assert count == schema.sample["num_samples"] == 6 * 6 * 3
    for i in range(count):
        record = {name: values[i] for name, values in records.items()}
        for feature in schema.variable_features:
            np.testing.assert_array_equal(record[feature.name], expected_feature(source, schema, feature.name, record))
