"""GRIB files as input: recognising them, opening one hypercube of their messages through cfgrib, and its errors."""

from __future__ import annotations

import collections
import contextlib
import os
import tempfile
import warnings
from collections.abc import Iterator, Mapping, Sequence

import fsspec
import xarray as xr

from planning.formats.sources import NETCDF_LOCK
from schemas.errors import UserError
from schemas.urls import is_remote

#: File name endings that say GRIB (GRIB 1 or 2), lower case.
GRIB_SUFFIXES = (".grib", ".grib1", ".grib2", ".grb", ".grb1", ".grb2")

#: The keys that tell a file's hypercubes apart, as cfgrib's own hints name them.
_HYPERCUBE_KEYS = ("typeOfLevel", "stepType", "gridType", "edition")

_INSTALL = 'install cfgrib and ecCodes (pip install "xarray-tfrecords[grib]")'


def is_grib_input(paths: Sequence[str], grib_config) -> bool:
    """Whether input.paths are GRIB files: input.grib is set, or every path is named as GRIB."""
    if grib_config is not None:
        return True
    return all(p.rstrip("/").lower().endswith(GRIB_SUFFIXES) for p in paths)


@contextlib.contextmanager
def _local_copy(path: str) -> Iterator[str]:
    """A local path to read ``path`` at: ecCodes reads local files only, so a remote one is fetched whole, to a
    temporary file of this read's own (a cache shared by reads could outlive a rewrite of the object)."""
    if not is_remote(path):
        if not os.path.isfile(path):
            raise UserError(f"{path}: file not found (was it moved or deleted during the build?)")
        yield path
        return
    with tempfile.TemporaryDirectory(prefix="xarray-tfrecords-grib-") as directory:
        local = os.path.join(directory, "file.grib")
        try:
            fs, resolved = fsspec.core.url_to_fs(path)
            fs.get_file(resolved, local)
        except FileNotFoundError:
            raise UserError(f"{path}: file not found (was it moved or deleted during the build?)") from None
        yield local


def _refusal(path: str, local: str, error: Exception, filter_by_keys: Mapping) -> UserError:
    message = str(error).splitlines()[0] if str(error) else type(error).__name__
    if "multiple values for" in message or "conflicting" in message.lower() or "ambiguous" in message.lower():
        messages = _matching(_messages(local), filter_by_keys)
        return UserError(
            f"{path}: holds several hypercubes ({_describe(messages)}); choose one with "
            "input.grib.filter_by_keys, e.g. {" + _example(messages, filter_by_keys) + "}"
        )
    return UserError(f"{path}: cannot be read as GRIB ({message[:200]}); fix or remove the file, or narrow input.paths")


def _messages(path: str) -> list[dict]:
    """The keys that tell hypercubes apart, and the shortName, of each message of a local file (headers only)."""
    import eccodes

    found = []
    with open(path, "rb") as stream:
        while True:
            handle = eccodes.codes_grib_new_from_file(stream, headers_only=True)
            if handle is None:
                return found
            try:
                keys = {k: eccodes.codes_get(handle, k, str) for k in (*_HYPERCUBE_KEYS, "shortName")}
                found.append(keys)
            finally:
                eccodes.codes_release(handle)


def _matching(messages: list[dict], filter_by_keys: Mapping) -> list[dict]:
    return [m for m in messages if all(str(m.get(k, "")) == str(v) for k, v in filter_by_keys.items() if k in m)]


def _groups(messages: list[dict]) -> dict[tuple, list[str]]:
    """The messages' hypercubes, by the keys that differ among them, each with its variables (shortNames)."""
    varying = [k for k in _HYPERCUBE_KEYS if len({m[k] for m in messages}) > 1] or ["typeOfLevel"]
    groups: dict[tuple, list[str]] = collections.defaultdict(list)
    for message in messages:
        names = groups[tuple((k, message[k]) for k in varying)]
        if message["shortName"] not in names:
            names.append(message["shortName"])
    return groups


def _describe(messages: list[dict]) -> str:
    """Hypercubes in one line: "typeOfLevel=isobaricInhPa: t z; typeOfLevel=surface: sp"."""
    parts = []
    for keys, names in _groups(messages).items():
        more = " ..." if len(names) > 8 else ""
        parts.append(f"{', '.join(f'{k}={v}' for k, v in keys)}: {' '.join(names[:8])}{more}")
    return "; ".join(parts)


def _example(messages: list[dict], filter_by_keys: Mapping) -> str:
    """A filter_by_keys that picks the first of the messages' hypercubes, as YAML's flow style writes it."""
    first = next(iter(_groups(messages)))
    return ", ".join(f"{k}: {v}" for k, v in {**filter_by_keys, **dict(first)}.items())


def _no_message(path: str, local: str, filter_by_keys: Mapping) -> UserError:
    messages = _messages(local)
    if not messages:
        return UserError(f"{path}: holds no GRIB message; fix or remove the file, or narrow input.paths")
    return UserError(
        f"{path}: no message matches input.grib.filter_by_keys {dict(filter_by_keys)} "
        f"(it holds {_describe(messages)}); fix the keys or narrow input.paths"
    )


def _promote(ds: xr.Dataset, concat_dim: str) -> xr.Dataset:
    """A file of one step along the concat dim (cfgrib gives it as a scalar) given that dim, as xarray's
    open_mfdataset(..., concat_dim=...) gives it; valid_time (time plus step) goes along it too, as it differs from
    file to file (read from the first file alone, it would be wrong for every other)."""
    if concat_dim in ds.coords and ds[concat_dim].ndim == 0:
        ds = ds.expand_dims(concat_dim)
        if "valid_time" in ds.coords and concat_dim not in ds["valid_time"].dims and concat_dim in ("time", "step"):
            ds = ds.assign_coords(valid_time=ds["valid_time"].expand_dims(concat_dim))
    return ds


@contextlib.contextmanager
def open_grib(path: str, filter_by_keys: Mapping, concat_dim: str, decode_times: bool = False) -> Iterator[xr.Dataset]:
    """One hypercube of a GRIB file as a lazy dataset, as ``xr.open_dataset(path, engine="cfgrib")`` gives it.

    No index file is written beside the user's file (cfgrib's default): the messages are scanned
    in memory. Times stay numbers unless ``decode_times``, as for NetCDF files.
    """
    try:
        import cfgrib  # noqa: F401
    except ImportError:
        raise UserError(f"{path}: reading GRIB needs cfgrib; {_INSTALL}") from None
    with contextlib.ExitStack() as stack:
        local = stack.enter_context(_local_copy(path))
        stack.enter_context(NETCDF_LOCK)  # ecCodes handles are not shared, but cfgrib's warnings filters are
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                dataset = xr.open_dataset(
                    local,
                    engine="cfgrib",
                    cache=False,
                    decode_times=decode_times,
                    decode_timedelta=decode_times,
                    backend_kwargs={"indexpath": "", "filter_by_keys": dict(filter_by_keys), "errors": "raise"},
                )
            except UserError:
                raise
            except Exception as error:
                raise _refusal(path, local, error, filter_by_keys) from None
        stack.callback(dataset.close)
        if not dataset.data_vars:
            raise _no_message(path, local, filter_by_keys)
        yield _promote(dataset, concat_dim)
