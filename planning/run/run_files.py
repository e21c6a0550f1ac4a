"""Files a run saves for its workers (units, input index, positions), each loaded once per worker process."""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import threading
from collections.abc import Callable
from typing import TypeVar

from schemas.errors import UserError

T = TypeVar("T")

#: Files a worker process keeps loaded: a few runs' worth (a Dask worker outlives a run).
_KEPT = 8

_loaded: collections.OrderedDict[tuple[str, str], object] = collections.OrderedDict()
_lock = threading.Lock()


@dataclasses.dataclass(frozen=True)
class RunFile:
    """Where a run's file is, and the digest of the bytes planning saved there (what the job graph carries)."""

    url: str
    digest: str  # sha256, hex

    @classmethod
    def of(cls, url: str, data: bytes) -> RunFile:
        return cls(url, hashlib.sha256(data).hexdigest())


def load_once(file: RunFile, read: Callable[[str], bytes], decode: Callable[[bytes], T]) -> T:
    """``decode(read(file.url))``, once per process and file: every DoFn instance and bundle after the first shares it.

    The bytes are checked against the digest planning recorded: the file is read from disk, where
    anything may have replaced it.
    """
    key = (file.url, file.digest)
    with _lock:  # one read per process, even when the runner's threads set up their DoFns at once
        if key in _loaded:
            _loaded.move_to_end(key)
            return _loaded[key]  # type: ignore[return-value]
        data = read(file.url)
        if hashlib.sha256(data).hexdigest() != file.digest:
            raise UserError(
                f"{file.url}: not the file this run saved for its workers (its digest differs); something else "
                "wrote there: rerun the build"
            )
        value = decode(data)
        _loaded[key] = value
        while len(_loaded) > _KEPT:
            _loaded.popitem(last=False)
        return value
