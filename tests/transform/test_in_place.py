"""WriteInPlace's steps called as a runner calls them: blocks in any order, the same shards; a short count commits none.

The build's own pipeline runs this stage end to end (tests/e2e); here its DoFn's lifecycle
(setup, process, teardown), the count merge and the commit are called directly, in orders a
runner may choose.
"""

from __future__ import annotations

import dataclasses
import errno
import io
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from planning.config import parse_config
from planning.plan import make_plan
from planning.run.disk import WRITEBACK, reserve_space
from planning.specs import compile_specs
from planning.write_strategy import WritePlan, WriteStrategy, lay_out
from schemas.errors import UserError
from schemas.example_codec import RecordRows
from schemas.record_decoder import ExampleDecoder
from schemas.shard_index import index_lines, scan_index
from schemas.tfrecord import read_records
from transforms.cut import cut_unit
from transforms.in_place import _WriteInPlaceFn, add_counts, check_disk_space, commit_shards, reserve_shards


@pytest.fixture
def planned(small_archive, tmp_path):
    config = {
        "input": {"paths": str(small_archive / "*.nc")},
        "variables": ["t", "q"],
        "sample": {"window": {"lat": 5, "lon": {"size": 6, "stride": 3}}, "keep": ["level"]},
        "output": {"path": str(tmp_path / "out"), "num_shards": 3},
    }
    plan = make_plan(parse_config(config), unit_budget_bytes=2e5)  # several units, each a block
    assert len(plan.units) > 3
    (tmp_path / "out").mkdir()  # as prepare_output leaves it
    write = WritePlan(WriteStrategy.IN_PLACE, "in place", str(tmp_path / "work"))
    specs = compile_specs(plan, lay_out(plan, write))
    blocks = [cut_unit(specs.cut, plan.sources, unit) for unit in plan.units]
    return plan, specs, blocks


def _write(spec, blocks) -> list[dict]:
    """What each block's process() yields, one DoFn instance over all of them, as one worker runs it."""
    write = _WriteInPlaceFn(spec)
    write.setup()
    try:
        return [part for block in blocks for part in write.process(block)]
    finally:
        write.teardown()


def test_blocks_in_any_order_write_the_same_shards_each_record_once(planned):
    plan, specs, blocks = planned
    shards = {}
    for order in (blocks, blocks[::-1], [blocks[i] for i in np.random.default_rng(1).permutation(len(blocks))]):
        parts = _write(specs.write, order)
        results = list(commit_shards(add_counts(parts[::-1]), specs.write))
        assert [r.records for r in results] == list(specs.write.layout.records)
        written = {r.file: (Path(specs.write.output) / r.file).read_bytes() for r in results}
        indexes = [r.index for r in results]  # each shard's .tfindex beside it
        assert sorted(p.name for p in Path(specs.write.output).iterdir()) == sorted(
            [*written, *indexes]
        )  # no temporary
        shards.setdefault("first", written)
        assert written == shards["first"]
    for result in results:  # the indexes come from the layout: they list what the shards' headers say
        data = shards["first"][result.file]
        walked = scan_index(lambda offset, size, d=data: d[offset : offset + size], len(data), result.records, "shard")
        assert (Path(specs.write.output) / result.index).read_bytes() == index_lines(walked.sizes)
    decoder = ExampleDecoder(plan.schema.features)
    seen = [
        tuple(int(decoder.decode(record)[f"index/{d}"]) for d in ("time", "lat", "lon"))
        for data in shards["first"].values()
        for record in read_records(io.BytesIO(data))  # every CRC checked
    ]
    assert len(seen) == len(set(seen)) == plan.num_samples


@pytest.mark.skipif(WRITEBACK._start is None, reason="no sync_file_range here (not Linux)")
def test_writers_hand_their_shards_to_the_disk_as_they_go_and_write_the_same_bytes(planned, monkeypatch):
    _, specs, blocks = planned
    shards = []
    for every in (2**62, 1):  # never handed, then after every block's bytes
        monkeypatch.setattr(WRITEBACK, "every", every)
        handed = WRITEBACK.handed
        parts = _write(specs.write, blocks)
        assert WRITEBACK.idle(timeout=60)
        handed = WRITEBACK.handed - handed
        results = list(commit_shards(add_counts(parts), specs.write))
        # each block's shards, at most (one still waiting for its turn when a later block wrote to it is handed once)
        assert handed == 0 if every > 1 else 0 < handed <= sum(len(part) for part in parts)
        shards.append({r.file: (Path(specs.write.output) / r.file).read_bytes() for r in results})
        for result in results:
            (Path(specs.write.output) / result.file).unlink()
            (Path(specs.write.output) / result.index).unlink()
    assert shards[0] == shards[1]


def test_shards_reserved_at_their_laid_out_size_are_written_and_committed_alike(planned, tmp_path):
    _, specs, blocks = planned
    plain = list(commit_shards(add_counts(_write(specs.write, blocks)), specs.write))
    shards = {r.file: (Path(specs.write.output) / r.file).read_bytes() for r in plain}
    for result in plain:
        (Path(specs.write.output) / result.file).unlink()
    if not reserve_space(str(tmp_path / "probe"), 4096):
        pytest.skip("this filesystem cannot allocate ahead (fallocate)")
    reserve_shards(specs.write)
    sizes = [Path(specs.write.temporary_shard_path(s)).stat() for s in range(len(specs.write.layout.bytes))]
    assert [stat.st_size for stat in sizes] == list(specs.write.layout.bytes)
    assert all(stat.st_blocks * 512 >= stat.st_size for stat in sizes)
    reserved = list(commit_shards(add_counts(_write(specs.write, blocks)), specs.write))
    assert {r.file: (Path(specs.write.output) / r.file).read_bytes() for r in reserved} == shards


def test_a_disk_that_filled_since_the_space_check_is_refused_in_one_line(planned, monkeypatch):
    _, specs, _ = planned

    def no_room(path, nbytes):
        raise OSError(errno.ENOSPC, "No space left on device", path)

    monkeypatch.setattr("transforms.in_place.reserve_space", no_room)
    with pytest.raises(UserError, match=r"/out: the shards need .* free; free some space, or write the output"):
        reserve_shards(specs.write)


def test_a_shard_short_of_its_laid_out_records_is_not_committed(planned):
    _, specs, blocks = planned
    parts = _write(specs.write, blocks[1:])  # a unit's block never arrived
    with pytest.raises(RuntimeError, match=r"records \(\d+ bytes\) written, \d+ \(\d+\) laid out; schema.json not"):
        list(commit_shards(add_counts(parts), specs.write))
    assert all(".tmp-" in p.name for p in Path(specs.write.output).iterdir())  # no shard under a final name


def test_a_record_longer_than_laid_out_is_refused_before_it_is_written(planned, monkeypatch):
    _, specs, blocks = planned
    encode = _WriteInPlaceFn(specs.write)
    encode.setup()
    original = type(encode._encoder).rows

    def one_byte_longer(self, columns, framed=True):
        records = original(self, columns, framed)
        rows, samples = records.arrays[0], records.samples[0]
        longer = np.concatenate([rows[:1], np.zeros((1, 1), np.uint8)], axis=1)
        return RecordRows(
            records.count, (longer, rows[1:], *records.arrays[1:]), (samples[:1], samples[1:], *records.samples[1:])
        )

    monkeypatch.setattr(type(encode._encoder), "rows", one_byte_longer)
    try:
        with pytest.raises(RuntimeError, match=r"is \d+ bytes framed, laid out as \d+; this is a bug"):
            list(encode.process(blocks[0]))
    finally:
        encode.teardown()
    assert [p.stat().st_size for p in Path(specs.write.output).iterdir()] == []  # nothing written


def test_the_disk_space_check_passes_a_layout_that_fits_and_refuses_one_that_does_not(planned):
    _, specs, _ = planned
    check_disk_space(specs.write)  # a few kB: fits
    free = shutil.disk_usage(specs.write.output).free
    layout = dataclasses.replace(specs.write.layout, bytes=(free // 2, free - free // 2 + 1))  # a byte too many
    pattern = rf"^{re.escape(specs.write.output)}: the shards need [\d.]+ [MG]B and the disk has [\d.]+ [MG]B free; "
    with pytest.raises(UserError, match=pattern + "free some space"):
        check_disk_space(dataclasses.replace(specs.write, layout=layout))
    assert [p.name for p in Path(specs.write.output).iterdir()] == []  # nothing written
