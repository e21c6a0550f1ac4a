"""Our .tfindex is the tfrecord package's index; TensorFlow reads a split in each epoch's global order through it."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from synthetic_output import FEATURES, make_columns, write_output

from schemas import Reader, epoch_order, load_dataset, open_source
from schemas.errors import UserError
from schemas.shard_index import index_name

SHARDS = [9, 0, 14]


@pytest.fixture(scope="module")
def output(tmp_path_factory):
    path = tmp_path_factory.mktemp("interop") / "out"
    write_output(path, make_columns(FEATURES, sum(SHARDS)), SHARDS)
    return path


#: The tfrecord package registers TensorFlow's Example protos under the same names: it runs in a process of its own.
TFRECORD_PACKAGE = """
import json, sys
from tfrecord import reader
from tfrecord.tools.tfrecord2idx import create_index
shard, index, theirs = sys.argv[1:]
create_index(shard, theirs)
empty = not open(index, "rb").read()  # the package cannot split an empty shard
load = reader.tfrecord_loader
parts = [] if empty else [list(load(shard, index, {"index/time": "int"}, shard=(i, 3))) for i in range(3)]
print(json.dumps([[int(r["index/time"][0]) for r in part] for part in parts]))
"""


def test_our_index_is_what_tfrecord2idx_writes_and_the_tfrecord_package_reads_by_it(output, tmp_path):
    for shard in sorted(output.glob("*.tfrecord")):
        run = subprocess.run(
            [
                sys.executable,
                "-c",
                TFRECORD_PACKAGE,
                str(shard),
                str(output / index_name(shard.name)),
                str(tmp_path / "i"),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        assert (output / index_name(shard.name)).read_bytes() == (tmp_path / "i").read_bytes(), shard.name
        # The package splits a shard by our index: the parts hold every record once, in order.
        parts = json.loads(run.stdout)
        number = int(shard.name.split("-")[1])
        first = sum(SHARDS[:number])
        assert [i for part in parts for i in part] == list(range(first, first + SHARDS[number]))


def test_tensorflow_reads_each_epoch_in_its_global_order(output):
    expected = [int(s["index/time"]) for s in Reader(str(output))]
    n = len(expected)
    for epoch in (0, 1):
        batches = list(load_dataset(str(output), batch_size=5, epoch=epoch, seed=4))
        seen = np.concatenate([b["index/time"].numpy() for b in batches]).tolist()
        assert seen == [expected[i] for i in epoch_order(n, 4, epoch)]
        assert [len(b["index/time"]) for b in batches] == [5, 5, 5, 5, 3]
        t = np.concatenate([b["t"].numpy() for b in batches])
        np.testing.assert_array_equal(t, np.stack([open_source(str(output))[i]["t"] for i in epoch_order(n, 4, epoch)]))


def test_the_global_order_refuses_packed_records_and_sequential_options(tmp_path, output):
    write_output(tmp_path / "packed", make_columns(FEATURES, 6), [6], examples_per_record=2)
    with pytest.raises(UserError, match="records hold 2 samples each"):
        load_dataset(str(tmp_path / "packed"), epoch=0)
    with pytest.raises(UserError, match="shuffle_buffer do not apply to a global order"):
        load_dataset(str(output), epoch=0, shuffle_buffer=10)
    with pytest.raises(
        UserError, match=r"load_dataset\(seed=\.\.\.\): -1 is outside 0\.\.2"
    ):  # was the order of seed 2**64 - 1
        load_dataset(str(output), epoch=0, seed=-1)
    with pytest.raises(UserError, match=r"load_dataset\(epoch=\.\.\.\): True is not a whole number"):
        load_dataset(str(output), epoch=True)
