"""The file helpers the stages and the driver share: atomic writes, removal that stays inside its folder."""

from __future__ import annotations

import errno
import os

import numpy as np
import pytest
from apache_beam.io.filesystems import FileSystems

from schemas.errors import UserError
from transforms.files import read_bytes, remove_if_empty, remove_tree, write_atomically


def test_write_atomically_keeps_every_byte_in_order_when_it_joins_small_writes(tmp_path):
    rng = np.random.default_rng(0)
    sizes = [int(n) for n in rng.integers(1, 70_000, 400)] + [9 * 2**20] + [5, 3]  # ~14 MB small, one big
    chunks = [rng.integers(0, 256, n, dtype=np.uint8).tobytes() for n in sizes]
    path = str(tmp_path / "shard.tfrecord")
    assert write_atomically(path, iter(chunks)) == sum(sizes)
    assert (tmp_path / "shard.tfrecord").read_bytes() == b"".join(chunks)
    assert [p.name for p in tmp_path.iterdir()] == ["shard.tfrecord"]  # the temporary name is gone


@pytest.mark.parametrize("failing", ["write", "close", "rename"])
def test_write_atomically_leaves_no_temporary_whatever_fails(tmp_path, monkeypatch, failing):
    """A full disk may show at a write, at the flush when the file is closed, or at the rename."""
    full = OSError(errno.ENOSPC, "No space left on device")
    real_create = FileSystems.create

    def create(path, *args, **kwargs):
        stream = real_create(path, *args, **kwargs)
        if failing in ("write", "close"):
            real = getattr(stream, failing)

            def fail(*args):
                real(*args)
                raise full

            setattr(stream, failing, fail)
        return stream

    def rename(*args, **kwargs):
        raise full

    monkeypatch.setattr(FileSystems, "create", create)
    if failing == "rename":
        monkeypatch.setattr(FileSystems, "rename", rename)
    with pytest.raises(OSError, match="No space left"):
        write_atomically(str(tmp_path / "schema.json"), [b"{}"])
    assert list(tmp_path.iterdir()) == []


def test_write_atomically_compresses_to_one_gzip_stream_and_read_bytes_returns_the_file(tmp_path):
    import gzip

    path = str(tmp_path / "shard.tfrecord.gz")
    size = write_atomically(path, [b"a" * 100, b"b" * 100], compression="gzip")
    assert size == os.path.getsize(path) and gzip.decompress(read_bytes(path)) == b"a" * 100 + b"b" * 100


def test_remove_tree_removes_a_folder_and_a_link_but_never_what_the_link_points_to(tmp_path):
    output = tmp_path / "output"
    (output / "_tmp" / "run" / "deep").mkdir(parents=True)
    (output / "_tmp" / "run" / "deep" / "bucket").write_bytes(b"x")
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "data.nc").write_bytes(b"y")
    (output / "_tmp" / "run" / "link").symlink_to(kept)
    remove_tree(str(output / "_tmp" / "run"), inside=str(output))
    assert not (output / "_tmp" / "run").exists() and (kept / "data.nc").read_bytes() == b"y"
    remove_if_empty(str(output / "_tmp"))
    assert list(output.iterdir()) == []
    remove_tree(str(output / "gone"), inside=str(output))  # nothing there: nothing to do


@pytest.mark.parametrize("where", ["../elsewhere", ".", "a/../../elsewhere"])
def test_remove_tree_refuses_a_path_outside_its_folder(tmp_path, where):
    output = tmp_path / "output"
    output.mkdir()
    (tmp_path / "elsewhere").mkdir()
    with pytest.raises(ValueError, match="is not inside"):
        remove_tree(os.path.join(str(output), where), inside=str(output))
    assert (tmp_path / "elsewhere").exists() and output.exists()


def test_remove_tree_refuses_a_link_on_the_way_to_the_path(tmp_path):
    output, elsewhere = tmp_path / "output", tmp_path / "elsewhere"
    (elsewhere / "run").mkdir(parents=True)
    output.mkdir()
    (output / "_tmp").symlink_to(elsewhere)
    with pytest.raises(UserError, match="_tmp on the way to it is a link"):
        remove_tree(str(output / "_tmp" / "run"), inside=str(output))
    assert (elsewhere / "run").exists()
