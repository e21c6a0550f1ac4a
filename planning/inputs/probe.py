"""A quick look at one input file: its structure's fingerprint, its dim sizes and its concat coordinate.

Planning reads full metadata (through xarray) from one file per distinct structure only; every
other file is probed (local files: planning.inputs.local_probe; remote ones here, from bytes fetched
for a batch of files at once). Files whose fingerprint equals
the reference's have the reference's variables, grid and attributes; their own concat
coordinate is decoded exactly as xarray decodes it (``decode_cf_variable``, the file's own
units and calendar).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import io
from collections.abc import Iterable, Iterator
from typing import Any

import fsspec
import numpy as np

from planning.formats.classic_reads import read_raw
from planning.formats.netcdf3 import ClassicHeader, read_header
from planning.formats.remote_files import BlockReader, RemoteFile
from planning.formats.sources import HDF5_SIGNATURE, NETCDF_LOCK, ListedFile, refuse_truncated
from planning.inputs.probe_pool import map_in_pool, pool_processes
from planning.inputs.time_decoding import AS_STATED, MissingValue, TimeDecoding
from planning.run.cancellation import check_stopped

#: Attributes that change how xarray decodes a variable's values (and so its decoded dtype).
_DECODING_ATTRS = ("scale_factor", "add_offset", "_FillValue", "missing_value", "_Unsigned", "units", "calendar")


@dataclasses.dataclass(frozen=True)
class FileProbe:
    """What a probe learns: enough to place a file along the concat dim and to tell its structure apart."""

    path: str
    nbytes: int
    classic: bool  # a netCDF-3 file (CDF-1, CDF-2 or CDF-5)
    fingerprint: str  # equal fingerprints: same dims, variables, dtypes, decoding attributes and grid
    sizes: dict[str, int]
    concat_raw: np.ndarray | None  # the concat coordinate's stored values (None: the file has none)
    concat_attrs: dict[str, Any]
    bytes_read: int | None = None  # what probing a remote file fetched
    #: local NetCDF-4 files: variables workers may read straight from the file's bytes (planning.reads.direct_reads),
    #: by name: [byte offset, shape, dtype]
    layouts: dict[str, list] = dataclasses.field(default_factory=dict)


def decode_concat_values(
    probes: list[FileProbe], concat_dim: str, decoding: TimeDecoding = AS_STATED
) -> list[np.ndarray | None]:
    """Each probe's concat coordinate decoded as xarray decodes it when it opens the file (times as ``decoding`` says).

    Files that store it alike (same dtype, units, calendar, ...) are decoded in one call: one
    decode per file would cost as much as the probe itself.
    """
    groups: dict[str, list[int]] = {}
    for index, probe in enumerate(probes):
        if probe.concat_raw is not None:
            key = repr((probe.concat_raw.dtype.str, sorted(probe.concat_attrs.items())))
            groups.setdefault(key, []).append(index)
    out: list[np.ndarray | None] = [None] * len(probes)
    for members in groups.values():
        raw = np.concatenate([probes[i].concat_raw for i in members])
        first = probes[members[0]]
        ends = np.cumsum([len(probes[i].concat_raw) for i in members])
        try:
            decoded_values = decoding.values(first.path, concat_dim, (concat_dim,), raw, first.concat_attrs).values
        except MissingValue as missing:
            # Found in the files' values decoded together: name the file it is in, and its index there.
            which = int(np.searchsorted(ends, missing.index, side="right"))
            start = int(ends[which - 1]) if which else 0
            path = probes[members[which]].path
            raise MissingValue(path, missing.name, missing.index - start, missing.value) from None
        for i, values in zip(members, np.split(decoded_values, ends[:-1])):
            out[i] = values
    return out


def _plain(value: Any) -> Any:
    """An attribute as the netCDF library gives it: text as str, a single value as a scalar."""
    if isinstance(value, np.ndarray):
        value = value.item() if value.size == 1 else value.tolist()
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, bytes):
        value = value.decode("utf-8", errors="replace")
    return value


def _probe(
    path: str, nbytes: int, classic: bool, sizes: dict[str, int], variables, concat_dim: str, **extra
) -> FileProbe:
    """The probe of a file given its dim sizes and its variables as (name, dims, dtype, attrs, read values)."""
    digest = hashlib.sha1(repr(sorted((d, n) for d, n in sizes.items() if d != concat_dim)).encode())
    concat_raw, concat_attrs = None, {}
    for name, dims, dtype, attrs, values in variables:
        decoding = {key: attrs[key] for key in _DECODING_ATTRS if key in attrs and name != concat_dim}
        digest.update(repr((name, tuple(dims), np.dtype(dtype).str, sorted(decoding.items()))).encode())
        if name == concat_dim and tuple(dims) == (concat_dim,):
            concat_raw, concat_attrs = np.asarray(values()), attrs
        elif tuple(dims) == (name,):
            # A grid coordinate: files whose grids differ must not share a fingerprint.
            digest.update(np.ascontiguousarray(values()).tobytes())
    return FileProbe(path, nbytes, classic, digest.hexdigest(), sizes, concat_raw, concat_attrs)


def probe_hdf5(path: str, stream: BlockReader, remote: RemoteFile, concat_dim: str) -> FileProbe:
    """Probe a NetCDF-4 (HDF5) file through h5py on a file object (a remote file's ranged reads).

    Dims are the file's dimension scales; a variable's dims are recorded by their sizes (reading
    its dimension list costs more than the rest of the probe), which is enough to tell apart the
    structures of one archive: the reference file of each is read in full through xarray.
    """
    import h5py

    with NETCDF_LOCK, h5py.File(stream, "r") as ds:
        datasets = {name: item for name, item in ds.items() if isinstance(item, h5py.Dataset)}
        if len(datasets) < len(ds):
            raise ValueError("groups: take the full look")
        scales = {name: item for name, item in datasets.items() if item.attrs.get("CLASS") == b"DIMENSION_SCALE"}
        sizes = {name: int(item.shape[0]) for name, item in scales.items()}
        variables = []
        for name, item in datasets.items():
            dims = (name,) if name in scales else tuple(f"<{n}>" for n in item.shape)
            keys = [key for key in _DECODING_ATTRS if key in item.attrs]
            attrs = {key: _plain(item.attrs[key]) for key in keys}
            if name == concat_dim:
                attrs = {key: _plain(value) for key, value in item.attrs.items() if not _hidden(key)}
            variables.append((name, dims, item.dtype, attrs, lambda item=item: item[...]))
        probe = _probe(path, remote.size, False, sizes, variables, concat_dim)
    return dataclasses.replace(probe, bytes_read=remote.bytes_read)


def _hidden(key: str) -> bool:
    """HDF5 attributes of the netCDF-4 layer itself, which xarray does not show."""
    return key in ("CLASS", "NAME", "DIMENSION_LIST", "REFERENCE_LIST") or key.startswith("_Netcdf4")


#: Bytes fetched up front from each end of every remote file, a batch of files at once (with the tail
#: aligned to a block, at most 64 KiB a file). NetCDF-4 keeps
#: its metadata at the start and, written by the netCDF library, small coordinate variables
#: after the data, at the end; what lies elsewhere is fetched block by block on demand.
END_BYTES = 24 * 1024
_BLOCK = 16 * 1024
#: Ranged requests in flight at once when fetching heads.
REQUESTS_IN_FLIGHT = 32
#: Files whose ends are fetched, then parsed, together: their bytes (64 KiB a file at most, 32 MiB a batch)
#: are all the launcher holds of them, whatever the file count. A batch is 32 waves of REQUESTS_IN_FLIGHT,
#: so the one partly filled wave at its end costs little.
FILES_PER_BATCH = 512


#: Below this many remote files a pool of processes costs more than it saves: forking the launcher, and each
#: pool process's own session and connections (a few tenths of a second), against 5-10 ms of parsing a file
#: that another core takes over.
POOL_MIN_FILES = 256
#: Remote files a pool process fetches and parses per task: its own connections fetch a task's ends while
#: the other processes parse theirs; small enough that the last tasks leave no core idle for long.
FILES_PER_TASK = 128


def probe_remote(files: list[ListedFile], concat_dim: str) -> list[FileProbe | None]:
    """Probe remote files, a batch at a time: both ends of a batch's files fetched concurrently, then parsed.

    Many files are probed in a pool of processes (planning.inputs.probe_pool), each fetching
    and parsing its own FILES_PER_TASK files at a time (parsing is Python and HDF5, which hold
    one core each); fewer, FILES_PER_BATCH at a time in this process. Either way the result is
    the same, in the same order. None for a file that needs the full look (an unusual layout,
    a truncated or unreadable file: the full look names the problem).
    """
    processes = pool_processes()
    if len(files) < POOL_MIN_FILES or processes < 2:
        batches = (files[start : start + FILES_PER_BATCH] for start in range(0, len(files), FILES_PER_BATCH))
        chunks: Iterator[Iterable[FileProbe | None]] = (_probe_batch(batch, concat_dim) for batch in batches)
    else:
        tasks = [files[start : start + FILES_PER_TASK] for start in range(0, len(files), FILES_PER_TASK)]
        chunks = map_in_pool(functools.partial(_probe_task, concat_dim), tasks, processes)
    probes: list[FileProbe | None] = []
    shared: dict[str, Any] = {}
    for chunk in chunks:
        probes += (_shared(probe, shared) for probe in chunk)
    return probes


def _probe_task(concat_dim: str, files: list[ListedFile]) -> list[FileProbe | None]:
    """A pool process's task: its files fetched on its own connections (fsspec and gcsfs make new ones in a
    forked process), then parsed."""
    return list(_probe_batch(files, concat_dim))


def _probe_batch(files: list[ListedFile], concat_dim: str) -> Iterator[FileProbe | None]:
    fs, _, _ = fsspec.get_fs_token_paths(files[0].path)
    paths = [fs._strip_protocol(f.path) for f in files]
    head_ends = [min(END_BYTES, f.nbytes) for f in files]
    # The tail starts on a block boundary, so its blocks can be cached whole.
    tail_starts = [max(end, (f.nbytes - END_BYTES) // _BLOCK * _BLOCK) for f, end in zip(files, head_ends)]
    # A small file's two ends meet: one request fetches it whole (a request costs the store more than its bytes).
    whole = [start == end for end, start in zip(head_ends, tail_starts)]
    split = [i for i, fetched_whole in enumerate(whole) if not fetched_whole]
    starts = [0] * len(files) + [tail_starts[i] for i in split]
    ends = [f.nbytes if w else end for f, end, w in zip(files, head_ends, whole)] + [files[i].nbytes for i in split]
    paths += [paths[i] for i in split]
    fetched = fs.cat_ranges(paths, starts, ends, batch_size=REQUESTS_IN_FLIGHT, on_error="return")
    tails = dict(zip(split, fetched[len(files) :]))
    del fetched[len(files) :]
    for i, listed in enumerate(files):
        check_stopped()  # a stopped build (Ctrl-C, SIGTERM) unwinds here, between two files
        head, fetched[i] = fetched[i], None  # each file's bytes go once it is parsed
        if not whole[i]:
            tail = tails.pop(i)
        elif isinstance(head, bytes):
            head, tail = head[: head_ends[i]], head[tail_starts[i] :]
        else:
            tail = head  # the error, for both ends
        remote = RemoteFile(listed.path, listed.nbytes)
        probe = None
        if not isinstance(head, bytes) or not isinstance(tail, bytes):
            yield None  # the full look reports why the file cannot be read
            continue
        with contextlib.suppress(Exception):
            if head.startswith(HDF5_SIGNATURE):
                reader = BlockReader(remote, _BLOCK)
                reader.prefetch([(0, head_ends[i]), (tail_starts[i], listed.nbytes)], [head, tail])
                probe = probe_hdf5(listed.path, reader, remote, concat_dim)
            elif head.startswith(b"CDF"):
                remote.bytes_read += len(head)
                probe = probe_classic(listed.path, read_header(io.BytesIO(head)), remote, concat_dim)
        yield probe


def _shared(probe: FileProbe | None, seen: dict[str, Any]) -> FileProbe | None:
    """The probe with its dim sizes and concat attributes the very objects of earlier probes equal to them.

    Files of one archive have the same few of each: sharing them keeps a probe's own memory to its
    path, fingerprint and concat values (probes are never modified: FileProbe is frozen, its dicts
    read only).
    """
    if probe is None:
        return None
    sizes = seen.setdefault(repr(sorted(probe.sizes.items())), probe.sizes)
    attrs = seen.setdefault(repr(sorted(probe.concat_attrs.items())), probe.concat_attrs)
    fingerprint = seen.setdefault(probe.fingerprint, probe.fingerprint)
    return dataclasses.replace(probe, sizes=sizes, concat_attrs=attrs, fingerprint=fingerprint)


def probe_classic(path: str, header: ClassicHeader, remote: RemoteFile, concat_dim: str) -> FileProbe:
    """Probe a classic file from its header; dim coordinates are read by their byte ranges."""
    refuse_truncated(path, remote.size, header.expected_size())
    sizes: dict[str, int] = {}
    variables = []
    for name, variable in header.variables.items():
        sizes.update(zip(variable.dims, variable.shape))
        box = [(0, n) for n in variable.shape]
        read = functools.partial(read_raw, remote.fetch, variable, header.record_size, box)
        variables.append((name, variable.dims, variable.dtype, {k: _plain(a) for k, a in variable.attrs.items()}, read))
    probe = _probe(path, remote.size, True, sizes, variables, concat_dim)
    return dataclasses.replace(probe, bytes_read=remote.bytes_read)
