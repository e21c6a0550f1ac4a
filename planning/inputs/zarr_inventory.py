"""A Zarr store planned as one source covering the whole concat dim: its metadata and dim coordinates only."""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import xarray as xr

from planning.formats.store_sources import check_targets
from planning.formats.zarr_paths import StoreLayout
from planning.formats.zarr_store import RecordingStore, ReferenceStore, check_codecs, open_store, open_store_dataset
from planning.inputs.coords import format_value
from planning.inputs.inventory import Inventory
from planning.inputs.limits import check_dim_sizes
from planning.inputs.metadata import dataset_info
from planning.inputs.time_decoding import AS_STATED, TimeDecoding, check_no_missing
from schemas.errors import UserError


def _chunks(ds: xr.Dataset) -> dict[str, tuple[int, ...]]:
    """Each variable's storage object shape (non-dim coordinates too: ``coords:`` reads them like data): its shard
    where sharded (one object), else its chunk."""
    out = {}
    for name, var in ds.variables.items():
        shape = var.encoding.get("shards") or var.encoding.get("chunks") or var.shape
        out[str(name)] = tuple(int(n) for n in shape)
    return out


def _stored_bytes(ds: xr.Dataset) -> int:
    """The data variables' size as stored, before compression (the listing would cost a request per 1,000 chunks)."""
    return sum(
        math.prod(var.shape) * np.dtype(var.encoding.get("dtype", var.dtype)).itemsize for var in ds.data_vars.values()
    )


def _refuse_missing_chunks(url: str, store: RecordingStore) -> None:
    """Refuse a coordinate chunk found missing while planning read the coordinates (zarr reads it as fill values).

    input.missing_chunks: fill is for data written with write_empty_chunks=False; a coordinate
    of fill values would put samples at wrong times or places.
    """
    key = min(store.missing, default=None)
    if key is not None:
        raise UserError(
            f"{url}: coordinate {key.split('/', 1)[0]!r}: chunk {key!r} is missing, and would read as fill values; "
            "restore it (input.missing_chunks: fill applies to data variables, never to coordinates)"
        )


def take_store_inventory(
    url: str, concat_dim: str, decoding: TimeDecoding = AS_STATED, version: Mapping[str, str] | None = None
) -> Inventory:
    """The store as an inventory of one "file": what make_plan needs, read from the metadata and dim coordinates.

    ``decoding``: how times are decoded (input.decode_times, input.calendar), as for files;
    ``version``: an Icechunk repository's (input.icechunk), whose snapshot the layout records.
    """
    store = open_store(url, version)
    if isinstance(store, ReferenceStore):
        check_targets(url, store.fs)
    # No index yet: a dim coordinate is loaded only once its size is known to be sane.
    ds = open_store_dataset(url, store, decode_times=False, indexes=False)
    try:
        check_dim_sizes(url, ds.sizes)
        check_codecs(url, ds)
        try:
            info = dataset_info(url, _stored_bytes(ds), decoding.dataset(url, ds))
        except UserError:
            _refuse_missing_chunks(url, store)  # the cause, if the fill values read in its place upset a check
            raise
        _refuse_missing_chunks(url, store)
        chunks = _chunks(ds)
    finally:
        ds.close()
    if concat_dim not in info.sizes:
        raise UserError(
            f"{url}: has no dim {concat_dim!r} (its dims: {', '.join(info.sizes) or 'none'}); "
            "set input.concat_dim to the dim to sample along"
        )
    if info.sizes[concat_dim] == 0:
        raise UserError(f"{url}: dim {concat_dim!r} is empty; there is nothing to sample")
    values = info.coords.get(concat_dim)
    if values is None:
        values = np.arange(info.sizes[concat_dim])
    check_no_missing(url, concat_dim, values)  # with decode_times: false, or NaT from a fill value
    if len(values) > 1 and not np.all(values[1:] > values[:-1]):
        step = int(np.flatnonzero(values[1:] <= values[:-1])[0])
        raise UserError(
            f"{url}: {concat_dim!r} is not strictly increasing ({format_value(values[step])} is followed by "
            f"{format_value(values[step + 1])} at index {step + 1}); fix the store's coordinate"
        )
    # Static variables (no concat dim) are in the same store: Inventory.static_file_of names it.
    return Inventory(concat_dim, (info,), (), values, zarr=StoreLayout(url, chunks, store.snapshot))
