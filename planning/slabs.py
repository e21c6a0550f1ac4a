"""Reading a unit's slab on a worker: each variable's values over a box of the virtual dataset."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import xarray as xr

from planning.sources import SourceFile, file_size, open_netcdf
from schemas.errors import UserError


def _values(path: str, ds: xr.Dataset, name: str, selection: dict[str, slice]) -> np.ndarray:
    if name not in ds.variables:
        raise UserError(f"{path}: variable {name!r} is missing; every input file needs it")
    var = ds[name]
    try:
        return var.isel({d: s for d, s in selection.items() if d in var.dims}).values
    except Exception as error:
        reason = str(error).splitlines()[0][:200]
        raise UserError(f"{path}: reading {name!r} failed ({reason}); the file may be truncated or corrupt") from None


def _check_unchanged(source: SourceFile) -> None:
    try:
        size = file_size(source.path)
    except FileNotFoundError:
        raise UserError(f"{source.path}: file not found (was it moved or deleted during the build?)") from None
    if size != source.nbytes:
        raise UserError(
            f"{source.path}: changed size since the build was planned ({source.nbytes} bytes then); "
            "do not modify input files during a build: run it again"
        )


def read_slabs(
    files: Sequence[SourceFile],
    concat_dim: str,
    variables: Sequence[tuple[str, str | None]],
    box: dict[str, tuple[int, int]],
) -> dict[str, np.ndarray]:
    """Each variable's values over ``box`` (source index ranges on the virtual dataset).

    ``variables``: (name, static file) pairs; static variables (no concat dim) are read from
    their file, the others along the concat dim, whose range may span several files: each
    overlapping file is opened once and its part of every variable read, then the parts joined.
    """
    selection = {d: slice(*r) for d, r in box.items()}
    out: dict[str, np.ndarray] = {}
    for path in dict.fromkeys(p for _, p in variables if p is not None):
        with open_netcdf(path, decode_times=False, download=True) as ds:
            for name in (n for n, p in variables if p == path):
                out[name] = _values(path, ds, name, selection)
    along = [name for name, path in variables if path is None]
    begin, end = box[concat_dim]
    parts: dict[str, list[np.ndarray]] = {v: [] for v in along}
    axis_of: dict[str, int] = {}
    for source in files:
        if not along or source.stop <= begin or source.start >= end:
            continue
        _check_unchanged(source)
        local = dict(selection)
        local[concat_dim] = slice(max(begin, source.start) - source.start, min(end, source.stop) - source.start)
        with open_netcdf(source.path, decode_times=False, download=True) as ds:
            for name in along:
                parts[name].append(_values(source.path, ds, name, local))
                axis_of[name] = ds[name].dims.index(concat_dim)
    for name, pieces in parts.items():
        if not pieces:
            raise ValueError(f"no input file covers {concat_dim} range {begin}:{end}")
        out[name] = pieces[0] if len(pieces) == 1 else np.concatenate(pieces, axis=axis_of[name])
    return out
