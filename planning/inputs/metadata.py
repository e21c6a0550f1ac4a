"""What planning reads from one input file: dim sizes, dim coordinates, variables and their attributes."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import xarray as xr

from planning.formats.classic_reads import read_raw
from planning.formats.netcdf3 import ClassicHeader
from planning.formats.remote_files import RemoteFile
from planning.formats.sources import check_not_truncated, open_netcdf, refuse_truncated
from planning.inputs.coords import json_scalar
from planning.inputs.limits import check_dim_sizes
from planning.inputs.time_decoding import AS_STATED, TimeDecoding
from schemas.urls import is_remote


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
    #: coordinates other than dim coordinates (2-D lat/lon of a curvilinear grid, scalars), as xarray opens them
    coordinates: dict[str, VariableInfo] = dataclasses.field(default_factory=dict)
    #: the values of the scalar ones, as schema.json holds them (planning.inputs.coords.json_scalar)
    scalar_values: dict[str, Any] = dataclasses.field(default_factory=dict)


#: The longest attribute value kept whole, in characters (a list's in characters of its repr). schema.json and
#: parser.py hold every variable's attributes, once each: three variables carrying a 20 MB ``history`` made both
#: 63 MB, and TensorFlow's import of that parser 1.1 GB; what a reader needs (units, names, flags) is far shorter.
MAX_ATTR_CHARS = 4096


def capped_attr(value: Any) -> Any:
    """An attribute value as schema.json keeps it: whole, or a longer one in part, saying its full length."""
    if isinstance(value, str) and len(value) > MAX_ATTR_CHARS:
        return f"{value[:MAX_ATTR_CHARS]} [... cut: {len(value):,} characters in the file]"
    if isinstance(value, list) and len(text := repr(value)) > MAX_ATTR_CHARS:
        # (cut short, the list would read as the whole value: its numbers are not kept, only what it was)
        return f"[not kept: a list of {len(value):,} values in the file, {len(text):,} characters] {text[:256]} ..."
    return value


def _attrs(variable: xr.Variable | xr.DataArray) -> dict[str, Any]:
    """Attributes as JSON-ready values (each at most MAX_ATTR_CHARS long), plus the CF encoding keys that decoding
    consumed."""
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
        out[str(key)] = capped_attr(value)
    return out


def inspect_classic(
    path: str, nbytes: int, header: ClassicHeader, fetch, decoding: TimeDecoding = AS_STATED
) -> FileInfo:
    """A classic file's info from its header and its dim coordinates' bytes: nothing else is read.

    Remote classic files are planned this way: the netCDF library reads them only from a local
    copy, which would download every file whole.
    """
    refuse_truncated(path, nbytes, header.expected_size())
    sizes: dict[str, int] = {}
    named_coords: set[str] = set()
    for variable in header.variables.values():
        sizes.update(zip(variable.dims, variable.shape))
        named_coords.update(str(variable.attrs.get("coordinates", "")).split())
    check_dim_sizes(path, sizes)
    coords, coord_attrs, variables, coordinates, scalars = {}, {}, {}, {}, {}
    for name, variable in header.variables.items():
        if variable.dims == (name,):
            raw = read_raw(fetch, variable, header.record_size, [(0, variable.shape[0])])
            coordinate = decoding.values(path, name, variable.dims, raw, variable.attrs)
            coords[name] = np.asarray(coordinate.values)
            coord_attrs[name] = _attrs(coordinate)
            continue
        empty = np.empty((0,) * len(variable.dims), dtype=variable.dtype.newbyteorder("="))
        variable_info = decoding.values(path, name, variable.dims, empty, variable.attrs)
        info = VariableInfo(name, variable.dims, str(variable_info.dtype), str(empty.dtype), _attrs(variable_info))
        if name not in named_coords:
            variables[name] = info
            continue
        coordinates[name] = info
        if not variable.dims:  # a scalar coordinate: its one value is a few bytes
            raw = read_raw(fetch, variable, header.record_size, [])
            scalars[name] = json_scalar(decoding.values(path, name, (), raw, variable.attrs).values)
    return FileInfo(path, nbytes, sizes, coords, coord_attrs, variables, coordinates, scalars)


def inspect_file(path: str, decoding: TimeDecoding = AS_STATED) -> FileInfo:
    """Read one file's metadata and its dim coordinates (no data variables are loaded); times as ``decoding`` says."""
    if is_remote(path):
        remote = RemoteFile(path)
        header = remote.classic_header()
        if header is not None:
            return inspect_classic(path, remote.size, header, remote.fetch, decoding)
        nbytes = remote.size  # HDF5 is not classic: a truncated file fails to open instead
    else:
        nbytes = check_not_truncated(path)
    with open_netcdf(path, decode_times=False) as opened:
        check_dim_sizes(path, opened.sizes)  # before decoding loads the time coordinate
        return dataset_info(path, nbytes, decoding.dataset(path, opened))


def dataset_info(path: str, nbytes: int, ds: xr.Dataset) -> FileInfo:
    """An opened dataset's info: its dim coordinates are loaded, no data variable is."""
    check_dim_sizes(path, ds.sizes)
    coords = {}
    coord_attrs = {}
    for dim in ds.dims:
        if dim in ds.variables:
            coords[dim] = ds[dim].values
            coord_attrs[dim] = _attrs(ds[dim])
    variables = {str(name): _info(name, var) for name, var in ds.data_vars.items()}
    coordinates = {str(name): _info(name, var) for name, var in ds.coords.items() if name not in ds.dims}
    scalars = {name: json_scalar(ds[name].values) for name, info in coordinates.items() if not info.dims}
    sizes = {str(k): int(v) for k, v in ds.sizes.items()}
    return FileInfo(path, nbytes, sizes, coords, coord_attrs, variables, coordinates, scalars)


def _info(name, var: xr.DataArray) -> VariableInfo:
    return VariableInfo(
        name=str(name),
        dims=tuple(str(d) for d in var.dims),
        dtype=str(var.dtype),
        source_dtype=str(var.encoding.get("dtype", var.dtype)),
        attrs=_attrs(var),
    )
