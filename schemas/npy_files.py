"""Reading .npy and .npz files from several threads: one at a time, as numpy parses their headers with ``ast``.

CPython 3.11 counts the depth of every ``ast.parse`` in one place per interpreter, so two threads
parsing at once can fail with ``SystemError: AST constructor recursion depth mismatch``
(python/cpython#106905): a local build's worker threads load the run's files as their work starts.
"""

from __future__ import annotations

import contextlib
import io
import threading
from collections.abc import Iterator

import numpy as np

_ONE_AT_A_TIME = threading.RLock()  # (re-entrant: a block that reads one file may open another)


@contextlib.contextmanager
def npz_arrays(data: bytes) -> Iterator[np.lib.npyio.NpzFile]:
    """The arrays of an .npz file's bytes, readable inside the block (each read parses its header)."""
    with _ONE_AT_A_TIME, np.load(io.BytesIO(data), allow_pickle=False) as arrays:
        yield arrays


def mapped_npy(path: str) -> np.ndarray:
    """An .npy file mapped read-only (its header parsed now, its data read as it is touched)."""
    with _ONE_AT_A_TIME:
        return np.load(path, mmap_mode="r", allow_pickle=False)
