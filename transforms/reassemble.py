"""Beam stages of reassembly: samples sorted into bucket files by output chunk, then each chunk assembled and written.

    Create(sample files) -> Reshuffle -> ScanFile: each file's samples, a batch at a time, appended as frames
    to the bucket files of the output chunks they reach (halo included) -> (chunk, bucket path) -> GroupByKey
    -> AssembleChunk: one task per chunk reads its buckets frame by frame, reassembles the chunk's cells and
    writes them as one Zarr region (its own Zarr chunks), a variable at a time.

Only paths ride the GroupByKey (the local runner holds every grouped value in memory: DESIGN.md,
decision 3). A scan holds one batch; a process assembles one chunk at a time (its other threads wait),
so a worker holds one chunk, its halo, and a batch. Every stage takes what it needs from the plan it
is given: no state on the driver.
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import ctypes.util
import dataclasses
import functools
import json
import math
import posixpath
import threading
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence

import apache_beam as beam
import fsspec
import numpy as np

from schemas.prediction_files import read_predictions
from schemas.reader import Reader
from schemas.reassembly import BATCH, Reassembly
from schemas.schema import Schema

#: Records a scan decodes at once (a few MB of samples: what a scan holds).
SCAN_RECORDS = 64
#: Where a chunk's task marks it written (the progress line counts these).
DONE_DIR = "done"


@dataclasses.dataclass(frozen=True)
class ReassemblePlan:
    """Everything a worker needs: the output's schema, the grid's chunking, where buckets and the store go."""

    output: str
    schema: Schema
    split: str | None
    blend: str
    layout: str
    dims: Mapping[str, Sequence[str]]
    chunk_dim: str  # the grid dim chunks are cut along (the first placed one)
    chunk_length: int  # cells per chunk along it
    num_chunks: int
    store: str  # the Zarr store written region by region
    work: str  # bucket files and done markers (removed at the end)
    records: bool  # True: the split's own records (files are shard names); False: prediction files

    def assembly(self, region: tuple[int, int] | None = None) -> Reassembly:
        bounds = None if region is None else (self.chunk_dim or None, *region)
        return Reassembly(self.schema, self.split, self.blend, self.dims, self.output, self.layout, bounds)

    def bounds(self, chunk: int) -> tuple[int, int]:
        start = chunk * self.chunk_length
        return start, min(start + self.chunk_length, self.grid_length)

    @property
    def grid_length(self) -> int:
        return self.assembly((0, 0)).checked_axis(self.chunk_dim).length


def iter_file(plan: ReassemblePlan, name: str) -> Iterator[dict[str, np.ndarray]]:
    """A sample file's batches: a shard of the split's records, or a prediction file."""
    if plan.records:
        reader = Reader(plan.output, plan.split, schema=plan.schema)
        shard = next(s for s in reader.shards if s.file == name)
        yield from reader.iter_chunks([shard], chunk=SCAN_RECORDS)
    else:
        yield from read_predictions(name, plan.schema)


def reach_of(plan: ReassemblePlan, assembly: Reassembly, batch: Mapping[str, np.ndarray]):
    """Per sample of ``batch``, the first and last chunk it reaches (keys checked on the whole grid)."""
    axis = assembly.checked_axis(plan.chunk_dim)
    low, high = axis.reach()
    starts = np.asarray(batch[axis.index_name]).reshape(-1) + axis.origin - axis.first
    first = np.maximum((starts + low) // plan.chunk_length, 0)
    last = np.minimum((starts + high - 1) // plan.chunk_length, plan.num_chunks - 1)
    return first, last


def chunks_of(plan: ReassemblePlan, assembly: Reassembly, batch: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """Per sample of ``batch``, the chunks it reaches."""
    return [np.arange(a, b + 1) for a, b in zip(*reach_of(plan, assembly, batch))]


def scan_file(name: str, plan: ReassemblePlan) -> Iterator[tuple[int, str]]:
    """One file's samples into bucket files by chunk, a batch at a time: (chunk, bucket path) per bucket written.

    Each batch's samples go straight to their chunks' open bucket files (as frames appended), so a scan
    holds one decoded batch, never the samples of several chunks."""
    map_large_arrays()
    assembly = plan.assembly((0, 0))  # (checks keys only: holds no cells)
    with _OpenBuckets(plan) as buckets:
        for batch in iter_file(plan, name):
            assembly.check_keys(batch)
            first, last = reach_of(plan, assembly, batch)
            for extra in range(int((last - first).max(initial=0)) + 1):  # the chunk it starts in, then its halo
                chunks = np.where(first + extra <= last, first + extra, -1)
                for chunk in np.unique(chunks[chunks >= 0]):
                    rows = np.flatnonzero(chunks == chunk)
                    whole = len(rows) == len(chunks)
                    yield from buckets.write(int(chunk), batch if whole else {k: v[rows] for k, v in batch.items()})
        yield from buckets.close()


#: Bucket files a scan keeps open at once (remote files each buffer a block before they upload it).
OPEN_BUCKETS = {"local": 256, "remote": 8}


class _OpenBuckets:
    """A scan's bucket files, one open per chunk (up to OPEN_BUCKETS: the least recently written is finished first)."""

    def __init__(self, plan: ReassemblePlan):
        from schemas.urls import is_remote

        self.plan = plan
        self.limit = OPEN_BUCKETS["remote" if is_remote(plan.work) else "local"]
        self.open: dict[int, tuple[str, object]] = {}  # chunk -> (path, stream), least recently written first

    def write(self, chunk: int, arrays: Mapping[str, np.ndarray]) -> Iterator[tuple[int, str]]:
        """Append ``arrays`` to the chunk's bucket; (chunk, path) of any bucket finished to make room."""
        entry = self.open.pop(chunk, None)
        if entry is None:
            while len(self.open) >= self.limit:
                yield self._finish(next(iter(self.open)))
            path = posixpath.join(self.plan.work, f"chunk-{chunk:06d}-{uuid.uuid4().hex}.bucket")
            stream = fsspec.open(path, "wb").open()
            stream.write(_BUCKET_MAGIC)
            entry = (path, stream)
        self.open[chunk] = entry
        write_frame(entry[1], arrays)

    def _finish(self, chunk: int) -> tuple[int, str]:
        path, stream = self.open.pop(chunk)
        stream.close()
        return chunk, path

    def close(self) -> Iterator[tuple[int, str]]:
        while self.open:
            yield self._finish(next(iter(self.open)))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for _, stream in self.open.values():  # (a failed scan: the work folder is removed whole)
            stream.close()
        self.open = {}


#: A bucket file: this, then frames: each the length of its JSON header (8 bytes, little-endian), the header
#: ([name, dtype, shape] per array), then the arrays' bytes.
_BUCKET_MAGIC = b"XTFBUCKET2"


def write_frame(stream, arrays: Mapping[str, np.ndarray]) -> None:
    """One batch of samples appended to a bucket file: a header, then each array's raw bytes (no pickle)."""
    header = json.dumps([[name, a.dtype.str, list(a.shape)] for name, a in arrays.items()]).encode()
    stream.write(len(header).to_bytes(8, "little") + header)
    for values in arrays.values():
        stream.write(np.ascontiguousarray(values).data)


def iter_bucket(stream, where: str) -> Iterator[dict[str, np.ndarray]]:
    """A bucket file's frames, one batch at a time; ValueError unless it is whole (a file of ours, but from disk)."""
    if stream.read(len(_BUCKET_MAGIC)) != _BUCKET_MAGIC:
        raise ValueError(f"{where}: not a bucket file")
    while size := stream.read(8):
        if len(size) < 8:
            raise ValueError(f"{where}: cut short in a frame's header")
        header = stream.read(int.from_bytes(size, "little"))
        try:
            entries = json.loads(header)
        except ValueError:
            raise ValueError(f"{where}: a frame's header is not JSON") from None
        frame = {}
        for name, dtype, shape in entries:
            dtype = np.dtype(dtype)
            if dtype.kind not in "biuf" or not all(isinstance(n, int) and n >= 0 for n in shape):
                raise ValueError(f"{where}: {name} holds {dtype} of shape {shape}, not an array of numbers")
            data = stream.read(math.prod(shape) * dtype.itemsize)
            if len(data) < math.prod(shape) * dtype.itemsize:
                raise ValueError(f"{where}: cut short in {name}")
            frame[name] = np.frombuffer(data, dtype).reshape(shape)
        yield frame


#: One chunk's cells in memory per process at a time: the memory a worker needs is one chunk, whatever its threads.
_ONE_CHUNK = threading.Lock()
#: Allocations from this size on get their own memory mappings (glibc's M_MMAP_THRESHOLD), given back when freed.
MAPPED_FROM_BYTES = 2**20


@functools.cache
def map_large_arrays() -> None:
    """Have glibc map every allocation of MAPPED_FROM_BYTES or more on its own, in this process (once).

    By default glibc raises that threshold to the size of the largest block freed so far (up to 32 MB), so
    once a chunk's arrays are freed, the next ones (and zarr's compressed buffers, in its threads' arenas)
    come from heaps that fragment and are seldom given back: 140 MB more peak RSS on the 1x benchmark.
    Elsewhere (not glibc) nothing changes."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallopt(ctypes.c_int(-3), ctypes.c_int(MAPPED_FROM_BYTES))  # M_MMAP_THRESHOLD (also fixes it)
    except (OSError, AttributeError):
        pass


def assemble_chunk(element: tuple[int, Sequence[str]], plan: ReassemblePlan) -> int:
    """A chunk's cells from its buckets, written as the chunk's region of the store (its own Zarr chunks)."""
    chunk, paths = element
    start, stop = plan.bounds(chunk)
    map_large_arrays()
    with _ONE_CHUNK:
        assembly = plan.assembly((start, stop))
        for batch in _batches(_frames(sorted(paths)), BATCH):  # a batch in memory at a time, besides the chunk
            assembly.add_all([batch])
        write_region(plan, assembly, chunk)
        del assembly
    fs = fsspec.core.url_to_fs(plan.work)[0]
    for path in paths:
        fs.rm(fsspec.core.url_to_fs(path)[1])
    with fsspec.open(posixpath.join(plan.work, DONE_DIR, f"{chunk:06d}"), "wb") as stream:
        stream.write(b"")
    return chunk


def _frames(paths: Sequence[str]) -> Iterator[dict[str, np.ndarray]]:
    for path in paths:
        with fsspec.open(path, "rb") as stream:
            yield from iter_bucket(stream, path)


def _batches(frames: Iterable[dict[str, np.ndarray]], size: int) -> Iterator[dict[str, np.ndarray]]:
    """Frames joined into batches of about ``size`` samples (frames are small: a scan's batch over every chunk)."""
    pending: list[dict[str, np.ndarray]] = []
    held = 0
    for frame in frames:
        if pending and frame.keys() != pending[0].keys():
            yield _joined(pending)
            pending, held = [], 0
        pending.append(frame)
        held += len(next(iter(frame.values()), ()))
        if held >= size:
            yield _joined(pending)
            pending, held = [], 0
    if pending:
        yield _joined(pending)


def _joined(frames: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    return frames[0] if len(frames) == 1 else {k: np.concatenate([f[k] for f in frames]) for k in frames[0]}


#: Variables a chunk's task writes at once.
WRITERS = 2


def write_region(plan: ReassemblePlan, assembly: Reassembly, chunk: int) -> None:
    """The chunk's variables into their arrays of the store (made by the template): the chunk's region of those
    along the chunked dim, and (by the first chunk's task) the others whole; each variable's cells freed once
    written. Values as ``Reassembly.dataset`` gives them, written with zarr directly (xarray's encoding of a
    float or integer variable with its fill value leaves the values as they are)."""
    import zarr

    start, stop = plan.bounds(chunk)
    group = zarr.open_group(plan.store, mode="r+", zarr_format=2)
    # Two variables in flight: one compressing and writing while the next is made ready (NaN where uncovered).
    with concurrent.futures.ThreadPoolExecutor(WRITERS) as pool:
        writing: list[concurrent.futures.Future] = []
        for name, dims, values in assembly.variables():
            array = group[name]
            if list(array.attrs["_ARRAY_DIMENSIONS"]) != list(dims):
                raise ValueError(f"{plan.store}: {name} has dims {array.attrs['_ARRAY_DIMENSIONS']}, not {dims}")
            if plan.chunk_dim not in dims and chunk != 0:
                continue  # a variable without the chunked dim (a static field): written whole, by one task
            region = tuple(slice(start, stop) if d == plan.chunk_dim else slice(None) for d in dims)
            if _holds_a_value(values, array.fill_value):  # (zarr need not look for an empty chunk: it is not one)
                array = array.with_config({"write_empty_chunks": True})
            while len(writing) >= WRITERS:
                writing.pop(0).result()
            writing.append(pool.submit(array.__setitem__, region, values.astype(array.dtype, copy=False)))
            del values
        for future in writing:
            future.result()


def _holds_a_value(values: np.ndarray, fill) -> bool:
    """True if a few of ``values`` (one every 4,099) show they are not all the fill value (False: not known)."""
    if values.dtype.kind != "f" or fill is None:
        return False
    probe = values.reshape(-1)[::4099]
    return not (np.isnan(probe) if np.isnan(fill) else probe == fill).all()


@dataclasses.dataclass
class Reassemble(beam.PTransform):
    """Sample files -> chunks written to the plan's Zarr store (one element per chunk written)."""

    plan: ReassemblePlan

    def expand(self, files):
        return (
            files
            | "Spread" >> beam.Reshuffle()
            | "ScanFile" >> beam.FlatMap(scan_file, self.plan)
            | "ByChunk" >> beam.GroupByKey()
            | "AssembleChunk" >> beam.Map(assemble_chunk, self.plan)
        )


def chunk_length(cells_per_step: int, budget_bytes: float) -> int:
    """Cells along the chunked dim per chunk: a chunk's sums and weights (float64) within the budget."""
    return max(1, math.floor(budget_bytes / max(1, 16 * cells_per_step)))
