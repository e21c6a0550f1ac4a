"""Writing records in place and writing them through bucket files give the same bytes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from pipelines.build import main
from schemas import Reader, load_schema, open_source
from schemas.shard_index import index_name
from schemas.tfrecord import read_records

SAMPLES = {
    "patches": {"window": {"lat": 9, "lon": 9}, "keep": ["level"]},
    "pairs across files": {"window": {"lat": 5, "lon": 6}, "offsets": {"time": [0, 1]}, "keep": ["level"]},
    "series, strided": {"window": {"time": {"size": 5, "stride": 2}}},
}


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_in_place_equals_buckets(small_archive, tmp_path, name):
    outputs = {}
    for in_place in (True, False):
        output = tmp_path / f"in_place_{in_place}"
        config = {
            "input": {"paths": str(small_archive / "*.nc")},
            "variables": ["t", "q"],
            "sample": SAMPLES[name],
            "splits": {"train": {"time": ["2020-01-01", "2020-01-02T06"]}, "test": {"time": ["2020-01-02T12", None]}},
            "shuffle": {"seed": 3},
            "output": {"path": str(output), "num_shards": 3, "in_place": in_place},
        }
        path = tmp_path / f"{in_place}.yaml"
        path.write_text(yaml.safe_dump(config))
        assert main(["--config", str(path), "--quiet"]) == 0
        outputs[in_place] = output
    schema = load_schema(str(outputs[True]))
    files = [shard.file for shards in schema.splits.values() for shard in shards]
    assert len(files) == 6 and schema.num_examples() > 0
    for file in files:
        assert (outputs[True] / file).read_bytes() == (outputs[False] / file).read_bytes(), file
        # Each shard's index, as each path writes it: one line per record, where its framing says it is.
        with open(outputs[True] / file, "rb") as stream:
            sizes = [len(record) + 16 for record in read_records(stream)]
        offsets = [sum(sizes[:i]) for i in range(len(sizes))]
        expected = "".join(f"{o} {s}\n" for o, s in zip(offsets, sizes)).encode()
        for output in outputs.values():
            assert (output / index_name(file)).read_bytes() == expected, (output, file)
    source, reader = open_source(str(outputs[False]), "train"), list(Reader(str(outputs[False]), "train"))
    for i in (0, len(reader) // 2, len(reader) - 1):
        assert all(np.array_equal(source[i][k], reader[i][k]) for k in reader[i]), i
    assert sorted(p.name for p in Path(outputs[True]).iterdir()) == sorted(
        p.name for p in Path(outputs[False]).iterdir()
    )  # no temporary shards or layout files left behind


def test_a_shard_no_sample_falls_into_is_written_empty_in_place_as_through_buckets(small_archive, tmp_path):
    """The in-place stage creates each shard as its first record comes: one that gets none is created at commit."""
    outputs = {}
    for in_place in (True, False):
        output = tmp_path / f"in_place_{in_place}"
        config = {
            "input": {"paths": str(small_archive / "*.nc")},
            "variables": ["t"],
            "sample": {"window": {"lat": 20, "lon": 24}, "keep": ["level"]},  # one sample a step: 12
            "output": {"path": str(output), "num_shards": 12, "in_place": in_place},
        }
        path = tmp_path / f"{in_place}.yaml"
        path.write_text(yaml.safe_dump(config))
        assert main(["--config", str(path), "--quiet"]) == 0
        outputs[in_place] = {shard.file: shard.examples for shard in load_schema(str(output)).splits["data"]}
        for file in outputs[in_place]:
            assert (output / file).exists(), file
    assert outputs[True] == outputs[False] and 0 in outputs[True].values() and sum(outputs[True].values()) == 12
