"""Random access: source[i] is the Reader's i-th sample; indexes and records are checked; Grain and pickling work."""

from __future__ import annotations

import pickle

import pytest
from synthetic_output import FEATURES, make_columns, write_output

from schemas import Reader, open_source
from schemas.errors import UserError
from schemas.shard_index import index_name
from schemas.tfrecord import CorruptRecordError

from helpers import assert_same

SHARDS = [7, 0, 12, 5]  # an empty shard among them


@pytest.fixture(params=[1, 3], ids=["plain", "packed 3"])
def output(request, tmp_path):
    write_output(tmp_path / "out", make_columns(FEATURES, sum(SHARDS)), SHARDS, examples_per_record=request.param)
    return tmp_path / "out"


def test_every_sample_by_position_equals_the_readers_in_file_order(output):
    expected = list(Reader(str(output)))
    source = open_source(str(output))
    assert len(source) == len(expected) == sum(SHARDS)
    for i, sample in enumerate(expected):
        assert_same(source[i], sample)
        assert int(source[i]["index/time"]) == i
    assert_same(source[-1], expected[-1])
    with pytest.raises(IndexError, match="sample 24 is outside the split's 24 samples"):
        source[24]


def test_a_batch_in_any_order_with_repeats_reads_each_run_once(output, monkeypatch):
    source = open_source(str(output))
    reads = []
    read_ranges = source._read_ranges
    monkeypatch.setattr(source, "_read_ranges", lambda *args: reads.append(args) or read_ranges(*args))
    indices = [20, 3, 4, 5, 3, 23, 0, 21]
    batch = source.__getitems__(indices)
    assert [int(s["index/time"]) for s in batch] == indices
    # Shard 0 holds samples 0-6, shard 3 samples 19-23: samples 3-5 (and 0) and 20-23 are runs of records.
    assert [number for number, *_ in reads] == [0, 3]
    assert sum(len(offsets) for _, offsets, _ in reads) <= 4


def test_without_an_index_a_local_shard_is_walked_and_gives_the_same(output):
    with_index = open_source(str(output))
    for path in output.glob("*.tfindex"):
        path.unlink()
    without = open_source(str(output))
    for i in range(len(with_index)):
        assert_same(without[i], with_index[i])


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda lines: lines[1:], "6 lines for a shard of 7 records"),
        (lambda lines: [lines[1], lines[0], *lines[2:]], "line 1 (.*) does not follow the record before it"),
        (lambda lines: [b"0 -5", *lines[1:]], "line 1 .* does not follow"),
        (lambda lines: [b"zero one", *lines[1:]], "not an index"),
        (lambda lines: [*lines[:-1], lines[-1].split()[0] + b" 99999"], "its records end at byte"),
    ],
)
def test_an_edited_index_is_refused_before_its_offsets_are_read(tmp_path, edit, message):
    write_output(tmp_path / "out", make_columns(FEATURES, 7), [7])
    index = tmp_path / "out" / index_name("data-00000-of-00001.tfrecord")
    index.write_bytes(b"\n".join(edit(index.read_bytes().splitlines())) + b"\n")
    with pytest.raises(CorruptRecordError, match=rf"data-00000-of-00001.tfrecord.tfindex: {message}"):
        open_source(str(tmp_path / "out"))[0]


def test_a_damaged_record_names_the_shard_and_the_record(tmp_path):
    write_output(tmp_path / "out", make_columns(FEATURES, 7), [7])
    shard = tmp_path / "out" / "data-00000-of-00001.tfrecord"
    offset, size = map(int, (tmp_path / "out" / index_name(shard.name)).read_bytes().splitlines()[4].split())
    data = bytearray(shard.read_bytes())
    data[offset + size // 2] ^= 0x40
    shard.write_bytes(bytes(data))
    source = open_source(str(tmp_path / "out"))
    assert_same(source[3], list(Reader(str(tmp_path / "out"), verify=False))[3])
    with pytest.raises(CorruptRecordError, match=r"data-00000-of-00001.tfrecord: record 4: data CRC mismatch"):
        source[4]


def test_gzip_shards_are_refused_in_one_line(tmp_path):
    write_output(tmp_path / "out", make_columns(FEATURES, 5), [5], compression="gzip")
    with pytest.raises(UserError, match="gzip-compressed, which cannot be read at an offset; build it with output"):
        open_source(str(tmp_path / "out"))


def test_it_pickles_small_and_reopens_its_files_where_it_is_unpickled(output):
    source = open_source(str(output))
    source[0]  # opens a shard and loads its index
    data = pickle.dumps(source)
    assert len(data) < 8_000
    copy = pickle.loads(data)
    assert not copy._files and not copy._indexes
    assert_same(copy[10], source[10])


def test_grain_reads_it_as_a_random_access_source(output):
    import grain  # in the test extra

    expected = list(Reader(str(output)))
    dataset = grain.MapDataset.source(open_source(str(output))).shuffle(seed=3).batch(5)
    seen = [int(i) for batch in dataset for i in batch["index/time"]]
    assert sorted(seen) == list(range(len(expected))) and seen != sorted(seen)
    first = dataset[0]
    for row, i in enumerate(first["index/time"]):
        assert_same({k: v[row] for k, v in first.items()}, expected[int(i)])


def test_an_index_that_tiles_the_shard_but_lies_is_caught_by_the_read_and_by_verify(tmp_path):
    from schemas.shard_index import index_lines
    from schemas.verify import VerifyError, verify_output

    write_output(tmp_path / "out", make_columns(FEATURES, 7), [7])
    (tmp_path / "out" / "parser.py").write_text("")  # verify wants every file a build writes
    verify_output(str(tmp_path / "out"))
    index = tmp_path / "out" / index_name("data-00000-of-00001.tfrecord")
    sizes = [int(line.split()[1]) for line in index.read_bytes().splitlines()]
    first, second = next((i, j) for i in range(7) for j in range(i + 1, 7) if sizes[i] != sizes[j])
    sizes[first], sizes[second] = sizes[second], sizes[first]
    index.write_bytes(index_lines(sizes))  # the records' sizes swapped: still from byte 0 to the end
    with pytest.raises(CorruptRecordError, match=rf"data-00000-of-00001.tfrecord: record {first}: "):
        open_source(str(tmp_path / "out"))[first]
    with pytest.raises(VerifyError, match=rf"tfindex: line {first + 1} says record {first} is \d+ bytes, the shard"):
        verify_output(str(tmp_path / "out"))
    index.unlink()
    with pytest.raises(VerifyError, match=r"data-00000-of-00001.tfrecord.tfindex: missing, but schema.json lists it"):
        verify_output(str(tmp_path / "out"))
