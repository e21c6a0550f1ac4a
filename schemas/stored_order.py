"""The order an output's records lie in: shuffled at write (the default), or unit order (shuffle.mode: read).

schema.json's ``sample.stored_order`` is ``"units"`` for an output built with shuffle.mode: read; an
output without the key was shuffled at write (every output built before the key existed was). A
sequential read of a unit-ordered output walks the archive in order, which trains badly, so it is
warned about once per output and process: an evaluation may read it so, a training run should take
a global order (``load_dataset(..., epoch=e)``, ``shuffled_stream``, ``open_source``).
"""

from __future__ import annotations

import threading
import warnings
from typing import Any

#: schema.json ``sample`` key, and its value for unit order.
STORED_ORDER = "stored_order"
UNIT_ORDER = "units"

_warned: set[str] = set()
_lock = threading.Lock()


class UnitOrderWarning(UserWarning):
    """A sequential read of an output whose records lie in unit order, not shuffled."""


def in_unit_order(sample: Any) -> bool:
    """Whether schema.json's ``sample`` (a dict) says the records lie in unit order."""
    return isinstance(sample, dict) and sample.get(STORED_ORDER) == UNIT_ORDER


def describe_order(sample: Any) -> str:
    """The stored order in a few words, for ``inspect``: "records stored <this>"."""
    if in_unit_order(sample):
        return "in unit order (shuffle.mode: read): load_dataset(..., epoch=e), shuffled_stream or open_source shuffle"
    return "shuffled at write (shuffle.mode: write)"


def warn_sequential_read(path: str, sample: Any) -> None:
    """Warn, once per output and process, that a sequential read of a unit-ordered output is not shuffled."""
    if not in_unit_order(sample):
        return
    with _lock:
        if str(path) in _warned:
            return
        _warned.add(str(path))
    warnings.warn(
        f"{path}: its records lie in unit (archive) order (shuffle.mode: read), so this sequential read is not "
        "shuffled; to train, read a fresh global order each epoch with load_dataset(..., epoch=e), "
        "shuffled_stream or open_source",
        UnitOrderWarning,
        stacklevel=3,
    )
