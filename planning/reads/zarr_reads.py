"""Reading a unit's box from a Zarr store on a worker: only the chunks the box touches; missing chunks refused
unless the config says they read as fill values (input.missing_chunks).

Values are decoded by xarray's CF rules from the store's encodings, as the NetCDF route decodes
the same encodings, so the same data gives the same values either way.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Sequence

import numcodecs.errors
import numpy as np
import xarray as xr
import zarr.errors

from planning.formats.zarr_store import RecordingStore, codec_error, open_store, open_store_dataset
from planning.reads.slabs import Box, Slabs
from planning.run.variables import VariablePlan
from schemas.errors import UserError

#: Each worker process opens a store once (its metadata: with consolidated metadata one request)
#: and keeps it for every unit it reads; threads share it (zarr reads through its own event loop).
_OPENED: dict[str, tuple[RecordingStore, xr.Dataset]] = {}
_OPENING = threading.Lock()


def _opened(url: str) -> tuple[RecordingStore, xr.Dataset]:
    with _OPENING:
        if url not in _OPENED:
            store = open_store(url)
            # Nothing is loaded (no index either), and times stay numbers as in the NetCDF route.
            _OPENED[url] = store, open_store_dataset(url, store, decode_times=False, indexes=False)
        return _OPENED[url]


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


def _values(url: str, ds: xr.Dataset, variable: VariablePlan, box: Box) -> np.ndarray:
    # Non-dim coordinates too (config coords:), which xarray keeps apart from the data variables.
    if variable.name not in ds.variables:
        raise UserError(f"{url}: variable {variable.name!r} is missing (was the store rewritten during the build?)")
    try:
        values = ds[variable.name].isel({d: slice(*box[d]) for d in variable.dims}).values
    except (zarr.errors.UnknownCodecError, numcodecs.errors.UnknownCodecError) as error:
        raise codec_error(url, error) from None  # checked at planning: a worker may lack what the driver has
    except Exception as error:
        reason = str(error).splitlines()[0][:200] if str(error) else type(error).__name__
        raise UserError(f"{url}: reading {variable.name!r} failed ({reason}); the store may be corrupt") from None
    expected = tuple(box[d][1] - box[d][0] for d in variable.dims)
    if values.shape != expected or values.dtype != np.dtype(variable.dtype):
        raise UserError(
            f"{url}: variable {variable.name!r} reads as {values.dtype} {values.shape} where the plan needs "
            f"{variable.dtype} {expected}; the store changed since the build was planned: run it again"
        )
    return values


def read_store_box(
    url: str, concat_dim: str, variables: Sequence[VariablePlan], box: Box, missing_chunks: str = "error"
) -> Slabs:
    """Each variable's values over ``box`` (index ranges on the store), static variables included.

    ``missing_chunks``: config input.missing_chunks, whether an absent chunk fails the read
    (``error``) or reads as fill values (``fill``).
    """
    store, ds = _opened(url)
    slabs = Slabs({})
    for variable in variables:
        slabs.values[variable.name] = _values(url, ds, variable, box)
        # Checked after the read: the store notes each key it found absent (planning.formats.zarr_store).
        missing = store.missing_chunk(variable.name)
        if missing is not None and variable.feature.role == "aux_coord":  # a coordinate of config coords:
            raise _missing_coordinate_chunk(url, variable.name, missing)
        if missing is not None and missing_chunks == "error":
            raise _missing_chunk(url, variable.name, missing, ds[variable.name].variable, concat_dim)
    if missing_chunks == "fill":
        store.forget_missing()
    slabs.bytes_read = store.take_bytes()
    return slabs
