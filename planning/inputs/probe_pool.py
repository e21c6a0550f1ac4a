"""Probing many input files in a pool of forked processes: the launcher's cores for parsing that holds the GIL.

Local and remote probes share it (planning.inputs.local_probe, planning.inputs.probe): both
parse headers in Python or in HDF5, which serialises all work in a process, so only processes
use more than one core. They are forked: a fresh interpreter would spend longer importing numpy
and h5py than probing a few thousand files.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from typing import TypeVar

#: Processes a pool uses at most, whatever the launcher's cores.
MAX_PROCESSES = 8

T = TypeVar("T")
R = TypeVar("R")


def pool_processes() -> int:
    """Processes a pool of probes may use: the cores this process may run on (its CPU affinity, which ``taskset``
    or a cpuset narrows; a CPU quota does not), at most MAX_PROCESSES; 1 where processes cannot be forked."""
    if "fork" not in mp.get_all_start_methods():
        return 1
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return max(1, min(cores, MAX_PROCESSES))


def _default_signals() -> None:
    """In a pool process: Ctrl-C and SIGTERM end it as they end any program.

    A forked process inherits the build's handling of them (pipelines.stopping), which would
    report its signals as the build's own; the build kills its pool when it stops.
    """
    signal.set_wakeup_fd(-1)
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_DFL)


def map_in_pool(function: Callable[[T], R], tasks: Iterable[T], processes: int) -> Iterator[R]:
    """``function(task)`` of each task, in order, computed in a pool of ``processes`` forked processes.

    Each result is yielded as soon as it and those before it are done, so the caller can make it
    smaller (share what results have in common) before later ones arrive.
    """
    with ProcessPoolExecutor(processes, mp_context=mp.get_context("fork"), initializer=_default_signals) as pool:
        yield from pool.map(function, tasks)
