"""Beam stages of reassembly: samples sorted into bucket files by output chunk, then each chunk assembled and written.

    Create(sample files) -> Reshuffle -> ScanFile: each file's samples into bucket files, one per output chunk
    they reach (halo included) -> (chunk, bucket path) -> GroupByKey -> AssembleChunk: one task per chunk reads
    its buckets, reassembles the chunk's cells and writes them as one Zarr region (its own Zarr chunks).

Only paths ride the GroupByKey (the local runner holds every grouped value in memory: DESIGN.md,
decision 3), so a worker holds one chunk, its halo, and a bounded buffer of samples. Every stage takes
what it needs from the plan it is given: no state on the driver.
"""

from __future__ import annotations

import dataclasses
import json
import math
import posixpath
import uuid
from collections.abc import Iterator, Mapping, Sequence

import apache_beam as beam
import fsspec
import numpy as np

from schemas.prediction_files import read_predictions
from schemas.reader import Reader
from schemas.reassembly import Reassembly
from schemas.schema import Schema

#: Samples a scan holds at least before it writes them out to bucket files.
BUCKET_BYTES = 8 * 2**20
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
    bucket_bytes: int = 0  # samples a scan holds before writing buckets (about a chunk: fewer, larger buckets)

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
        yield from reader.iter_chunks([shard])
    else:
        yield from read_predictions(name, plan.schema)


def chunks_of(plan: ReassemblePlan, assembly: Reassembly, batch: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """Per sample of ``batch``, the chunks it reaches (keys checked on the whole grid)."""
    axis = assembly.checked_axis(plan.chunk_dim)
    low, high = axis.reach()
    starts = np.asarray(batch[axis.index_name]).reshape(-1) + axis.origin - axis.first
    first = (starts + low) // plan.chunk_length
    last = (starts + high - 1) // plan.chunk_length
    return [np.arange(max(a, 0), min(b, plan.num_chunks - 1) + 1) for a, b in zip(first, last)]


def scan_file(name: str, plan: ReassemblePlan) -> Iterator[tuple[int, str]]:
    """One file's samples into bucket files by chunk: (chunk, bucket path) per bucket written."""
    assembly = plan.assembly((0, 0))  # (checks keys only: holds no cells)
    pending: dict[int, list[dict[str, np.ndarray]]] = {}
    held = 0
    for batch in iter_file(plan, name):
        assembly.check_keys(batch)
        reached = chunks_of(plan, assembly, batch)
        first = np.array([c[0] for c in reached])
        for chunk in np.unique(first):  # most samples reach one chunk: taken together
            rows = np.flatnonzero(first == chunk)
            pending.setdefault(int(chunk), []).append({k: v[rows] for k, v in batch.items()})
        for i, chunks in enumerate(reached):  # and the halo: the samples reaching on into the next chunks
            for chunk in chunks[1:]:
                pending.setdefault(int(chunk), []).append({k: v[i : i + 1] for k, v in batch.items()})
        held += sum(v.nbytes for v in batch.values())
        if held >= max(BUCKET_BYTES, plan.bucket_bytes):
            yield from _flush(plan, pending)
            pending, held = {}, 0
    yield from _flush(plan, pending)


def _flush(plan: ReassemblePlan, pending: dict[int, list[dict[str, np.ndarray]]]) -> Iterator[tuple[int, str]]:
    for chunk, parts in pending.items():
        path = posixpath.join(plan.work, f"chunk-{chunk:06d}-{uuid.uuid4().hex}.bucket")
        with fsspec.open(path, "wb") as stream:
            write_bucket(stream, parts)
        yield chunk, path


#: A bucket file: this, the length of its JSON header (8 bytes, little-endian), the header, then the arrays' bytes.
_BUCKET_MAGIC = b"XTFBUCKET1"


def write_bucket(stream, parts: Sequence[Mapping[str, np.ndarray]]) -> None:
    """Batches of samples as one header and their arrays' raw bytes, the batches of each array one after another
    (never concatenated in memory); read back without pickle or a zip's per-array cost."""
    header = json.dumps(
        [[name, a.dtype.str, [sum(len(p[name]) for p in parts), *a.shape[1:]]] for name, a in parts[0].items()]
    ).encode()
    stream.write(_BUCKET_MAGIC + len(header).to_bytes(8, "little") + header)
    for name in parts[0]:
        for part in parts:
            stream.write(np.ascontiguousarray(part[name]).data)


def read_bucket(data: bytes, where: str) -> dict[str, np.ndarray]:
    """A bucket file's arrays; ValueError if it is not one whole bucket (a file of ours, but read from disk)."""
    if not data.startswith(_BUCKET_MAGIC):
        raise ValueError(f"{where}: not a bucket file")
    start = len(_BUCKET_MAGIC) + 8
    size = int.from_bytes(data[len(_BUCKET_MAGIC) : start], "little")
    out, offset = {}, start + size
    for name, dtype, shape in json.loads(data[start:offset]):
        dtype = np.dtype(dtype)
        if dtype.kind not in "biuf":
            raise ValueError(f"{where}: {name} holds {dtype}, not numbers")
        count = math.prod(shape)
        if offset + count * dtype.itemsize > len(data):
            raise ValueError(f"{where}: cut short in {name}")
        out[name] = np.frombuffer(data, dtype, count, offset).reshape(shape)
        offset += count * dtype.itemsize
    if offset != len(data):
        raise ValueError(f"{where}: {len(data) - offset} bytes after its arrays")
    return out


def assemble_chunk(element: tuple[int, Sequence[str]], plan: ReassemblePlan) -> int:
    """A chunk's cells from its buckets, written as the chunk's region of the store (its own Zarr chunks)."""
    chunk, paths = element
    start, stop = plan.bounds(chunk)
    assembly = plan.assembly((start, stop))
    fs = fsspec.core.url_to_fs(plan.work)[0]
    for path in sorted(paths):  # one bucket in memory at a time, besides the chunk
        with fsspec.open(path, "rb") as stream:
            assembly.add_all([read_bucket(stream.read(), path)])
    dataset = assembly.dataset()
    along = [name for name, v in dataset.data_vars.items() if plan.chunk_dim in v.dims]
    dataset.drop_vars(list(dataset.coords))[along].to_zarr(
        plan.store, region={plan.chunk_dim: slice(start, stop)}, zarr_format=2
    )
    if chunk == 0:  # the variables without the chunked dim (static fields): written whole, by one task
        rest = [name for name in dataset.data_vars if name not in along]
        if rest:
            region = {d: slice(None) for name in rest for d in dataset[name].dims}
            dataset.drop_vars(list(dataset.coords))[rest].to_zarr(plan.store, region=region, zarr_format=2)
    for path in paths:
        fs.rm(fsspec.core.url_to_fs(path)[1])
    with fsspec.open(posixpath.join(plan.work, DONE_DIR, f"{chunk:06d}"), "wb") as stream:
        stream.write(b"")
    return chunk


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
