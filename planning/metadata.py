"""What planning reads from one input file: dim sizes, dim coordinates, variables and their attributes."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import xarray as xr

from planning.sources import check_not_truncated, open_netcdf


@dataclasses.dataclass(frozen=True)
class VariableInfo:
    """A data variable as the files describe it (dtype after CF decoding: scale, offset, fill)."""

    name: str
    dims: tuple[str, ...]
    dtype: str
    source_dtype: str
    attrs: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class FileInfo:
    """What planning needs from one file: dim sizes, coordinates and variables."""

    path: str
    nbytes: int
    sizes: dict[str, int]
    coords: dict[str, np.ndarray]  # decoded values of every dim coordinate
    coord_attrs: dict[str, dict[str, Any]]
    variables: dict[str, VariableInfo]


def _attrs(variable: xr.Variable | xr.DataArray) -> dict[str, Any]:
    """Attributes as JSON-ready values, plus the CF encoding keys that decoding consumed."""
    out = {}
    merged = {**variable.attrs}
    for key in ("units", "calendar"):
        if key in variable.encoding:
            merged.setdefault(key, variable.encoding[key])
    for key, value in merged.items():
        if isinstance(value, np.ndarray):
            value = value.tolist()
        elif isinstance(value, np.generic):
            value = value.item()
        if isinstance(value, bytes):
            value = value.decode(errors="replace")
        if isinstance(value, float) and not np.isfinite(value):
            value = str(value)
        out[str(key)] = value
    return out


def inspect_file(path: str) -> FileInfo:
    """Read one file's metadata and its dim coordinates (no data variables are loaded)."""
    nbytes = check_not_truncated(path)
    with open_netcdf(path) as ds:
        coords = {}
        coord_attrs = {}
        for dim in ds.dims:
            if dim in ds.variables:
                coords[dim] = ds[dim].values
                coord_attrs[dim] = _attrs(ds[dim])
        variables = {
            str(name): VariableInfo(
                name=str(name),
                dims=tuple(str(d) for d in var.dims),
                dtype=str(var.dtype),
                source_dtype=str(var.encoding.get("dtype", var.dtype)),
                attrs=_attrs(var),
            )
            for name, var in ds.data_vars.items()
        }
        sizes = {str(k): int(v) for k, v in ds.sizes.items()}
        return FileInfo(path, nbytes, sizes, coords, coord_attrs, variables)
