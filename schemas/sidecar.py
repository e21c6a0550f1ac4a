"""An output's binary sidecars (grid.npz, shards.npz): .npz files beside schema.json, which records their sha256.

Both are written before schema.json (the commit marker), so a committed schema.json's sidecars are whole;
readers read one only when what it holds is asked for, and check it against schema.json's size and digest
before any value in it is used, since the output's files are data anyone may have replaced.
"""

from __future__ import annotations

import collections
import hashlib
import io
import posixpath
import threading
import zipfile

import numpy as np

from schemas.errors import UserError

#: Every member's timestamp: the same arrays give the same bytes (an output hashes the same build after build).
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)
#: Sidecars a process keeps read (a few outputs' grids and shard tables).
_KEPT = 8

_loaded: collections.OrderedDict[tuple[str, str], bytes] = collections.OrderedDict()
_lock = threading.Lock()


def npz_bytes(arrays: dict[str, np.ndarray]) -> bytes:
    """An .npz of ``arrays`` (stored, not deflated), byte for byte the same for the same arrays."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
        for key, array in arrays.items():
            member = io.BytesIO()
            np.lib.format.write_array(member, np.ascontiguousarray(array), allow_pickle=False)
            archive.writestr(zipfile.ZipInfo(f"{key}.npy", date_time=_ZIP_TIME), member.getvalue())
    return buffer.getvalue()


def digest(data: bytes) -> str:
    """The sha256 schema.json records of a sidecar's bytes, in hex."""
    return hashlib.sha256(data).hexdigest()


def _read(url: str, limit: int | None) -> bytes:
    import fsspec

    from schemas.urls import check_regular_file

    check_regular_file(url)  # a FIFO in the sidecar's place would block the read for ever
    with fsspec.open(url, "rb") as stream:
        return stream.read() if limit is None else stream.read(limit + 1)


def read_sidecar(folder: str, name: str, sha256: str, what: str, size: int | None = None) -> bytes:
    """A sidecar's bytes, read once per process and digest, checked against schema.json's ``size`` and ``sha256``.

    Args:
        folder: the output's folder.
        name: the sidecar's file name (checked by schema.json's loading to be a file of the folder).
        sha256: its digest as schema.json records it.
        what: what schema.json's entry naming it holds, for the messages ("the grid's large coordinates").
        size: its size in bytes as schema.json records it (None: not recorded); no more than that is read.

    Raises:
        UserError: the sidecar is missing, of another size, or of another digest.
    """
    url = posixpath.join(folder, name)
    key = (url, sha256)
    with _lock:
        if key in _loaded:
            _loaded.move_to_end(key)
            return _loaded[key]
    try:
        data = _read(url, size)
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        raise UserError(
            f"{url}: missing, but schema.json names it ({what}); copy the output with every file beside "
            "schema.json, or build it again"
        ) from None
    if size is not None and len(data) != size:
        held = f"more than {size:,}" if len(data) > size else f"{len(data):,}"
        raise UserError(
            f"{url}: holds {held} bytes where schema.json says {size:,} (cut short or replaced); copy it again from "
            "the output it came from, or build the output again"
        )
    if digest(data) != sha256:
        raise UserError(
            f"{url}: not the file schema.json was written with (its sha256 differs): it was replaced or damaged; "
            "copy it again from the output it came from, or build the output again"
        )
    with _lock:
        _loaded[key] = data
        while len(_loaded) > _KEPT:
            _loaded.popitem(last=False)
    return data
