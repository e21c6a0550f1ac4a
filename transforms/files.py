"""Writing, removing and reading files, local or gs:// (Beam's FileSystems): every file the stages and the driver write.

Not a stage: the helpers the stages (transforms/) and the driver (pipelines/) share. A file is
written under a temporary name and renamed, so a reader never meets half of it.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
import stat
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from planning.run.cancellation import check_cancelled, writing
from planning.run.names import join, new_temporary_token, temporary_path
from schemas.errors import UserError
from schemas.shard_index import index_lines, index_name
from schemas.urls import is_remote
from transforms.bulk_files import delete_objects, in_batches, remove_prefix

logger = logging.getLogger(__name__)

_WRITE_BYTES = 8 * 2**20
#: Bytes handed to the compressor at a time: zlib builds each call's output in blocks and then
#: joins them, so a large write would briefly hold its compressed size twice.
_COMPRESS_BYTES = 2**16
#: Local files unlinked by each of a few threads at a time (a parallel filesystem serves several at once).
_LOCAL_BATCH = 256
_LOCAL_THREADS = 4


def _batched(chunks, size: int = _WRITE_BYTES):
    """Join small chunks into writes of about ``size`` bytes; pass large ones through uncopied."""
    pending: list = []
    pending_bytes = 0
    for chunk in chunks:
        if len(chunk) >= size:
            if pending:
                yield b"".join(pending)
                pending, pending_bytes = [], 0
            yield chunk
            continue
        pending.append(chunk)
        pending_bytes += len(chunk)
        if pending_bytes >= size:
            yield b"".join(pending)
            pending, pending_bytes = [], 0
    if pending:
        yield b"".join(pending)


def write_atomically(
    path: str, chunks, compression: str | None = None, join_small: bool = True, durable: bool = False
) -> int:
    """Write bytes chunks to a temporary name beside ``path``, then rename; returns the file's size.

    ``compression="gzip"`` writes one gzip stream (what TensorFlow's GZIP TFRecord reader expects);
    its bytes do not depend on how the data is cut into chunks. ``join_small``: join small chunks
    into writes of about 8 MB (pass False when the chunks are batches already). ``durable``: on a
    local disk, the bytes reach it before the rename and the rename before this returns (a commit).
    """
    with writing():  # an interrupted build waits for this write to end, then removes the run's files
        return _write_atomically(path, chunks, compression, join_small, durable)


def make_durable(paths) -> None:
    """Local files' bytes, and their directories' entries, on the disk (fsync); object stores are already.

    A commit names files in schema.json: on a power loss after it, the files must hold what it
    says. The files are synced together (a few at a time) so the disk can order their writes.
    """
    local = sorted({os.path.abspath(p) for p in paths if not is_remote(p)})
    if not local:
        return
    with ThreadPoolExecutor(max_workers=min(4, len(local))) as pool:
        list(pool.map(_fsync, local))
    for directory in sorted({os.path.dirname(p) for p in local}):
        _fsync(directory)


def _fsync(path: str) -> None:
    descriptor = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _write_atomically(path: str, chunks, compression: str | None, join_small: bool, durable: bool = False) -> int:
    temporary = temporary_path(path, new_temporary_token())
    written = 0
    kind = CompressionTypes.GZIP if compression == "gzip" else CompressionTypes.UNCOMPRESSED
    stream = FileSystems.create(temporary, compression_type=kind)
    try:
        try:
            for chunk in _batched(chunks) if join_small else chunks:
                check_cancelled()
                if compression is None:
                    stream.write(chunk)
                else:
                    with memoryview(chunk) as view:
                        for start in range(0, len(view), _COMPRESS_BYTES):
                            stream.write(view[start : start + _COMPRESS_BYTES])
                written += len(chunk)
                del chunk  # let it go before the next chunk is made
        except BaseException:
            with contextlib.suppress(Exception):  # the write's error is the one to report
                stream.close()
            raise
        stream.close()  # a full disk may show only here, when the last bytes are flushed
        if durable and not is_remote(temporary):
            _fsync(temporary)  # its bytes before the rename; the directory's entry after it
        if FileSystems.exists(path):
            FileSystems.delete([path])
        FileSystems.rename([temporary], [path])
        if durable and not is_remote(path):
            _fsync(os.path.dirname(os.path.abspath(path)))
    except BaseException:
        # Whatever failed (a write, the flush at close, the rename), no temporary is left behind:
        # a rerun would otherwise meet it.
        try:
            if FileSystems.exists(temporary):
                FileSystems.delete([temporary])
        except Exception as error:  # the write's error is the one to report
            logger.warning("could not remove %s: %s", temporary, error)
        raise
    if compression is None:
        return written
    return FileSystems.match([path])[0].metadata_list[0].size_in_bytes


def remove_tree(path: str, inside: str | None = None) -> None:
    """Delete a file or a directory with everything under it; on object stores, every object under the prefix.

    Locally no link is ever followed: a link is removed itself, never what it points to, and a
    link on the way from ``inside`` (default: the parent of ``path``) to ``path`` is an error.
    """
    if is_remote(path):
        remove_prefix(path)  # (listed page by page, deleted in batches)
        if FileSystems.exists(path):
            FileSystems.delete([path])
        return
    base = inside if inside is not None else os.path.dirname(os.path.abspath(path))
    parts = os.path.relpath(os.path.abspath(path), os.path.abspath(base)).split(os.sep)
    if parts[0] in (os.curdir, os.pardir) or os.pardir in parts:
        raise ValueError(f"{path} is not inside {base}: not removed")
    try:
        directory = os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    try:
        for part in parts[:-1]:
            try:
                inner = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=directory)
            except FileNotFoundError:
                return
            except OSError as error:
                if error.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                raise UserError(
                    f"{path}: {part} on the way to it is a link or a file, not a directory this tool made; "
                    "remove it by hand"
                ) from None
            os.close(directory)
            directory = inner
        try:
            info = os.stat(parts[-1], dir_fd=directory, follow_symlinks=False)
        except FileNotFoundError:
            return
        if stat.S_ISDIR(info.st_mode):
            shutil.rmtree(parts[-1], dir_fd=directory)  # descends by descriptors, never through a link
        else:
            os.unlink(parts[-1], dir_fd=directory)
    finally:
        os.close(directory)


def delete_files(base: str, names: Iterable[str]) -> int:
    """Delete these files (relative to ``base``) in parallel batches, taken from ``names`` as they go; how many.

    Locally each is removed by ``remove_tree`` (a link itself, never what it points to); on object
    stores in batch requests (transforms.bulk_files).
    """
    if is_remote(base):
        return delete_objects(base, names)

    def remove(batch: list[str]) -> None:
        for name in batch:
            remove_tree(join(base, name), inside=base)

    return in_batches(names, _LOCAL_BATCH, remove, _LOCAL_THREADS)


def remove_if_empty(directory: str) -> None:
    """Remove a local directory left empty (object stores have no directories)."""
    if not is_remote(directory):
        with contextlib.suppress(OSError):  # missing, or holds something: leave it
            os.rmdir(directory)


def read_bytes(path: str) -> bytes:
    with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as stream:
        return stream.read()


def write_index(shard_path: str, sizes=None, chunks=None) -> str:
    """Write a shard's index beside it, from its records' framed sizes or as ``chunks`` of its bytes; its name."""
    path = index_name(shard_path)
    # Chunks of a streamed index are written as they come: joined, they would be held whole.
    write_atomically(path, chunks if chunks is not None else [index_lines(sizes)], join_small=chunks is None)
    return os.path.basename(path)
