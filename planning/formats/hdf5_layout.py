"""Where a NetCDF-4 variable's values lie in its file when stored as they are, and the check that they still do."""

from __future__ import annotations

import hashlib

#: Bytes of a plainly stored variable's values, from their middle (less often a fill value than their
#: start), that its layout's check hashes with its name and offset (layout_check).
CHECK_BYTES = 32


def check_window(offset: int, nbytes: int) -> tuple[int, int]:
    """Where the bytes a layout's check covers start, and how many, for values of ``nbytes`` at ``offset``."""
    length = min(CHECK_BYTES, nbytes)
    return offset + (nbytes - length) // 2, length


def layout_check(name: str, offset: int, window: bytes) -> int:
    """A variable's layout check, an int64: a worker that reads it by offset recomputes it first, so values
    are never read at an offset that is not this variable's in this file as probed (planning.reads.direct_reads)."""
    digest = hashlib.blake2b(f"{name}\0{offset}\0".encode() + window, digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True)


def stored_offset(dataset) -> int | None:
    """Where a dataset's values lie in its file, stored as they are; None where they do not lie in one run.

    HDF5 gives an offset for contiguous storage only: not for chunks, compact or external storage.
    Before the values are written (they read as fill values then) it has none either, but behind a
    user block it adds the block's size to its "no address" (-1): the storage's status tells.
    """
    from h5py import h5d

    offset = dataset.get_offset()
    if offset is None or dataset.get_space_status() != h5d.SPACE_STATUS_ALLOCATED:
        return None
    return int(offset)
