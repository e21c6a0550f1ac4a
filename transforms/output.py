"""The output directory: file names, refusing or clearing an existing output, atomic writes.

All I/O goes through Beam's ``FileSystems``, so local paths and ``gs://`` behave the same.
"""

from __future__ import annotations

import fnmatch
import logging
import os
import posixpath
import tempfile
import uuid

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from schemas.errors import UserError
from schemas.schema import PARSER_FILE, SCHEMA_FILE, SHARD_GLOB, STATS_FILE
from transforms.gcs_emulator import use_anonymous_credentials_for_emulator
from transforms.urls import is_remote

# Driver and workers both import this module before their first GCS call.
use_anonymous_credentials_for_emulator()

logger = logging.getLogger(__name__)

TMP_DIR = "_tmp"
_OURS = (SCHEMA_FILE, STATS_FILE, PARSER_FILE, SHARD_GLOB)


def join(base: str, *parts: str) -> str:
    return FileSystems.join(base, *parts)


def bucket_dir(output: str, run_id: str) -> str:
    """Where a local run keeps its bucket files: beside the output, or in local temp for remote outputs."""
    if is_remote(output):
        return os.path.join(tempfile.gettempdir(), "xarray-tfrecords", run_id)
    return join(output, TMP_DIR, run_id)


def _relative(base: str, path: str) -> str:
    return posixpath.relpath(path, base) if not is_remote(base) else path[len(base.rstrip("/")) + 1 :]


def _is_ours(relative: str) -> bool:
    if relative.split("/", 1)[0] == TMP_DIR:
        return True
    return "/" not in relative and any(fnmatch.fnmatch(relative, pattern) for pattern in _OURS)


def _is_file(path: str) -> bool:
    if not is_remote(path):
        return os.path.isfile(path)
    return any(m.path == path for m in FileSystems.match([path])[0].metadata_list)


def prepare_output(path: str, overwrite: bool) -> None:
    """Refuse an existing output unless ``overwrite``; then remove what an earlier build wrote.

    The old schema.json goes first, so an interrupted clean-up never leaves a directory that
    looks complete. Files this tool did not write are never deleted: their presence is an error.
    """
    if _is_file(path):
        raise UserError(f"output: {path} is an existing file; choose a directory path for the output")
    existing = [m.path for m in FileSystems.match([join(path, "**")])[0].metadata_list]
    if not existing:
        return
    if not overwrite:
        raise UserError(f"output: {path} already exists; pass --overwrite to replace it, or choose another path")
    foreign = [p for p in existing if not _is_ours(_relative(path, p))]
    if foreign:
        raise UserError(
            f"output: {path} holds files this tool did not write (e.g. {foreign[0]}); "
            "--overwrite only replaces an earlier output: choose an empty or new directory"
        )
    schema = join(path, SCHEMA_FILE)
    if FileSystems.exists(schema):
        FileSystems.delete([schema])
    rest = [p for p in existing if p != schema]
    if rest:
        FileSystems.delete(rest)


def remove_temporary_files(plan) -> None:
    """Delete what a failed run of ``plan`` left: its temporary shards and its bucket directory.

    A run killed outright cannot do this; the next run with --overwrite does (prepare_output).
    """
    temporary = [m.path for m in FileSystems.match([join(plan.output, f"*.tmp-{plan.run_id}")])[0].metadata_list]
    buckets = bucket_dir(plan.output, plan.run_id)
    for path in [*temporary, buckets, join(plan.output, TMP_DIR)]:
        try:
            if FileSystems.exists(path):
                FileSystems.delete([path])
        except Exception as error:  # cleaning up must not hide why the run failed
            logger.warning("could not remove %s: %s", path, error)


_WRITE_BYTES = 8 * 2**20


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


def write_atomically(path: str, chunks, compression: str | None = None) -> int:
    """Write bytes chunks to a temporary name beside ``path``, then rename; returns the file's size.

    ``compression="gzip"`` writes one gzip stream (what TensorFlow's GZIP TFRecord reader expects).
    """
    temporary = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
    written = 0
    kind = CompressionTypes.GZIP if compression == "gzip" else CompressionTypes.UNCOMPRESSED
    stream = FileSystems.create(temporary, compression_type=kind)
    try:
        for chunk in _batched(chunks):
            stream.write(chunk)
            written += len(chunk)
    except BaseException:
        stream.close()
        FileSystems.delete([temporary])
        raise
    stream.close()
    if FileSystems.exists(path):
        FileSystems.delete([path])
    FileSystems.rename([temporary], [path])
    if compression is None:
        return written
    return FileSystems.match([path])[0].metadata_list[0].size_in_bytes


def read_bytes(path: str) -> bytes:
    with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as stream:
        return stream.read()
