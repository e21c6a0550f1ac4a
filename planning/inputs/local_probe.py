"""Probing local input files fast: NetCDF-4 through HDF5's low-level API, classic NetCDF from its header.

A probe must cost far less than opening the file through xarray (6 ms) or the netCDF library
(1.3 ms), or planning dominates a build over thousands of small files. So a local NetCDF-4 file
is probed for only what planning needs from it: its variables' names, the values of its
dimension scales (the concat coordinate, raw, with the attributes that decide its decoding;
the grid coordinates, hashed into the fingerprint) and so its dim sizes: 0.3 ms. Files of one
archive list the same names, so the dimension scales found in one file are looked up directly
in the next. Each data variable's units and calendar are fingerprinted too (files whose units
differ are each read in full, and planning refuses them). What the probe leaves out (each data
variable's dims, dtype and other decoding attributes) the workers check as they read
(planning.reads.slabs): a variable of another rank, shape or decoded dtype than the reference
file's is refused there, in one line. For the variables
the config names, the probe also records where each lies in the file when its bytes are its
values (0.08 ms a variable), so workers can read it without HDF5 (planning.reads.direct_reads).
"""

from __future__ import annotations

import functools
import hashlib
import math
import multiprocessing as mp
import os
import signal
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import TypeVar

import numpy as np

from planning.formats.cf_decoding import unchanged_by_decoding
from planning.formats.hdf5_layout import check_window, layout_check, stored_offset
from planning.formats.hdf5_reads import decoding_attributes, read_attribute
from planning.formats.netcdf3 import read_header
from planning.formats.remote_files import RemoteFile
from planning.formats.sources import NETCDF_LOCK, is_hdf5
from planning.inputs.probe import FileProbe, _plain, probe_classic
from planning.inputs.twin_probe import Twins
from planning.run.cancellation import check_stopped

T = TypeVar("T")
R = TypeVar("R")

#: Attributes of the concat coordinate that xarray's decoding of it reads.
_CONCAT_ATTRS = (b"units", b"calendar", b"_FillValue", b"missing_value", b"scale_factor", b"add_offset", b"dtype")
#: The NAME of a dimension scale that netCDF-4 writes for a dim without a coordinate variable.
_NO_VARIABLE = "This is a netCDF dimension but not a netCDF variable"

#: Dimension scale names by the tuple of a file's names: files of one archive share one entry.
Scales = dict[tuple[bytes, ...], tuple[bytes, ...]]


def probe_local(
    path: str,
    nbytes: int,
    concat_dim: str,
    scales: Scales | None = None,
    wanted: frozenset[str] | None = None,
    twins: Twins | None = None,
) -> FileProbe:
    """Probe a local file; raises for anything unusual (groups, other formats): the full look reads those.

    ``wanted``: the variables whose layouts to record (planning.reads.direct_reads); None: every one.
    ``twins``: files probed before it in this process, which it may be the twin of (planning.inputs.twin_probe).
    """
    if is_hdf5(path):
        with NETCDF_LOCK:
            return _probe_hdf5(path, nbytes, concat_dim, {} if scales is None else scales, wanted, twins)
    with open(path, "rb") as stream:
        header = read_header(stream)
    if header is None:
        raise ValueError("not a NetCDF file: the full look names the problem")
    return probe_classic(path, header, RemoteFile(path, nbytes), concat_dim)


def _find_scales(root, names: tuple[bytes, ...]) -> tuple[bytes, ...]:
    from h5py import h5d, h5ds, h5o

    found = []
    for name in names:
        if h5o.get_info(root, name).type != h5o.TYPE_DATASET:
            raise ValueError("groups: take the full look")
        dataset = h5d.open(root, name)
        if dataset.rank == 1 and h5ds.is_scale(dataset):
            found.append(name)
    return tuple(found)


def _contiguous_layout(root, name: bytes, read_at) -> list | None:
    """[byte offset, shape, dtype, check] of a dataset whose stored bytes are its values as xarray decodes them:
    contiguous, plain numbers in this machine's byte order, nothing for CF decoding to change.
    ``read_at(length, offset)``: the file's bytes, for the check (layout_check)."""
    from h5py import h5d

    dataset = h5d.open(root, name)
    dtype = dataset.dtype
    if dataset.rank == 0 or dtype.kind not in "fiu" or not dtype.isnative:
        return None
    offset = stored_offset(dataset)
    if offset is None or not unchanged_by_decoding(dtype, decoding_attributes(dataset)):
        return None
    offset = int(offset)
    window = check_window(offset, math.prod(dataset.shape) * dtype.itemsize)
    return [offset, list(dataset.shape), dtype.str, layout_check(name.decode(), offset, read_at(*window[::-1]))]


#: A data variable's attributes that say what its values mean (planning.inputs.inventory.check_variables_agree).
_MEANING_ATTRS = (b"units", b"calendar")


def _meaning_attributes(dataset) -> tuple:
    from h5py import h5a

    return tuple(_plain(read_attribute(dataset, key)) if h5a.exists(dataset, key) else None for key in _MEANING_ATTRS)


def _scale_values(dataset, read_at) -> np.ndarray:
    """A dimension scale's stored values: read by offset where stored plainly (contiguous storage holds them
    as they are, no filter applies), which costs a fifth of an HDF5 read of a small dataset."""
    from h5py import h5s

    dtype, (length,) = dataset.dtype, dataset.shape
    offset = stored_offset(dataset)
    if offset is not None:
        stored = read_at(length * dtype.itemsize, offset)
        if len(stored) == length * dtype.itemsize:
            return np.frombuffer(stored, dtype).copy()
    values = np.empty(length, dtype)
    dataset.read(h5s.ALL, h5s.ALL, values)
    return values


def _probe_hdf5(
    path: str, nbytes: int, concat_dim: str, scales: Scales, wanted: frozenset[str] | None, twins: Twins | None
) -> FileProbe:
    from h5py import h5f

    # The file's bytes by offset: a twin's comparison, plainly stored scales, the layouts' checks.
    with open(path, "rb", buffering=0) as stream:
        read_at = functools.partial(os.pread, stream.fileno())
        probe = None if twins is None else twins.probe(path, nbytes, read_at)
        if probe is not None:
            return probe
        file = h5f.open(path.encode(), h5f.ACC_RDONLY)
        try:
            probe = _probe_open_hdf5(file, read_at, path, nbytes, concat_dim, scales, wanted)
            if twins is not None:
                twins.add(file, read_at, probe, concat_dim)
            return probe
        finally:
            file.close()


def _probe_open_hdf5(
    file, read_at, path: str, nbytes: int, concat_dim: str, scales: Scales, wanted: frozenset[str] | None
) -> FileProbe:
    from h5py import h5a, h5d, h5g

    root = h5g.open(file, b"/")
    names = tuple(root)
    if names not in scales:
        scales[names] = _find_scales(root, names)
    digest = hashlib.sha1(repr(names).encode())
    sizes: dict[str, int] = {}
    concat_raw, concat_attrs = None, {}
    for name in scales[names]:
        dataset = h5d.open(root, name)
        if dataset.rank != 1 or dataset.dtype.kind not in "fiub":
            raise ValueError("an unusual dimension scale: take the full look")
        values = _scale_values(dataset, read_at)
        dim = name.decode()
        sizes[dim] = len(values)
        if dim != concat_dim:
            # A grid coordinate: files whose grids differ must not share a fingerprint.
            digest.update(repr((dim, values.dtype.str)).encode())
            digest.update(values.tobytes())
        elif not str(read_attribute(dataset, b"NAME")).startswith(_NO_VARIABLE):
            concat_raw = values if values.dtype.isnative else values.astype(values.dtype.newbyteorder("="))
            listed: list[bytes] = []
            h5a.iterate(dataset, listed.append)  # one listing: cheaper than asking for each attribute
            present = [key for key in _CONCAT_ATTRS if key in listed]
            concat_attrs = {key.decode(): _plain(read_attribute(dataset, key)) for key in present}
    for name in names:
        if name not in scales[names]:
            # What its values mean: files whose units differ must not share a fingerprint (each gets the full
            # look, and check_variables_agree compares them).
            digest.update(repr((name, _meaning_attributes(h5d.open(root, name)))).encode())
    layouts = {}
    for name in names:
        if name not in scales[names] and (wanted is None or name.decode() in wanted):
            layout = _contiguous_layout(root, name, read_at)
            if layout is not None:
                layouts[name.decode()] = layout
    return FileProbe(path, nbytes, False, digest.hexdigest(), sizes, concat_raw, concat_attrs, layouts=layouts)


#: Below this many files a pool of processes costs more than it saves.
POOL_MIN_FILES = 500
#: Files a pool process probes per task: few enough tasks to share work evenly, each big enough
#: that the result's trip back is a small part of it. The first task's worth is probed in this
#: process: where nearly all of them were twins, the rest are too cheap for a pool to pay off.
FILES_PER_TASK = 250
#: The share of the first files probed as twins from which the rest are probed in this process.
TWINS_FOR_NO_POOL = 0.9


def _probe_serially(
    concat_dim: str, wanted: frozenset[str] | None, paths_and_sizes: list[tuple[str, int]], twins: Twins | None = None
) -> list[FileProbe | None]:
    scales: Scales = {}
    twins = Twins() if twins is None else twins
    probes: list[FileProbe | None] = []
    for path, nbytes in paths_and_sizes:
        check_stopped()  # a stopped build (Ctrl-C, SIGTERM) unwinds here, between two files
        try:
            probes.append(probe_local(path, nbytes, concat_dim, scales, wanted, twins))
        except Exception:  # the full look reads it through xarray, and names the problem if there is one
            probes.append(None)
    return probes


def _default_signals() -> None:
    """In a pool process: Ctrl-C and SIGTERM end it as they end any program.

    A forked process inherits the build's handling of them (pipelines.stopping), which would
    report its signals as the build's own; the build kills its pool when it stops.
    """
    signal.set_wakeup_fd(-1)
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_DFL)


def pool_processes() -> int:
    """The processes of a planning pool: one a core, at most 8 (each holds a file's work at a time)."""
    return min(os.cpu_count() or 1, 8)


def can_fork_pool() -> bool:
    """Whether a pool of forked processes can use more than this one core here."""
    return pool_processes() >= 2 and "fork" in mp.get_all_start_methods()


def forked_map(function: Callable[[T], R], items: Sequence[T]) -> list[R]:
    """``function`` of each item, in their order, in a pool of forked processes (see can_fork_pool).

    The first item (in order) whose call raised raises here, once the calls not yet started are
    cancelled and the pool has ended: the running ones end their item first (no process is
    killed, so none is left holding a lock or half a file). A stopped build kills the pool's
    processes itself (pipelines.stopping).
    """
    with ProcessPoolExecutor(pool_processes(), mp_context=mp.get_context("fork"), initializer=_default_signals) as pool:
        return list(pool.map(function, items))


def probe_local_files(
    paths_and_sizes: list[tuple[str, int]], concat_dim: str, wanted: frozenset[str] | None = None
) -> list[FileProbe | None]:
    """Probe local files (None where only the full look will do); many files in a pool of processes, unless
    they are twins (planning.inputs.twin_probe).

    ``wanted``: the variables whose byte layouts to record (None: every one).

    The HDF5 library serialises all work in a process, so processes are the only way to use
    more than one core. They are forked: a fresh interpreter would spend longer importing
    numpy and h5py than probing a few thousand files.
    """
    if len(paths_and_sizes) < POOL_MIN_FILES or not can_fork_pool():
        return _probe_serially(concat_dim, wanted, paths_and_sizes)
    twins = Twins()
    first = _probe_serially(concat_dim, wanted, paths_and_sizes[:FILES_PER_TASK], twins)
    rest = paths_and_sizes[FILES_PER_TASK:]
    if twins.matched >= TWINS_FOR_NO_POOL * len(first):  # files written alike: 0.06 ms each, no pool to start
        return first + _probe_serially(concat_dim, wanted, rest, twins)
    tasks = [rest[i : i + FILES_PER_TASK] for i in range(0, len(rest), FILES_PER_TASK)]
    results = forked_map(functools.partial(_probe_serially, concat_dim, wanted), tasks)
    return first + [probe for chunk in results for probe in chunk]
