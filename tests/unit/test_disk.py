"""The disk under shards written in place: space reserved up front; files handed to the disk as their bytes
accumulate, never created or waited for."""

from __future__ import annotations

import errno
import sys

import pytest

from planning.run.disk import Writeback, reserve_space

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="sync_file_range is Linux's")


def test_a_file_is_handed_each_time_its_unhanded_bytes_reach_the_threshold(tmp_path):
    writeback = Writeback(every=100)
    shard, other = tmp_path / "shard", tmp_path / "other"
    shard.write_bytes(b"x" * 300)
    other.write_bytes(b"y" * 300)
    handed = []
    for path, nbytes in [(shard, 60), (other, 99), (shard, 60), (shard, 30), (shard, 99), (other, 1)]:
        writeback.wrote(str(path), nbytes)
        assert writeback.idle(timeout=30)
        handed.append(writeback.handed)
    # shard: 60+60 (handed), 30+99 (handed); other: 99+1 (handed)
    assert handed == [0, 0, 1, 1, 2, 3]
    assert shard.read_bytes() == b"x" * 300 and other.read_bytes() == b"y" * 300


def test_a_file_gone_before_its_turn_is_not_created_and_fails_nothing(tmp_path):
    writeback = Writeback(every=1)
    gone = tmp_path / "removed-by-a-stopped-build"
    writeback.wrote(str(gone), 10)
    assert writeback.idle(timeout=30)
    assert not gone.exists() and writeback.handed == 0
    (tmp_path / "later").write_bytes(b"z")
    writeback.wrote(str(tmp_path / "later"), 10)  # the thread still serves
    assert writeback.idle(timeout=30) and writeback.handed == 1


def test_nothing_is_handed_below_the_threshold_and_no_thread_starts(tmp_path):
    writeback = Writeback(every=1000)
    (tmp_path / "small").write_bytes(b"s")
    writeback.wrote(str(tmp_path / "small"), 999)
    assert writeback.idle(timeout=1) and writeback.handed == 0 and writeback._thread is None


def test_space_is_reserved_at_the_size_asked_without_truncating_what_is_there(tmp_path):
    shard = tmp_path / "shard"
    shard.write_bytes(b"written first")
    if not reserve_space(str(shard), 10 * 2**20):
        pytest.skip("this filesystem cannot allocate ahead (fallocate)")
    assert shard.stat().st_size == 10 * 2**20 and shard.stat().st_blocks * 512 >= 10 * 2**20
    assert shard.read_bytes()[:13] == b"written first" and not any(shard.read_bytes()[13:])
    assert not reserve_space(str(tmp_path / "empty"), 0) and not (tmp_path / "empty").exists()


def test_a_reservation_the_disk_has_no_room_for_raises_enospc_and_gives_back_what_it_took(tmp_path, monkeypatch):
    """ext4 keeps the blocks it allocated before it ran out: they are given back. (The kernel's ENOSPC is stood in
    for: a real one takes every free block of the disk, on a machine others share, until it is given back.)"""
    import ctypes

    from planning.run import disk

    if disk._fallocate is None or not reserve_space(str(tmp_path / "probe"), 4096):
        pytest.skip("this filesystem cannot allocate ahead (fallocate)")
    real = disk._fallocate
    calls = []

    def runs_out(descriptor, mode, offset, length):
        calls.append(mode)
        if mode:  # giving back: the real call
            return real(descriptor, mode, offset, length)
        real(descriptor, 0, 0, 8 * 2**20)  # what ext4 had allocated when the disk filled
        ctypes.set_errno(errno.ENOSPC)
        return -1

    monkeypatch.setattr(disk, "_fallocate", runs_out)
    shard = tmp_path / "shard"
    with pytest.raises(OSError) as raised:
        reserve_space(str(shard), 64 * 2**20)
    assert raised.value.errno == errno.ENOSPC and raised.value.filename == str(shard)
    assert shard.stat().st_size == 0 and shard.stat().st_blocks == 0 and len(calls) == 2
