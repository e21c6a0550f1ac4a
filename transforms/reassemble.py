"""Beam stages of reassembly: samples sorted into bucket files by output chunk, then each chunk assembled and written.

    Create(sample files) -> Reshuffle -> ScanFile: each file's samples, a batch at a time, held by chunk and
    appended as frames to the bucket files of the output chunks they reach (halo included) -> (chunk, bucket
    path) -> GroupByKey -> AssembleChunk: one task per chunk reads its buckets' keys, then each variable's
    arrays in turn, places them and writes that variable's part of the chunk as one Zarr region (its own
    Zarr chunks) before it reads the next.

Only paths ride the GroupByKey (the local runner holds every grouped value in memory: docs/design.md,
decision 3). A scan holds one batch and PENDING_BYTES of samples; a process's chunk tasks hold about one
chunk's values between them (_HELD), so a worker holds one chunk, its halo, and a batch, whatever its
threads. Every stage takes what it needs from the plan it is given: no state on the driver.

Where the samples are a local output's own records (``plan.references``), buckets hold no values: a scan
reads each record's keys from its tail and notes where it is (schemas.record_refs), and the chunk's task
reads each record whole once (checked against its reference), then each variable's bytes alone.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import ctypes
import ctypes.util
import dataclasses
import functools
import hashlib
import json
import math
import os
import posixpath
import shutil
import tempfile
import threading
import uuid
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence

import apache_beam as beam
import fsspec
import numpy as np

from planning.run.cancellation import writing
from schemas.prediction_files import read_predictions
from schemas.reader import Reader
from schemas.reassembly import BATCH, COVERAGE, Reassembly
from schemas.record_refs import REF_BUCKET, REF_NAMES, ReferencedRecords
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
    references: bool = False  # buckets point at the records (a local, uncompressed output's own) instead of copies
    files: tuple[str, ...] = ()  # the sample files: a bucket's errors name the file its samples came from

    def source_of(self, bucket: str) -> str:
        """The sample file a bucket's samples came from (by the hash its name holds; else the output)."""
        part = posixpath.basename(bucket).split("-")
        digest = part[2] if len(part) > 2 else ""
        return next((f for f in self.files if source_digest(f) == digest), self.output)

    def assembly(self, region: tuple[int, int] | None = None, where: str | None = None) -> Reassembly:
        """The reassembly of a region (None: the whole grid); ``where`` names what its errors are about (a prediction
        file; default: the output)."""
        bounds = None if region is None else (self.chunk_dim or None, *region)
        where = where or self.output
        return Reassembly(self.schema, self.split, self.blend, self.dims, where, self.layout, bounds, self.records)

    @property
    def most_samples(self) -> int:
        """The most distinct samples the split's grid can hold: a sample file declaring more is refused unread."""
        return math.prod(max(1, a.length) for a in self.assembly().checked)

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
        yield from read_predictions(name, plan.schema, plan.most_samples)


def scanned_batches(plan: ReassemblePlan, name: str) -> Iterator[dict[str, np.ndarray]]:
    """What a scan sorts into buckets from a sample file: its samples, or (``plan.references``) their keys and
    where each is."""
    if not plan.references:
        yield from iter_file(plan, name)
        return
    number = next(i for i, s in enumerate(plan.schema.splits[plan.split]) if s.file == name)
    with ReferencedRecords(plan.output, plan.schema, plan.split) as records:
        yield from records.index_batches(number)


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

    Each batch's samples are held by chunk (up to PENDING_BYTES in all) and go to their chunks' open bucket
    files as one frame each, so a scan holds a batch and its pending samples, never the samples of a chunk."""
    map_large_arrays()
    assembly = plan.assembly((0, 0), where=name)  # (checks keys and shapes only: holds no cells)
    with _OpenBuckets(plan, name) as buckets:
        pending = _Pending(buckets)
        for batch in scanned_batches(plan, name):
            assembly.check_keys(batch)
            if not plan.records:
                assembly.check_shapes(batch)
            kept = {n for group in assembly.placed_groups(batch) for n in group}
            kept.update(REF_NAMES)
            batch = {n: v for n, v in batch.items() if n in kept or n.startswith("index/")}  # (not coord/*)
            first, last = reach_of(plan, assembly, batch)
            for extra in range(int((last - first).max(initial=0)) + 1):  # the chunk it starts in, then its halo
                chunks = np.where(first + extra <= last, first + extra, -1)
                if chunks[0] >= 0 and (chunks == chunks[0]).all():
                    yield from pending.add(int(chunks[0]), batch)  # (the batch as it is, no copy)
                    continue
                # The samples sorted by chunk (in their order within each), taken once: each chunk's a slice.
                order = np.argsort(chunks, kind="stable")
                order = order[chunks[order] >= 0]
                if not len(order):
                    continue
                ordered = chunks[order]
                taken = {k: v[order] for k, v in batch.items()}
                ends = [*(np.flatnonzero(np.diff(ordered)) + 1).tolist(), len(order)]
                for begin, end in zip([0, *ends[:-1]], ends):
                    yield from pending.add(int(ordered[begin]), {k: v[begin:end] for k, v in taken.items()})
        yield from pending.flush()
        yield from buckets.close()
    trim_free_memory()


#: Bytes of samples a scan holds for its chunks before it writes them out, each chunk's as one frame: frames of
#: many samples, even where a batch's samples spread over many chunks (a sample or two each).
PENDING_BYTES = 24 * 2**20


class _Pending:
    """A scan's samples held by chunk until PENDING_BYTES are held, then written as one frame per chunk."""

    def __init__(self, buckets: _OpenBuckets):
        self.buckets = buckets
        self.held: dict[int, list[Mapping[str, np.ndarray]]] = {}
        self.bytes = 0

    def add(self, chunk: int, arrays: Mapping[str, np.ndarray]) -> Iterator[tuple[int, str]]:
        pieces = self.held.setdefault(chunk, [])
        if pieces and _layout(pieces[0]) != _layout(arrays):  # (a frame holds samples of one layout)
            yield from self.buckets.write(chunk, self.held.pop(chunk))
            pieces = self.held.setdefault(chunk, [])
        pieces.append(arrays)
        self.bytes += sum(a.nbytes for a in arrays.values())
        if self.bytes >= PENDING_BYTES:
            yield from self.flush()

    def flush(self) -> Iterator[tuple[int, str]]:
        for chunk in sorted(self.held):
            yield from self.buckets.write(chunk, self.held[chunk])
        self.held, self.bytes = {}, 0


def _layout(arrays: Mapping[str, np.ndarray]) -> list:
    return [(name, a.dtype.str, a.shape[1:]) for name, a in arrays.items()]


#: Bucket files a scan keeps open at once (remote files each buffer a block before they upload it).
OPEN_BUCKETS = {"local": 256, "remote": 8}


class _OpenBuckets:
    """A scan's bucket files, one open per chunk (up to OPEN_BUCKETS: the least recently written is finished first)."""

    def __init__(self, plan: ReassemblePlan, source: str):
        from schemas.urls import is_remote

        self.plan = plan
        self.limit = OPEN_BUCKETS["remote" if is_remote(plan.work) else "local"]
        self.open: dict[int, tuple[str, object]] = {}  # chunk -> (path, stream), least recently written first
        # A chunk's task takes its buckets in name order: named by the file scanned and their order in its scan,
        # overlapping samples blend in the same order every run (sums in another order differ in their last
        # bits); the random part keeps a retried scan's buckets apart from its failed attempt's.
        self.source = source_digest(source)
        self.made: dict[int, int] = {}

    def write(
        self, chunk: int, arrays: Mapping[str, np.ndarray] | Sequence[Mapping[str, np.ndarray]]
    ) -> Iterator[tuple[int, str]]:
        """Append ``arrays`` (or pieces of one layout, as one frame) to the chunk's bucket; (chunk, path) of any
        bucket finished to make room."""
        entry = self.open.pop(chunk, None)
        if entry is None:
            while len(self.open) >= self.limit:
                yield self._finish(next(iter(self.open)))
            self.made[chunk] = made = self.made.get(chunk, 0) + 1
            name = f"chunk-{chunk:06d}-{self.source}-{made:06d}-{uuid.uuid4().hex[:12]}.bucket"
            path = posixpath.join(self.plan.work, name)
            with writing():
                stream = fsspec.open(path, "wb").open()
                stream.write(_BUCKET_MAGIC)
            entry = (path, stream)
        self.open[chunk] = entry
        with writing():
            write_frame(entry[1], arrays)

    def _finish(self, chunk: int) -> tuple[int, str]:
        path, stream = self.open.pop(chunk)
        with writing():
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


def source_digest(source: str) -> str:
    """The part of a bucket's name that says which sample file it holds samples of."""
    return hashlib.sha1(source.encode()).hexdigest()[:16]


#: A bucket file: this, then frames: each the length of its JSON header (8 bytes, little-endian), the header
#: ([name, dtype, shape] per array), then the arrays' bytes.
_BUCKET_MAGIC = b"XTFBUCKET2"


def write_frame(stream, arrays: Mapping[str, np.ndarray] | Sequence[Mapping[str, np.ndarray]]) -> None:
    """One batch of samples appended to a bucket file: a header, then each array's raw bytes (no pickle).
    ``arrays`` may come in pieces (of one layout): their samples are one frame."""
    pieces = [arrays] if isinstance(arrays, Mapping) else list(arrays)
    first = pieces[0]
    samples = sum(len(next(iter(p.values()), ())) for p in pieces)
    header = json.dumps([[name, a.dtype.str, [samples, *a.shape[1:]]] for name, a in first.items()]).encode()
    stream.write(len(header).to_bytes(8, "little") + header)
    for name in first:  # (one write per array: a scan's pieces are often a sample or two each)
        values = first[name] if len(pieces) == 1 else np.concatenate([piece[name] for piece in pieces])
        stream.write(np.ascontiguousarray(values).data)


def iter_bucket(
    stream, where: str, names: Collection[str] | None = None, seen: dict | None = None
) -> Iterator[dict[str, np.ndarray]]:
    """A bucket file's frames, one batch at a time; ValueError unless it is whole (a file of ours, but from disk).
    ``names``: only these arrays of each frame are read (the stream seeks past the others); ``seen``: gets
    {name: values per sample} of every array the frames hold."""
    if stream.read(len(_BUCKET_MAGIC)) != _BUCKET_MAGIC:
        raise ValueError(f"{where}: not a bucket file")
    end = None if names is None else _size(stream)
    at = len(_BUCKET_MAGIC)  # where the stream is, or would be after the arrays skipped so far
    skipped = False
    while True:
        if skipped:
            stream.seek(at)
            skipped = False
        size = stream.read(8)
        if not size:
            break
        if len(size) < 8:
            raise ValueError(f"{where}: cut short in a frame's header")
        header = stream.read(int.from_bytes(size, "little"))
        at += 8 + len(header)
        try:
            entries = json.loads(header)
        except ValueError:
            raise ValueError(f"{where}: a frame's header is not JSON") from None
        frame = {}
        for name, dtype, shape in entries:
            dtype = np.dtype(dtype)
            if dtype.kind not in "biuf" or not all(isinstance(n, int) and n >= 0 for n in shape):
                raise ValueError(f"{where}: {name} holds {dtype} of shape {shape}, not an array of numbers")
            nbytes = math.prod(shape) * dtype.itemsize
            if seen is not None:
                seen.setdefault(name, math.prod(shape[1:]))
            at += nbytes
            if names is not None and name not in names:
                if at > end:
                    raise ValueError(f"{where}: cut short in {name}")
                skipped = True
                continue
            if skipped:
                stream.seek(at - nbytes)
                skipped = False
            data = stream.read(nbytes)
            if len(data) < nbytes:
                raise ValueError(f"{where}: cut short in {name}")
            frame[name] = np.frombuffer(data, dtype).reshape(shape)
        yield frame


class _Held:
    """The share of one chunk's cells this process's tasks hold (placing, or being written): a task takes its
    variable's share before placing it and gives it back once it is written, waiting while it would go over
    HELD_CHUNKS (or, for more than that, until nothing else is held). So a worker holds about one chunk, however
    many threads assemble chunks, and they assemble (and write) different chunks' variables side by side."""

    def __init__(self, limit: float):
        self.limit = limit
        self.held = 0.0
        self._changed = threading.Condition()

    def take(self, share: float) -> None:
        with self._changed:
            self._changed.wait_for(lambda: self.held <= 0 or self.held + share <= self.limit)
            self.held += share

    def give_back(self, share: float) -> None:
        with self._changed:
            self.held = max(0.0, self.held - share)
            self._changed.notify_all()


#: Chunks of cells a process holds at once; a variable being written counts twice (its compressed copy).
HELD_CHUNKS = 1.0
_HELD = _Held(HELD_CHUNKS)
#: Allocations from this size on get their own memory mappings (glibc's M_MMAP_THRESHOLD), given back when freed.
MAPPED_FROM_BYTES = 2**20


@functools.cache
def map_large_arrays() -> None:
    """Have glibc map every allocation of MAPPED_FROM_BYTES or more on its own, in this process (once).

    By default glibc raises that threshold to the size of the largest block freed so far (up to 32 MB), so
    once a chunk's arrays are freed, the next ones (and zarr's compressed buffers, in its threads' arenas)
    come from heaps that fragment and are seldom given back: 140 MB more peak RSS on the 1x benchmark.
    Elsewhere (not glibc) nothing changes."""
    libc = _glibc()
    if libc is not None:
        libc.mallopt(ctypes.c_int(-3), ctypes.c_int(MAPPED_FROM_BYTES))  # M_MMAP_THRESHOLD (also fixes it)


def trim_free_memory() -> None:
    """Give the pages of freed small blocks back to the OS (glibc's malloc_trim), where they would stay: a
    scan's held samples are many small arrays, and what the heaps keep of them would sit under every chunk
    assembled after it (45 MB on the 1x benchmark). Elsewhere (not glibc) nothing happens."""
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(ctypes.c_size_t(0))


@functools.cache
def _glibc():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallopt, libc.malloc_trim  # noqa: B018  (glibc's: elsewhere an AttributeError)
    except (OSError, AttributeError):
        return None
    return libc


def assemble_chunk(element: tuple[int, Sequence[str]], plan: ReassemblePlan) -> int:
    """A chunk's cells from its buckets, written as the chunk's region of the store (its own Zarr chunks).

    The buckets are read once for the samples' keys (coverage, duplicates), then once per variable for its
    arrays only: each variable is placed, written and let go before the next is read, so a task holds a
    variable's share of the chunk (and _HELD bounds what the process's tasks hold together)."""
    chunk, paths = element
    start, stop = plan.bounds(chunk)
    map_large_arrays()
    with _local_copies(sorted(paths)) as files, _chunk_samples(plan, files, sorted(paths)) as samples:
        assembly = plan.assembly((start, stop))
        keys = [a.index_name for a in assembly.checked]
        for only in _each_bucket(plan, assembly, files, sorted(paths)):
            for batch in samples.keys(keys, only):
                assembly.count(batch)
        values = samples.values  # values per sample of each array the samples hold
        groups = assembly.placed_groups(values)
        everything = sum(values[n] for group in groups for n in group if n in values) or 1
        with _RegionWriter(plan, chunk) as writer:
            for group in groups:
                share = 2 * sum(values[n] for n in group) / everything  # (its values, then their compressed copy)
                _HELD.take(share)
                try:
                    for only in _each_bucket(plan, assembly, files, sorted(paths)):
                        for batch in samples.batches(keys, group, only):
                            assembly.place(batch)
                    done = [writer.write(*each) for each in assembly.take_finished()]
                except BaseException:
                    _HELD.give_back(share)
                    raise
                _give_back_when_done(done, share)
            writer.write(COVERAGE, tuple(a.dim for a in assembly.grid_axes), assembly.coverage)
        del assembly
    trim_free_memory()
    fs = fsspec.core.url_to_fs(plan.work)[0]
    with writing():
        for path in paths:
            fs.rm(fsspec.core.url_to_fs(path)[1])
        with fsspec.open(posixpath.join(plan.work, DONE_DIR, f"{chunk:06d}"), "wb") as stream:
            stream.write(b"")
    return chunk


def _each_bucket(
    plan: ReassemblePlan, assembly: Reassembly, files: Sequence[str], names: Sequence[str]
) -> Iterator[list[str] | None]:
    """None (every bucket at once: the output's own records), or each bucket's local path in turn, with
    ``assembly.where`` naming the prediction file its samples came from while it is read (errors name the file)."""
    if plan.records:
        yield None
        return
    try:
        for path, name in zip(files, names):
            assembly.where = plan.source_of(name)
            yield [path]
    finally:
        assembly.where = plan.output


def _chunk_samples(
    plan: ReassemblePlan, files: Sequence[str], names: Sequence[str]
) -> _CopiedSamples | _ReferencedSamples:
    """A chunk's samples from its bucket files (``files``: local copies of the buckets ``names``)."""
    return _ReferencedSamples(plan, files, names) if plan.references else _CopiedSamples(files)


class _CopiedSamples:
    """A chunk's samples as its buckets hold them: keys first, then a group of arrays per pass (the rest skipped)."""

    def __init__(self, files: Sequence[str]):
        self.files = files
        self.values: dict[str, int] = {}  # values per sample of each array the buckets hold (once keys are read)

    def keys(self, keys: Sequence[str], files: Sequence[str] | None = None) -> Iterator[dict[str, np.ndarray]]:
        """The samples' keys, of all the buckets or of ``files`` among them."""
        return _batches(_frames(self.files if files is None else files, keys, self.values), BATCH)

    def batches(
        self, keys: Sequence[str], group: Sequence[str], files: Sequence[str] | None = None
    ) -> Iterator[dict[str, np.ndarray]]:
        """The samples' keys and the group's arrays, of all the buckets or of ``files`` among them."""
        return _batches(_frames(self.files if files is None else files, [*keys, *group]), BATCH)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass


#: Samples read by reference and placed at once (a batch's values fill one array, reused).
REFERENCED_BATCH = 256


class _ReferencedSamples:
    """A chunk's samples as references to the records: every record read and checked once (with the keys), then
    each group's features read alone."""

    def __init__(self, plan: ReassemblePlan, files: Sequence[str], names: Sequence[str]):
        self.files, self.names = files, names  # (errors name the buckets, not their local copies)
        self.records = ReferencedRecords(plan.output, plan.schema, plan.split)
        self.values = {f.name: f.size for f in plan.schema.features}
        self.samples = 0

    def keys(self, keys: Sequence[str], files: None = None) -> Iterator[dict[str, np.ndarray]]:
        """Every referenced record's keys (``files``: None, as _each_bucket gives for records)."""
        parts = []
        for number, path in enumerate(self.files):
            for frame in _frames([path], [*keys, *REF_NAMES]):
                missing = [n for n in (*keys, *REF_NAMES) if n not in frame]
                if missing:
                    raise ValueError(f"{self.names[number]}: a frame without {missing[0]}: not a bucket of references")
                frame[REF_BUCKET] = np.full(len(frame[REF_NAMES[0]]), number, dtype=np.int64)
                parts.append(frame)
        if not parts:
            return iter(())
        refs = _joined(parts)
        self.samples = len(refs[REF_BUCKET])
        return self.records.checked(refs, self.names, keys)

    def batches(self, keys: Sequence[str], group: Sequence[str], files: None = None) -> Iterator[dict[str, np.ndarray]]:
        # One array per feature for every batch (placing copies the values out): a batch's values are fresh
        # pages of their own mapping otherwise, each faulted in anew.
        features = self.records.features
        size = REFERENCED_BATCH
        reused = {n: np.empty((size, *features[n].shape), features[n].dtype) for n in group if n in features}
        for begin in range(0, self.samples, size):
            stop = min(begin + size, self.samples)
            batch = {name: self.records.refs[name][begin:stop] for name in keys}
            for name in group:
                batch[name] = self.records.values(name, begin, stop, reused.get(name))
            yield batch

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.records.close()


def _give_back_when_done(futures: Sequence[concurrent.futures.Future | None], share: float) -> None:
    """The share given back to _HELD once every one of ``futures`` is done (now, if there are none)."""
    waiting = [f for f in futures if f is not None]
    if not waiting:
        _HELD.give_back(share)
        return
    left = [len(waiting)]
    lock = threading.Lock()

    def one_done(_):
        with lock:
            left[0] -= 1
            last = left[0] == 0
        if last:
            _HELD.give_back(share)

    for future in waiting:
        future.add_done_callback(one_done)


@contextlib.contextmanager
def _local_copies(paths: Sequence[str]) -> Iterator[list[str]]:
    """The bucket files as local paths: remote ones copied to a temporary folder first (each is read once per
    variable, seeking past the others' arrays: a local file's seeks cost nothing, a remote one's a request)."""
    from schemas.urls import is_remote

    if not any(is_remote(p) for p in paths):
        yield list(paths)
        return
    with tempfile.TemporaryDirectory(prefix="xtf-buckets-") as folder:
        local = []
        for i, path in enumerate(paths):
            local.append(os.path.join(folder, f"{i:06d}.bucket"))
            with fsspec.open(path, "rb") as source, open(local[-1], "wb") as target:
                shutil.copyfileobj(source, target, 2**22)
        yield local


def _frames(paths: Sequence[str], names: Collection[str] | None = None, seen: dict | None = None):
    for path in paths:
        with fsspec.open(path, "rb") as stream:
            yield from iter_bucket(stream, path, names, seen)


def _batches(frames: Iterable[dict[str, np.ndarray]], size: int) -> Iterator[dict[str, np.ndarray]]:
    """Frames joined into batches of about ``size`` samples (a frame holds what a scan held for one chunk)."""
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


class _RegionWriter:
    """A chunk's variables written into their arrays of the store (made by the template) as they come: the chunk's
    region of those along the chunked dim, and (by the first chunk's task) the others whole. Values as
    ``Reassembly.dataset`` gives them, written with zarr directly (xarray's encoding of a float or integer variable
    with its fill value leaves the values as they are); up to WRITERS compressing and writing at once."""

    def __init__(self, plan: ReassemblePlan, chunk: int):
        import zarr

        self.plan, self.chunk = plan, chunk
        self.group = zarr.open_group(plan.store, mode="r+", zarr_format=2)
        self.pool = concurrent.futures.ThreadPoolExecutor(WRITERS)
        self.writing: list[concurrent.futures.Future] = []

    def write(self, name: str, dims: tuple[str, ...], values: np.ndarray) -> concurrent.futures.Future | None:
        """The variable's region submitted for writing (its future; None: not this task's to write)."""
        plan = self.plan
        array = self.group[name]
        if list(array.attrs["_ARRAY_DIMENSIONS"]) != list(dims):
            raise ValueError(f"{plan.store}: {name} has dims {array.attrs['_ARRAY_DIMENSIONS']}, not {dims}")
        if plan.chunk_dim not in dims and self.chunk != 0:
            return None  # a variable without the chunked dim (a static field): written whole, by one task
        start, stop = plan.bounds(self.chunk)
        region = tuple(slice(start, stop) if d == plan.chunk_dim else slice(None) for d in dims)
        if _holds_a_value(values, array.fill_value):  # (zarr need not look for an empty chunk: it is not one)
            array = array.with_config({"write_empty_chunks": True})
        self.writing = [f for f in self.writing if not f.done()]
        while len(self.writing) >= WRITERS:
            self.writing.pop(0).result()
        future = self.pool.submit(_write_region, array, region, values.astype(array.dtype, copy=False))
        self.writing.append(future)
        return future

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.pool.shutdown(wait=True)
        for future in self.writing:
            if exc == (None, None, None):
                future.result()


def _write_region(array, region: tuple, values: np.ndarray) -> None:
    """One region of a Zarr array written, unless the run was cancelled (a failed run removes the store: no
    write may start once it does)."""
    with writing():
        array[region] = values


def _size(stream) -> int:
    """A seekable stream's length (it is left where it was)."""
    at = stream.tell()
    end = stream.seek(0, 2)
    stream.seek(at)
    return end


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
