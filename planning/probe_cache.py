"""The probes of a build's input files, kept beside its output so that a rerun reads no file's metadata again.

A probe is reused only for a file whose path, size and version (modification time, or GCS
generation) are those it was made from; anything else is probed again. The cache is a help,
never a source of truth: one that cannot be read or written is ignored with a log line.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
from collections.abc import Iterable, Mapping

import fsspec
import numpy as np

from planning.names import new_temporary_token, temporary_path
from planning.probe import FileProbe
from planning.sources import ListedFile

logger = logging.getLogger(__name__)

#: Version 2: local NetCDF-4 probes fingerprint names and dimension scales (planning.local_probe);
#: 3: and record where plainly stored variables lie (planning.direct_reads). Another version's
#: cache is ignored (probed again), so older and newer versions never misread each other's.
FORMAT = "xarray-tfrecords-inventory/3"
_FIELDS = dataclasses.fields(FileProbe)


def _key(listed: ListedFile) -> tuple[str, int, str]:
    return listed.path, listed.nbytes, listed.version


def load_probes(url: str, concat_dim: str) -> dict[tuple[str, int, str], FileProbe]:
    """The cached probes by (path, size, version); empty if there is no usable cache."""
    try:
        with fsspec.open(url, "r") as stream:
            document = json.load(stream)
    except FileNotFoundError:
        return {}
    except Exception as error:
        logger.warning("ignoring the inventory cache %s: %s", url, error)
        return {}
    if document.get("format") != FORMAT or document.get("concat_dim") != concat_dim:
        return {}
    probes = {}
    for entry in document["files"]:
        raw = entry.pop("concat_raw")
        if raw is not None:
            raw = np.array(raw["values"], dtype=raw["dtype"])
        key = (entry["path"], entry["nbytes"], entry.pop("version"))
        probes[key] = FileProbe(**entry, concat_raw=raw)
    return probes


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
    document = {"format": FORMAT, "concat_dim": concat_dim, "files": files}
    fs = temporary = None
    try:
        fs, path = fsspec.core.url_to_fs(url)
        fs.makedirs(fs._parent(path), exist_ok=True)
        temporary = temporary_path(path, new_temporary_token())
        with fs.open(temporary, "w") as stream:
            stream.write(json.dumps(document))
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
