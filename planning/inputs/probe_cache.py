"""The probes of a build's input files, kept beside its output so that a rerun reads no file's metadata again.

A probe is reused only for a file whose path, size and version (planning.formats.sources: modification
time, inode and change time locally; generation and checksums on GCS) are those it was made
from; anything else is probed again. The cache is a help, never a source of truth: one that
cannot be read or written, is malformed, or whose content no longer hashes to the digest written
with it (edited by hand or by another program), is ignored with a warning naming it, and every
file probed again. Its offsets are checked once more where they are read (planning.reads.direct_reads).

The files' entries are stored compressed (zlib, then base64, as one JSON string after a plain JSON head
that says whose file it is): entries of one archive repeat their keys and most values, so the cache is
a few percent of their JSON text (measured at 10,000 files: see FORMAT).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import dataclasses
import hashlib
import json
import logging
import math
import zlib
from collections.abc import Iterable, Mapping
from typing import Annotated, Any

import fsspec
import numpy as np
from pydantic import ConfigDict, Field, Strict, TypeAdapter, ValidationError, with_config
from typing_extensions import TypedDict

from planning.formats.sources import ListedFile
from planning.inputs.probe import FileProbe
from planning.run.names import new_temporary_token, temporary_path

logger = logging.getLogger(__name__)

#: Version 2: local NetCDF-4 probes fingerprint names and dimension scales (planning.inputs.local_probe);
#: 3: and record where plainly stored variables lie (planning.reads.direct_reads); 4: with a check of each
#: such layout, a digest of the files' entries, and local versions that include inode and change time; 5: the
#: entries compressed (10,000 local NetCDF-4 files: 7.7 MB of entries as JSON, 1.4 MB stored); 6: local NetCDF-4
#: fingerprints cover the data variables' units and calendar (files whose units differ are told apart).
#: Another version's cache is ignored (probed again), so older and newer versions never misread each other's.
FORMAT = "xarray-tfrecords-inventory/6"
#: The most the entries may take decompressed: a cache inflating beyond it (a hostile one) is not read.
MAX_ENTRIES_BYTES = 1 << 30
#: zlib's fastest level: most of the best level's gain, at a fraction of its time on a large archive's entries.
_LEVEL = 1
_FIELDS = dataclasses.fields(FileProbe)

_Count = Annotated[int, Strict(), Field(ge=0)]
_Check = Annotated[int, Strict(), Field(ge=-(2**63), lt=2**63)]  # an int64 (planning.formats.hdf5_layout.layout_check)
_Text = Annotated[str, Strict()]
#: Kinds of numbers a concat coordinate is stored as (bool, int, unsigned, float).
_RAW_KINDS = "biuf"


@with_config(ConfigDict(extra="forbid"))
class _Raw(TypedDict):
    dtype: _Text
    values: list[Annotated[bool, Strict()] | Annotated[int, Strict()] | Annotated[float, Strict()]]


@with_config(ConfigDict(extra="forbid"))
class _Entry(TypedDict):
    """One file's probe as the cache holds it (FileProbe's fields and the file's version), every value typed.

    (A TypedDict: pydantic checks one as fast as json parses it, a model at half that speed.)
    """

    path: _Text
    nbytes: _Count
    classic: Annotated[bool, Strict()]
    fingerprint: _Text
    sizes: dict[str, _Count]
    concat_raw: _Raw | None
    concat_attrs: dict[str, Any]
    bytes_read: _Count | None
    layouts: dict[str, tuple[_Count, list[_Count], _Text, _Check]]
    version: _Text


def _dtype(text: str, where: str) -> np.dtype:
    try:
        return np.dtype(text)
    except (TypeError, ValueError):
        raise ValueError(f"{where}: {text!r} is not a dtype") from None


def _probe(entry: _Entry, concat_dim: str) -> FileProbe:
    """The probe an entry holds, after checking what its types do not say: dtypes, lengths, offsets in the file."""
    raw = entry["concat_raw"]
    if raw is not None:
        if _dtype(raw["dtype"], "concat_raw").kind not in _RAW_KINDS:
            raise ValueError(f"concat_raw: dtype {raw['dtype']!r} is not a number's")
        try:
            raw = np.array(raw["values"], dtype=raw["dtype"])
        except (OverflowError, TypeError) as error:
            raise ValueError(f"concat_raw: {error}") from None
        if len(raw) != entry["sizes"].get(concat_dim):
            raise ValueError(f"concat_raw: {len(raw)} values, but {concat_dim} has {entry['sizes'].get(concat_dim)}")
    for name, (offset, shape, dtype, _) in entry["layouts"].items():
        end = offset + math.prod(shape) * _dtype(dtype, f"layouts.{name}").itemsize
        if end > entry["nbytes"]:
            raise ValueError(f"layouts.{name}: its values end at byte {end}, past the file's {entry['nbytes']}")
    return FileProbe(
        **{field.name: entry[field.name] for field in _FIELDS if field.name != "concat_raw"}, concat_raw=raw
    )


_ENTRIES = TypeAdapter(list[_Entry])


def _key(listed: ListedFile) -> tuple[str, int, str]:
    return listed.path, listed.nbytes, listed.version


def _digest(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def _reason(error: ValidationError, files: str) -> str:
    """A validation error in one line: which file's entry, where in it, and what is wrong there."""
    first = error.errors()[0]
    if not first["loc"]:
        return f"files: {first['msg']}"
    index, *where = first["loc"]
    name = None
    if isinstance(index, int):
        with contextlib.suppress(Exception):  # the entry's path, if the JSON parses that far
            name = json.loads(files)[index].get("path")
    at = f"the entry of {name}" if isinstance(name, str) else f"entry {index}"
    return f"{at}: {'.'.join(str(part) for part in where) or 'entry'}: {first['msg']}"


def _pack(entries: str) -> str:
    """The entries' JSON text as the cache stores it: compressed, as a JSON string."""
    return json.dumps(base64.b64encode(zlib.compress(entries.encode(), _LEVEL)).decode("ascii"))


def _unpack(stored: str) -> str:
    """The entries' JSON text from what the cache stores (ValueError: why it cannot be read)."""
    packed = json.loads(stored)
    if not isinstance(packed, str):
        raise ValueError("files: not a compressed string")
    try:
        data = base64.b64decode(packed, validate=True)
    except binascii.Error as error:
        raise ValueError(f"files: not base64 ({error})") from None
    inflate = zlib.decompressobj()
    try:
        text = inflate.decompress(data, MAX_ENTRIES_BYTES)
    except zlib.error as error:
        raise ValueError(f"files: not zlib data ({error})") from None
    if inflate.unconsumed_tail:
        raise ValueError(f"files: more than {MAX_ENTRIES_BYTES:,} bytes decompressed")
    if not inflate.eof or inflate.unused_data:
        raise ValueError("files: the compressed data is cut short or followed by more")
    try:
        return text.decode()
    except UnicodeDecodeError as error:
        raise ValueError(f"files: not UTF-8 text ({error})") from None


def _head(concat_dim: str, digest: str | None = None) -> str:
    """How a cache's text starts, up to its files (or up to its digest's value, when none is given)."""
    start = json.dumps({"format": FORMAT, "concat_dim": concat_dim})[:-1] + ', "digest": "'
    return start if digest is None else f'{start}{digest}", "files": '


def _other(text: str, concat_dim: str) -> bool:
    """Whether a cache that does not start as this version writes it is another version's, or for another dim."""
    try:
        document = json.loads(text)
    except ValueError:
        return False
    if not isinstance(document, dict):
        return False
    found = document.get("format")
    other_format = isinstance(found, str) and found.startswith(FORMAT.split("/")[0] + "/") and found != FORMAT
    return other_format or (found == FORMAT and document.get("concat_dim") != concat_dim)


def _probes(text: str, concat_dim: str) -> dict[tuple[str, int, str], FileProbe] | str:
    """The probes a cache's text holds, or why it cannot be used ("" for another version or concat dim)."""
    text = text.rstrip()
    start = _head(concat_dim)
    if not text.startswith(start):
        return (
            "" if _other(text, concat_dim) else "not laid out as this version writes it (edited since it was written?)"
        )
    digest = text[len(start) :].partition('"')[0]
    head = _head(concat_dim, digest)
    # The digest is of the files' text as written: any edit, even one that keeps the JSON valid, shows.
    stored = text[len(head) : -1]
    if not text.startswith(head) or not text.endswith("}") or digest != _digest(stored):
        return "its content does not match its digest (edited since it was written)"
    try:
        files = _unpack(stored)
    except ValueError as error:
        return str(error)
    try:
        entries = _ENTRIES.validate_json(files)
    except ValidationError as error:
        return _reason(error, files)
    probes = {}
    for entry in entries:
        try:
            probes[(entry["path"], entry["nbytes"], entry["version"])] = _probe(entry, concat_dim)
        except ValueError as error:
            return f"the entry of {entry['path']}: {error}"
    return probes


def load_probes(url: str, concat_dim: str) -> dict[tuple[str, int, str], FileProbe]:
    """The cached probes by (path, size, version); empty if there is no usable cache (a warning says why)."""
    try:
        with fsspec.open(url, "r") as stream:
            text = stream.read()
    except FileNotFoundError:
        return {}
    except Exception as error:
        logger.warning("ignoring the inventory cache %s (every file is probed again): %s", url, error)
        return {}
    found = _probes(text, concat_dim)
    if isinstance(found, str):
        if found:
            logger.warning("ignoring the inventory cache %s (every file is probed again): %s", url, found)
        return {}
    return found


def save_probes(url: str, concat_dim: str, probes: Iterable[tuple[ListedFile, FileProbe]]) -> None:
    """Write the probes of these files (replacing the cache); failures are logged, not raised."""
    files = []
    for listed, probe in probes:
        # Field by field: dataclasses.asdict deep-copies every value, which costs more than the write.
        entry = {field.name: getattr(probe, field.name) for field in _FIELDS}
        raw = probe.concat_raw
        entry["concat_raw"] = None if raw is None else {"dtype": raw.dtype.str, "values": raw.tolist()}
        entry["version"] = listed.version
        files.append(entry)
    fs = temporary = None
    try:
        text = _pack(json.dumps(files))
        fs, path = fsspec.core.url_to_fs(url)
        fs.makedirs(fs._parent(path), exist_ok=True)
        temporary = temporary_path(path, new_temporary_token())
        with fs.open(temporary, "w") as stream:
            stream.write(f"{_head(concat_dim, _digest(text))}{text}}}")
        fs.mv(temporary, path)
    except Exception as error:
        logger.warning("could not write the inventory cache %s: %s", url, error)
        # A temporary left behind (a full disk) would be met by every rerun.
        with contextlib.suppress(Exception):
            if temporary is not None and fs.exists(temporary):
                fs.rm(temporary)


def reuse_or_probe(listed: list[ListedFile], cached: Mapping, probe) -> list[FileProbe | None]:
    """Each file's cached probe if its path, size and version match, else ``probe(missing files)``'s."""
    missing = [f for f in listed if _key(f) not in cached]
    logger.info(
        "input: %d file(s); %d probe(s) reused from the inventory cache", len(listed), len(listed) - len(missing)
    )
    fresh = dict(zip((_key(f) for f in missing), probe(missing))) if missing else {}
    return [cached.get(_key(f), fresh.get(_key(f))) for f in listed]
