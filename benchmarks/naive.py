"""The naive peer: what users write today, xbatcher patches -> tf.train.Example via FloatList -> tf.io.TFRecordWriter.

Samples are written in generator order, round-robin over the shards: no full shuffle, as in
most hand-written converters. It runs on the first ``--files`` files; the orchestrator scales
the measured rate to the full set.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from glob import glob
from pathlib import Path

from benchmarks.datasets import load_config

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def float_feature(tf, values):
    return tf.train.Feature(float_list=tf.train.FloatList(value=values.ravel()))


def int_feature(tf, values):
    return tf.train.Feature(int64_list=tf.train.Int64List(value=values.ravel()))


def patch_example(tf, sample, variables, first: dict[str, int]):
    """One patch as users build it: a FloatList per variable, plus position and coordinates."""
    feature = {name: float_feature(tf, sample[name].values) for name in variables}
    for dim, index in first.items():
        feature[f"index/{dim}"] = int_feature(tf, index)
    seconds = sample["time"].values.astype("datetime64[s]").astype("int64")
    feature["coord/time"] = int_feature(tf, seconds)
    feature["coord/lat"] = float_feature(tf, sample["lat"].values)
    feature["coord/lon"] = float_feature(tf, sample["lon"].values)
    return tf.train.Example(features=tf.train.Features(feature=feature))


def convert(config: dict, num_files: int) -> dict:
    """Write the patches of the first ``num_files`` files; returns counts and timings."""
    import numpy as np
    import tensorflow as tf
    import xarray as xr
    import xbatcher

    variables = list(config["variables"])
    size = config["sample"]["window"]["lat"]["size"]
    paths = sorted(glob(config["input"]["paths"]))[:num_files]
    num_shards = config["output"]["num_shards"]
    output = Path(config["output"]["path"])
    output.mkdir(parents=True, exist_ok=True)
    ready = time.perf_counter()
    ds = xr.open_mfdataset(paths, combine="by_coords")[variables]
    generator = xbatcher.BatchGenerator(ds, input_dims={"lat": size, "lon": size, "level": ds.sizes["level"]})
    lat_index, lon_index = ds.indexes["lat"], ds.indexes["lon"]
    names = [output / f"data-{i:05d}-of-{num_shards:05d}.tfrecord" for i in range(num_shards)]
    writers = [tf.io.TFRecordWriter(str(name)) for name in names]
    count = 0
    for batch in generator:
        first = {"lat": lat_index.get_loc(batch["lat"].values[0]), "lon": lon_index.get_loc(batch["lon"].values[0])}
        for step in range(batch.sizes["time"]):
            position = {"time": np.array(step), **{d: np.array(i) for d, i in first.items()}}
            example = patch_example(tf, batch.isel(time=step), variables, position)
            writers[count % num_shards].write(example.SerializeToString())
            count += 1
    for writer in writers:
        writer.close()
    return {
        "samples": count,
        "files": len(paths),
        "input_bytes": sum(Path(p).stat().st_size for p in paths),
        "output_bytes": sum(name.stat().st_size for name in names),
        "work_seconds": time.perf_counter() - ready,
    }


def main(argv: list[str] | None = None) -> int:
    started = time.perf_counter()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="the generated build config (patches)")
    parser.add_argument("--files", type=int, required=True, help="convert only the first N files")
    parser.add_argument("--result", required=True, help="where to write the result JSON")
    args = parser.parse_args(argv)
    result = convert(load_config(args.config), args.files)
    result["seconds_in_main"] = time.perf_counter() - started
    Path(args.result).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
