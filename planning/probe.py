"""A quick look at one input file: its structure's fingerprint, its dim sizes and its concat coordinate.

Planning reads full metadata (through xarray) from one file per distinct structure only; every
other file is probed: about 1 ms through the netCDF library instead of 6 ms through xarray,
which is most of planning on archives of thousands of files. Files whose fingerprint equals
the reference's have the reference's variables, grid and attributes; their own concat
coordinate is decoded exactly as xarray decodes it (``decode_cf_variable``, the file's own
units and calendar).
"""

from __future__ import annotations

import dataclasses
import hashlib
import warnings
from typing import Any

import numpy as np
import xarray as xr

from planning.sources import NETCDF_LOCK

#: Attributes that change how xarray decodes a variable's values (and so its decoded dtype).
_DECODING_ATTRS = ("scale_factor", "add_offset", "_FillValue", "missing_value", "_Unsigned", "units", "calendar")


@dataclasses.dataclass(frozen=True)
class FileProbe:
    """What a probe learns: enough to place a file along the concat dim and to tell its structure apart."""

    path: str
    nbytes: int
    classic: bool  # a netCDF-3 file (CDF-1, CDF-2 or CDF-5)
    fingerprint: str  # equal fingerprints: same dims, variables, dtypes, decoding attributes and grid
    sizes: dict[str, int]
    concat_raw: np.ndarray | None  # the concat coordinate's stored values (None: the file has none)
    concat_attrs: dict[str, Any]


def decode_concat_values(probes: list[FileProbe], concat_dim: str) -> list[np.ndarray | None]:
    """Each probe's concat coordinate decoded as xarray decodes it when it opens the file.

    Files that store it alike (same dtype, units, calendar, ...) are decoded in one call: one
    decode per file would cost as much as the probe itself.
    """
    groups: dict[str, list[int]] = {}
    for index, probe in enumerate(probes):
        if probe.concat_raw is not None:
            key = repr((probe.concat_raw.dtype.str, sorted(probe.concat_attrs.items())))
            groups.setdefault(key, []).append(index)
    out: list[np.ndarray | None] = [None] * len(probes)
    for members in groups.values():
        raw = np.concatenate([probes[i].concat_raw for i in members])
        variable = xr.Variable((concat_dim,), raw, dict(probes[members[0]].concat_attrs))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", xr.SerializationWarning)
            decoded = np.asarray(xr.conventions.decode_cf_variable(concat_dim, variable).values)
        ends = np.cumsum([len(probes[i].concat_raw) for i in members])
        for i, values in zip(members, np.split(decoded, ends[:-1])):
            out[i] = values
    return out


def _plain(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value


def probe_local(path: str, nbytes: int, concat_dim: str) -> FileProbe:
    """Probe a local file with the netCDF library (NetCDF-3 and NetCDF-4 alike)."""
    import netCDF4

    with NETCDF_LOCK, netCDF4.Dataset(path) as ds:
        if ds.groups:
            raise ValueError("groups: take the full look")
        sizes = {str(name): len(dim) for name, dim in ds.dimensions.items()}
        digest = hashlib.sha1(repr(sorted((d, n) for d, n in sizes.items() if d != concat_dim)).encode())
        concat_raw, concat_attrs = None, {}
        for name, variable in ds.variables.items():
            variable.set_auto_maskandscale(False)
            variable.set_auto_chartostring(False)
            attrs = {key: _plain(variable.getncattr(key)) for key in variable.ncattrs()}
            decoding = {key: attrs[key] for key in _DECODING_ATTRS if key in attrs and name != concat_dim}
            digest.update(repr((name, variable.dimensions, variable.dtype.str, sorted(decoding.items()))).encode())
            if name == concat_dim and variable.dimensions == (concat_dim,):
                concat_raw, concat_attrs = np.asarray(variable[:]), attrs
            elif variable.dimensions == (name,):
                # A grid coordinate: files whose grids differ must not share a fingerprint.
                digest.update(np.ascontiguousarray(variable[:]).tobytes())
        classic = ds.data_model.startswith("NETCDF3")
    return FileProbe(path, nbytes, classic, digest.hexdigest(), sizes, concat_raw, concat_attrs)
