"""GRIB files as input: recognising them, opening one hypercube of their messages through cfgrib, and its errors."""

from __future__ import annotations

import collections
import contextlib
import os
import tempfile
import warnings
from collections.abc import Iterator, Mapping, Sequence

import fsspec
import numpy as np
import xarray as xr

from planning.formats.grib_fields import GribMessages, place_messages
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


def _gone(path: str) -> UserError:
    return UserError(f"{path}: file not found (was it moved or deleted during the build?)")


@contextlib.contextmanager
def _local_copy(path: str, ranges: np.ndarray | None = None) -> Iterator[str]:
    """A local path to read ``path`` at; with ``ranges`` ((offset, length) of the messages planning indexed), a
    file of those messages alone, each fetched straight from its offset.

    ecCodes reads local files only, so a remote file (or its messages) is fetched to a temporary
    file of this read's own (a cache shared by reads could outlive a rewrite of the object).
    """
    if ranges is None and not is_remote(path):
        if not os.path.isfile(path):
            raise _gone(path)
        yield path
        return
    with tempfile.TemporaryDirectory(prefix="xarray-tfrecords-grib-") as directory:
        local = os.path.join(directory, "file.grib")
        try:
            if ranges is None:
                fs, resolved = fsspec.core.url_to_fs(path)
                fs.get_file(resolved, local)
            else:
                _write_messages(path, ranges, local)
        except FileNotFoundError:
            raise _gone(path) from None
        yield local


def _write_messages(path: str, ranges: np.ndarray, local: str) -> None:
    """The messages at ``ranges`` of ``path`` written one after another to ``local``; refused where a range does
    not hold a whole message (the file changed since it was indexed, or the index is not this file's)."""
    starts = [int(offset) for offset, _ in ranges]
    ends = [int(offset + length) for offset, length in ranges]
    if is_remote(path):
        fs, resolved = fsspec.core.url_to_fs(path)
        pieces = fs.cat_ranges([resolved] * len(starts), starts, ends)
    else:
        with open(path, "rb") as stream:
            pieces = [os.pread(stream.fileno(), end - start, start) for start, end in zip(starts, ends)]
    with open(local, "wb") as out:
        for piece, start, end in zip(pieces, starts, ends):
            if isinstance(piece, Exception):
                raise piece
            if len(piece) != end - start or not (piece.startswith(b"GRIB") and piece.endswith(b"7777")):
                raise UserError(
                    f"{path}: bytes {start} to {end} are not the GRIB message planning indexed there; the file "
                    "changed since the build was planned: run it again"
                )
            out.write(piece)


def _same(value, wanted) -> bool:
    """A key's value as ecCodes gives it as text, against a filter's value (850 matches "850" and 850.0)."""
    if str(value) == str(wanted):
        return True
    try:
        return float(value) == float(wanted)
    except (TypeError, ValueError):
        return False


def _matches(handle, filter_by_keys: Mapping) -> bool:
    """Whether a message may be one of ``filter_by_keys``'s: a key it lacks never rules it out, so the messages
    kept are a superset of cfgrib's, which filters them again."""
    import eccodes

    for key, wanted in filter_by_keys.items():
        try:
            value = eccodes.codes_get(handle, key, str)
        except eccodes.KeyValueNotFoundError:
            continue
        if not _same(value, wanted):
            return False
    return True


def message_ranges(local: str, filter_by_keys: Mapping) -> np.ndarray:
    """(offset, length) of each message of a local file that ``filter_by_keys`` may take (headers only)."""
    import eccodes

    found = []
    with open(local, "rb") as stream:
        while (handle := eccodes.codes_grib_new_from_file(stream, headers_only=True)) is not None:
            try:
                if _matches(handle, filter_by_keys):
                    found.append((eccodes.codes_get(handle, "offset"), eccodes.codes_get(handle, "totalLength")))
            finally:
                eccodes.codes_release(handle)
    return np.array(found, dtype=np.int64).reshape(-1, 2)


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
            try:
                handle = eccodes.codes_grib_new_from_file(stream, headers_only=True)
            except Exception:  # a message ecCodes cannot parse: what came before it is what the file holds
                return found
            if handle is None:
                return found
            try:
                keys = {}
                for key in (*_HYPERCUBE_KEYS, "shortName"):
                    try:
                        keys[key] = eccodes.codes_get(handle, key, str)
                    except eccodes.KeyValueNotFoundError:
                        keys[key] = ""
                found.append(keys)
            finally:
                eccodes.codes_release(handle)


def _matching(messages: list[dict], filter_by_keys: Mapping) -> list[dict]:
    """The messages ``filter_by_keys`` may take (of the keys _messages reads; others are not known here)."""
    return [m for m in messages if all(_same(m[k], v) for k, v in filter_by_keys.items() if k in m)]


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
    quoted = next((f"{k}: {v}" for k, v in filter_by_keys.items() if isinstance(v, str) and _number(v)), None)
    hint = f" (cfgrib compares {quoted!r} as text: write the number unquoted)" if quoted else ""
    return UserError(
        f"{path}: no message matches input.grib.filter_by_keys {dict(filter_by_keys)}{hint} "
        f"(it holds {_describe(messages)}); fix the keys or narrow input.paths"
    )


def _number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


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
def open_grib(
    path: str,
    filter_by_keys: Mapping,
    concat_dim: str,
    decode_times: bool = False,
    ranges: np.ndarray | None = None,
    index: list | None = None,
) -> Iterator[xr.Dataset]:
    """One hypercube of a GRIB file as a lazy dataset, as ``xr.open_dataset(path, engine="cfgrib")`` gives it.

    No index file is written beside the user's file (cfgrib's default). ``ranges``: the messages
    planning indexed (message_ranges), the only ones read; ``index``: where planning wants them
    found and placed (a planning.formats.grib_fields.GribMessages appended to it). Times stay
    numbers unless ``decode_times``, as for NetCDF files.
    """
    try:
        import cfgrib  # noqa: F401
    except ImportError:
        raise UserError(f"{path}: reading GRIB needs cfgrib; {_INSTALL}") from None
    with contextlib.ExitStack() as stack:
        local = stack.enter_context(_local_copy(path, ranges))
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
        if index is not None:
            promoted = concat_dim if concat_dim in dataset.coords and dataset[concat_dim].ndim == 0 else None
            placed = place_messages(dataset, local, promoted)
            if placed is None:  # workers read the file through cfgrib: the messages it may take, by a scan
                try:
                    placed = GribMessages(message_ranges(local, filter_by_keys))
                except Exception as error:  # ecCodes' own types: a message cfgrib skipped may not parse here either
                    raise _refusal(path, local, error, filter_by_keys) from None
            index.append(placed)
        yield _promote(dataset, concat_dim)
