"""NetCDF-4 (HDF5) variables stored in chunks, read a chunk at a time: each chunk a unit touches fetched and
decoded once, and its fetched bytes weighed against the stored bytes of the chunks the unit owns.

A unit's reads run inside ``unit_chunks(...)``: a ledger in a context variable, which the HDF5
reader (planning.formats.hdf5_reads) asks. Within it, a chunked dataset is read chunk by chunk,
HDF5 decoding each chunk once into its place in the box; where the box is read in several pieces
(selected levels inside one chunk, config ``select``), the ledger keeps the decoded chunks so the
next piece takes them from memory instead of fetching and decoding them again.

A chunk is the unit's own when, along every grid dim, its last index lies in the unit's
territory: from the first index of the unit's first sample up to that of the next unit's (the
first and last units reaching to either end). So the chunk's owner is the unit with the last
sample starting at or before the chunk's end, which reads it: summed over units, every chunk
needed, each once, even one that only windows reach into. What a unit fetches beyond its own
is a halo (windows crossing into the next unit's chunk) or a static field read again.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import itertools
from collections.abc import Iterator, Mapping, Sequence

import h5py
import numpy as np

Key = tuple[str, str, tuple[int, ...]]  # (file, variable, the chunk's first index along each dim)


@dataclasses.dataclass
class UnitChunks:
    """What one unit's reads fetched of chunked NetCDF-4 variables, and the decoded chunks it keeps for reuse.

    ``territory``: per grid dim, the source indices (of the virtual dataset) [low, high) whose chunks
    ending there are the unit's; ``first``: whether the unit is the first along ``concat_dim`` (it
    owns the chunks of variables without it).
    """

    territory: Mapping[str, tuple[float, float]] | None
    first: bool
    concat_dim: str
    keep: bool = False  # keep decoded chunks: the box is read in pieces that may share them
    fetched: int = 0  # stored bytes of the chunks read from files, each time read
    needed: int = 0  # stored bytes of the chunks the unit owns, each once
    decoded: dict[Key, np.ndarray] = dataclasses.field(default_factory=dict)
    starts: dict[str, int] = dataclasses.field(default_factory=dict)  # per file, its first index along concat_dim
    counted: set[Key] = dataclasses.field(default_factory=set)

    def file_starts_at(self, path: str, start: int) -> None:
        """Where a file's indices along the concat dim begin in the virtual dataset (for owning its chunks)."""
        self.starts[path] = start

    def owns(self, path: str, dims: Sequence[str], corner: Sequence[int], chunks: Sequence[int]) -> bool:
        if self.concat_dim not in dims and not self.first:
            return False
        if self.territory is None:
            return True
        for dim, start, length in zip(dims, corner, chunks):
            if dim not in self.territory:
                continue
            low, high = self.territory[dim]
            last = start + length - 1 + (self.starts.get(path, 0) if dim == self.concat_dim else 0)
            if not low <= last < high:
                return False
        return True

    def note(self, key: Key, dims: Sequence[str], chunks: Sequence[int], stored: int) -> None:
        """A chunk of ``stored`` bytes read from its file."""
        self.fetched += stored
        if key not in self.counted:
            self.counted.add(key)
            if self.owns(key[0], dims, key[2], chunks):
                self.needed += stored


UNIT_CHUNKS: contextvars.ContextVar[UnitChunks | None] = contextvars.ContextVar("UNIT_CHUNKS", default=None)


@contextlib.contextmanager
def unit_chunks(
    territory: Mapping[str, tuple[float, float]] | None, first: bool, concat_dim: str
) -> Iterator[UnitChunks]:
    """The ledger of one unit's reads (its decoded chunks dropped at the end)."""
    ledger = UnitChunks(territory, first, concat_dim)
    token = UNIT_CHUNKS.set(ledger)
    try:
        yield ledger
    finally:
        UNIT_CHUNKS.reset(token)
        ledger.decoded.clear()


@contextlib.contextmanager
def keeping_chunks(keep: bool) -> Iterator[None]:
    """Within: the unit's ledger (if any) keeps the chunks it decodes, for other pieces of the same box."""
    ledger = UNIT_CHUNKS.get()
    if ledger is None or not keep:
        yield
        return
    ledger.keep = True
    try:
        yield
    finally:
        ledger.keep = False
        ledger.decoded.clear()


def chunk_shape(dataset: h5py.h5d.DatasetID) -> tuple[int, ...] | None:
    """The dataset's chunk shape; None where it is not stored in chunks."""
    plist = dataset.get_create_plist()
    if plist.get_layout() != h5py.h5d.CHUNKED:
        return None
    return tuple(int(n) for n in plist.get_chunk())


def chunk_corners(ranges: Sequence[tuple[int, int]], chunks: Sequence[int]) -> Iterator[tuple[int, ...]]:
    """The first index of every chunk the box ``ranges`` touches."""
    return itertools.product(*[range(a - a % c, b, c) for (a, b), c in zip(ranges, chunks)])


def cached(path: str, name: str, corner: tuple[int, ...]) -> bool:
    """Whether the unit's ledger holds this chunk decoded already (it need not be fetched)."""
    ledger = UNIT_CHUNKS.get()
    return ledger is not None and (path, name, corner) in ledger.decoded


def read_chunked(
    dataset: h5py.h5d.DatasetID,
    path: str,
    name: str,
    dims: Sequence[str],
    dtype: np.dtype,
    ranges: Sequence[tuple[int, int]],
    chunks: Sequence[int],
    ledger: UnitChunks,
) -> np.ndarray:
    """The stored values over ``ranges``, a chunk at a time: each chunk read (and decoded) once into its place,
    or taken from the ledger's decoded chunks; the ledger counts what was read."""
    shape = dataset.shape
    out = np.empty(tuple(stop - start for start, stop in ranges), dtype)
    if out.size == 0:
        return out
    space = dataset.get_space()
    for corner in chunk_corners(ranges, chunks):
        key = (path, name, corner)
        extent = [(c, min(c + k, n)) for c, k, n in zip(corner, chunks, shape)]
        inside = [(max(a, c0), min(b, c1)) for (a, b), (c0, c1) in zip(ranges, extent)]
        place = tuple(slice(lo - a, hi - a) for (lo, hi), (a, _) in zip(inside, ranges))
        chunk = ledger.decoded.get(key)
        if chunk is None:
            info = dataset.get_chunk_info_by_coord(corner)
            ledger.note(key, dims, chunks, 0 if info.byte_offset is None else int(info.size))
            # Read whole when kept (another piece takes its other part); else just the part in the box
            # (HDF5 still decodes the chunk once) straight into its place.
            wanted = extent if ledger.keep else inside
            counts = tuple(hi - lo for lo, hi in wanted)
            space.select_hyperslab(tuple(lo for lo, _ in wanted), counts)
            if ledger.keep:
                chunk = np.empty(counts, dtype)
                dataset.read(h5py.h5s.create_simple(counts), space, chunk)
                ledger.decoded[key] = chunk
            else:
                memory = h5py.h5s.create_simple(out.shape)
                memory.select_hyperslab(tuple(s.start for s in place), counts)
                dataset.read(memory, space, out)
                continue
        out[place] = chunk[tuple(slice(lo - c0, hi - c0) for (lo, hi), (c0, _) in zip(inside, extent))]
    return out
