"""An opt-in measure of the memory each merge step holds (benchmarks.merge_memory); off unless XTF_MERGE_MEMORY is set.

A merge step (a group's parts merged, a combine's add, merge or extract) holds what it is handed
(a group's parts as the runner grouped them, accumulators) and what it returns, both alive when
it ends. With ``XTF_MERGE_MEMORY`` naming a folder, each outermost call of a step marked
``@measured`` appends one JSON line there, ``{"step", "held", "bytes"}``: the in-memory size of its
arguments, and of its arguments and result together (objects shared counted once). Sizes are
counted over the objects themselves (``sys.getsizeof`` of each object reachable, numpy buffers
included), not with tracemalloc or RSS: a worker's other threads (Dask's event loop, a local
runner's other bundles) allocate meanwhile, and whole-worker RSS mixes in reads and encodes.
The few KB a single merge of two summaries allocates and frees are not counted. Off, a step pays
one environment lookup a call.
"""

from __future__ import annotations

import functools
import gc
import json
import os
import sys
import threading
import types
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import numpy as np

#: The folder each process appends its merge steps' measures to (merges-<pid>.jsonl); unset: nothing is measured.
ENV = "XTF_MERGE_MEMORY"

F = TypeVar("F", bound=Callable)

#: Shared by every merge, not held by one: code, classes, modules (a tree's ``merge`` function is not its state).
_SHARED = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodType, types.CodeType)

_inside = threading.local()  # a step called by a measured step (add_inputs -> add_input) is the outer one's


def measured(step: str, method: bool = False) -> Callable[[F], F]:
    """Marks a merge step: with XTF_MERGE_MEMORY set, each outermost call records the bytes it holds.

    ``method``: a CombineFn's method, whose ``self`` (the merge's settings, not its state) is not counted.
    """

    def mark(function: F) -> F:
        @functools.wraps(function)
        def call(*args, **kwargs):
            folder = os.environ.get(ENV)
            if not folder or getattr(_inside, "step", None):
                return function(*args, **kwargs)
            _inside.step = step
            try:
                result = function(*args, **kwargs)
            finally:
                _inside.step = None
            inputs = (args[1:] if method else args, kwargs)
            line = {"step": step, "held": size_of(inputs), "bytes": size_of((inputs, result))}
            with open(Path(folder) / f"merges-{os.getpid()}.jsonl", "a") as out:
                out.write(json.dumps(line) + "\n")
            return result

        return call  # type: ignore[return-value]

    return mark


def size_of(value) -> int:
    """Bytes ``value`` and every object it reaches take in memory, each counted once (numpy buffers included)."""
    seen: set[int] = set()
    pending = [value]
    total = 0
    while pending:
        item = pending.pop()
        if id(item) in seen or isinstance(item, _SHARED):
            continue
        seen.add(id(item))
        total += sys.getsizeof(item)  # an array that owns its buffer counts it
        if isinstance(item, np.ndarray):
            if item.base is not None:
                pending.append(item.base)
            continue
        pending.extend(gc.get_referents(item))
    return total


def read_measures(folder: Path) -> list[dict]:
    """Every merge step's line that the processes wrote under ``folder``."""
    lines = []
    for path in sorted(Path(folder).glob("merges-*.jsonl")):
        lines += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return lines
