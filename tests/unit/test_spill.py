"""Spill objects: a block's buckets in one object, fetched back by reference, checked against what was written."""

from __future__ import annotations

import numpy as np
import pytest

from schemas.errors import UserError
from transforms.buckets.blobs import bucket_pieces, unpack_bucket
from transforms.buckets.sorting import SortedBuckets
from transforms.buckets.spill import RANGES_IN_FLIGHT, fetch_spilled, spill_buckets


def _buckets(shards: int, records: int = 5) -> list[tuple[int, list[bytes]]]:
    rng = np.random.default_rng(shards)
    return [
        (shard, bucket_pieces(rng.integers(0, 2**60, records), [(bytes([shard]) * (i + 1),) for i in range(records)]))
        for shard in range(0, 2 * shards, 2)
    ]


def test_a_blocks_buckets_go_to_one_object_and_come_back_as_they_were(tmp_path):
    buckets = _buckets(shards=3)
    references = spill_buckets(str(tmp_path / "spill"), unit=7, piece=1, buckets=buckets)
    assert [shard for shard, _ in references] == [0, 2, 4]
    assert {r.url for _, r in references} == {str(tmp_path / "spill" / "unit-000007-1.spill")}
    fetched = list(fetch_spilled([r for _, r in references], batch_bytes=1))
    assert fetched == [b"".join(pieces) for _, pieces in buckets]
    for blob in fetched:
        unpack_bucket(blob)  # (each range is a whole bucket)


def test_fetches_come_in_batches_of_bounded_bytes_and_ranges(tmp_path, monkeypatch):
    buckets = _buckets(shards=RANGES_IN_FLIGHT + 5)
    references = [r for _, r in spill_buckets(str(tmp_path), unit=0, piece=0, buckets=buckets)]
    import fsspec.implementations.local as local

    sizes = []
    original = local.LocalFileSystem.cat_ranges

    def counted(self, paths, starts, ends, **kwargs):
        sizes.append(sum(e - s for s, e in zip(starts, ends)))
        assert len(paths) <= RANGES_IN_FLIGHT
        return original(self, paths, starts, ends, **kwargs)

    monkeypatch.setattr(local.LocalFileSystem, "cat_ranges", counted)
    biggest = max(r.nbytes for r in references)
    fetched = list(fetch_spilled(references, batch_bytes=3 * biggest))
    assert fetched == [b"".join(pieces) for _, pieces in buckets]
    assert len(sizes) > 1 and max(sizes) <= 3 * biggest


def test_a_spill_object_cut_short_or_changed_fails_in_one_line_naming_it(tmp_path):
    references = [r for _, r in spill_buckets(str(tmp_path), unit=3, piece=0, buckets=_buckets(shards=2))]
    path = tmp_path / "unit-000003.spill"
    data = path.read_bytes()
    path.write_bytes(data[:-3])  # the last bucket ends early
    with pytest.raises(UserError, match=r"unit-000003\.spill: .* bytes at .*_tmp/ were changed: rerun the build"):
        list(fetch_spilled(references, batch_bytes=2**20))
    path.unlink()
    with pytest.raises(UserError, match=r"unit-000003\.spill: the spill object could not be read"):
        list(fetch_spilled(references, batch_bytes=2**20))
    # The same size, other bytes: the bucket's own checks refuse it before any record is read.
    path.write_bytes(b"\0" * len(data))
    with SortedBuckets(2**20) as buckets, pytest.raises(ValueError, match="not a bucket"):
        for blob in fetch_spilled(references, batch_bytes=2**20):
            buckets.add_blob(blob, name=f"{path}")
