"""Reading a unit's box from a Zarr store on a worker: only the chunks the box touches; missing chunks refused
unless the config says they read as fill values (input.missing_chunks).

Values are decoded by xarray's CF rules from the store's encodings, as the NetCDF route decodes
the same encodings, so the same data gives the same values either way.
"""

from __future__ import annotations

import dataclasses
import re
import threading
from collections.abc import Mapping, Sequence

import numcodecs.errors
import numpy as np
import xarray as xr
import zarr.errors

from planning.formats.zarr_store import FETCHED, RecordingStore, codec_error, open_store, open_store_dataset
from planning.reads.selection import Selection
from planning.reads.slabs import Box, Slabs
from planning.run.variables import VariablePlan
from schemas.errors import UserError

#: Each worker process opens a store once (its metadata: with consolidated metadata one request)
#: and keeps it for every unit it reads; threads share it (zarr reads through its own event loop).
_OPENED: dict[tuple[str, str | None], tuple[RecordingStore, xr.Dataset]] = {}
_OPENING = threading.Lock()


def _opened(
    url: str, reach: Mapping[str, int] | None = None, snapshot: str | None = None
) -> tuple[RecordingStore, xr.Dataset]:
    """The store opened in this process (an Icechunk repository's at ``snapshot``); again where it is shorter than
    ``reach`` (per dim, the source index a read reaches up to): steps were appended to it since (a long-lived
    process that builds, then appends)."""
    key = (url, snapshot)
    with _OPENING:
        cached = _OPENED.get(key)
        if cached is not None and reach and any(cached[1].sizes.get(d, n) < n for d, n in reach.items()):
            del _OPENED[key]
        if key not in _OPENED:
            store = open_store(url, None if snapshot is None else {"snapshot_id": snapshot})
            # Nothing is loaded (no index either), and times stay numbers as in the NetCDF route.
            _OPENED[key] = store, open_store_dataset(url, store, decode_times=False, indexes=False)
        return _OPENED[key]


def _chunk_where(key: str, variable: xr.Variable, concat_dim: str) -> str:
    """Where a chunk key lies along the concat dim, e.g. " (time 3 to 3)"; "" if the key does not say."""
    parts = re.split(r"[./]", key.split("/", 1)[1])
    if parts and parts[0] == "c":
        parts = parts[1:]
    chunks = variable.encoding.get("shards") or variable.encoding.get("chunks")
    if concat_dim not in variable.dims or not chunks or len(parts) != len(variable.dims):
        return ""
    axis = variable.dims.index(concat_dim)
    start = int(parts[axis]) * chunks[axis]
    return f" ({concat_dim} steps {start} to {min(start + chunks[axis], variable.shape[axis]) - 1})"


def _missing_chunk(url: str, name: str, key: str, variable: xr.Variable, concat_dim: str) -> UserError:
    return UserError(
        f"{url}: variable {name!r}: chunk {key!r} is missing{_chunk_where(key, variable, concat_dim)} and would read "
        "as fill values; restore it, or, if the store was written with write_empty_chunks=False (which leaves out "
        "all-fill chunks), set input.missing_chunks: fill"
    )


def _missing_coordinate_chunk(url: str, name: str, key: str) -> UserError:
    return UserError(
        f"{url}: coordinate {name!r} (coords:): chunk {key!r} is missing, and would read as fill values; restore it "
        "(input.missing_chunks: fill applies to data variables, never to coordinates)"
    )


def _values(url: str, ds: xr.Dataset, variable: VariablePlan, where: dict) -> np.ndarray:
    # Non-dim coordinates too (config coords:), which xarray keeps apart from the data variables.
    if variable.name not in ds.variables:
        raise UserError(f"{url}: variable {variable.name!r} is missing (was the store rewritten during the build?)")
    try:
        # Index arrays along several dims index each dim apart (outer indexing): zarr reads each chunk
        # once, however many runs of it the selection takes.
        values = ds[variable.name].isel(where).values
    except (zarr.errors.UnknownCodecError, numcodecs.errors.UnknownCodecError) as error:
        raise codec_error(url, error) from None  # checked at planning: a worker may lack what the driver has
    except UserError:
        raise  # (a reference store's chunk whose file is gone: planning.formats.zarr_store.ReferenceStore)
    except Exception as error:
        reason = str(error).splitlines()[0][:200] if str(error) else type(error).__name__
        raise UserError(f"{url}: reading {variable.name!r} failed ({reason}); the store may be corrupt") from None
    expected = tuple(len(range(w.start, w.stop)) if isinstance(w, slice) else len(w) for w in where.values())
    if values.shape != expected or values.dtype != np.dtype(variable.dtype):
        raise UserError(
            f"{url}: variable {variable.name!r} reads as {values.dtype} {values.shape} where the plan needs "
            f"{variable.dtype} {expected}; the store changed since the build was planned: run it again"
        )
    return values


def _where(dim: str, span: tuple[int, int], selection: Selection) -> slice | np.ndarray:
    """The source indices positions ``span`` of ``dim`` on the selected grid take: a slice where they run on."""
    runs = selection.source_runs(dim, *span)
    if len(runs) == 1:
        return slice(*runs[0][0])
    if not runs:
        return slice(0, 0)
    return np.concatenate([np.arange(*taken) for taken, _ in runs])


def _stop(where: slice | np.ndarray) -> int:
    """The source index after the last one ``_where`` takes."""
    if isinstance(where, slice):
        return where.stop
    return int(where.max()) + 1 if len(where) else 0


def _chunk_index(key: str, ndim: int) -> tuple[int, ...] | None:
    """A chunk key's index along each dim ("t/c/3/0/0", "t/3.0.0", "t/3/0/0"); None if the key does not say."""
    parts = re.split(r"[./]", key.split("/", 1)[1]) if "/" in key else []
    if parts and parts[0] == "c":
        parts = parts[1:]
    if len(parts) != ndim or not all(p.isdigit() for p in parts):
        return None
    return tuple(int(p) for p in parts)


def _needed_bytes(
    ds: xr.Dataset, variables: Sequence[VariablePlan], fetched: list, own: dict, concat_dim: str, first: bool
) -> int:
    """The stored bytes of the chunks this read is accountable for, among those ``fetched`` ((key, byte range,
    bytes)).

    A chunk is the read's own when it holds the first element of one of its samples along every
    grid dim (``own``: per grid dim, the source indices of those first elements); the rest it
    fetched as a halo, for windows that cross into a chunk another unit owns. A variable without
    the concat dim (a static field) is the own of the first unit along it alone (``first``): every
    other unit fetches it again.
    """
    sizes = {(key, where): size for key, where, size in fetched}  # each key (or byte range of one) once
    owned: dict[str, list[set[int] | None]] = {}
    for variable in variables:
        encoding = ds[variable.name].encoding
        chunks = encoding.get("shards") or encoding.get("chunks")
        if not chunks or (concat_dim not in variable.dims and not first):
            continue
        owned[variable.name] = [
            set((np.asarray(own[d]) // c).tolist()) if d in own else None for d, c in zip(variable.dims, chunks)
        ]
    total = 0
    for (key, _), size in sizes.items():
        name = key.split("/", 1)[0]
        if name not in owned:
            continue
        index = _chunk_index(key, len(owned[name]))
        if index is not None and all(ids is None or i in ids for i, ids in zip(index, owned[name])):
            total += size
    return total


def read_store_box(
    url: str,
    concat_dim: str,
    variables: Sequence[VariablePlan],
    box: Box,
    missing_chunks: str = "error",
    selection: Selection | None = None,
    own: dict[str, np.ndarray] | None = None,
    first: bool = True,
    snapshot: str | None = None,
) -> Slabs:
    """Each variable's values over ``box`` (index ranges on the selected grid), static variables included,
    each chunk fetched and decoded once, however many runs of it ``selection`` (config select) takes.

    ``missing_chunks``: config input.missing_chunks, whether an absent chunk fails the read
    (``error``) or reads as fill values (``fill``). ``own``: per grid dim, the source indices of the
    first elements of the unit's samples, whose chunks are the unit's own, and ``first``: whether
    the unit is the first along the concat dim (which owns the static fields' chunks):
    Slabs.chunk_bytes counts the stored bytes of its own chunks (none without ``own``).
    """
    selection = selection or Selection()
    store, ds = _opened(url, {d: _stop(_where(d, span, selection)) for d, span in box.items()}, snapshot)
    slabs = Slabs({})
    fetched: list[tuple[str, str, int]] = []
    token = FETCHED.set(fetched)
    try:
        for variable in variables:
            where = {d: _where(d, box[d], selection) for d in variable.dims}
            slabs.values[variable.name] = _values(url, ds, variable, where)
            # Checked after the read: the store notes each key it found absent (planning.formats.zarr_store).
            missing = store.missing_chunk(variable.name)
            if missing is not None and variable.feature.role == "aux_coord":  # a coordinate of config coords:
                raise _missing_coordinate_chunk(url, variable.name, missing)
            if missing is not None and missing_chunks == "error":
                raise _missing_chunk(url, variable.name, missing, ds[variable.name].variable, concat_dim)
    finally:
        FETCHED.reset(token)
    if missing_chunks == "fill":
        store.forget_missing()
    # Counted per read (the store's own count adds up every thread's reads).
    slabs.bytes_read = slabs.chunks_fetched = sum(size for _, _, size in fetched)
    if own is not None:
        slabs.chunk_bytes = _needed_bytes(ds, variables, fetched, own, concat_dim, first)
    return slabs


@dataclasses.dataclass(frozen=True, eq=False)
class StoreReader:
    """A Zarr store's Reader (planning.reads.slabs.Reader): boxes of the selected grid, each read once
    (read_store_box); ``own`` and ``first``: what the unit reading owns, for Slabs.chunk_bytes."""

    url: str
    concat_dim: str
    missing_chunks: str = "error"
    selection: Selection = dataclasses.field(default_factory=Selection)
    own: dict[str, np.ndarray] | None = None
    first: bool = True
    snapshot: str | None = None  # an Icechunk repository's: the snapshot planning resolved

    def read(self, variables: Sequence[VariablePlan], box: Box) -> Slabs:
        return read_store_box(
            self.url,
            self.concat_dim,
            variables,
            box,
            self.missing_chunks,
            self.selection,
            self.own,
            self.first,
            self.snapshot,
        )
