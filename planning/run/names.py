"""Names inside an output directory: shards, metadata, a run's temporary files and working directory.

Every temporary name is made here and only here, and none is ever parsed back: a stage that
needs a final name computes it from the shard number.
"""

from __future__ import annotations

import os
import posixpath
import re
import tempfile
import uuid

from schemas.schema import shard_name
from schemas.urls import is_remote

#: A run's working files (bucket files, the shard layout, progress markers) live under this
#: directory of a local output.
TMP_DIR = "_tmp"
#: What a temporary file's name adds to the final name it will be renamed to.
TEMPORARY_MARK = ".tmp-"
#: A run id as ``new_run_id`` draws it; an output's manifest naming anything else was not written by this tool.
_RUN_ID = re.compile(r"[0-9a-f]{12}")
#: What tells temporaries of one final name apart: a writer's token, or a run id (in-place shards).
_TEMPORARY_TOKEN = re.compile(r"[0-9a-f]{8}|[0-9a-f]{12}")
#: The probes of the input files, kept so that a rerun reads no file's metadata again.
INVENTORY_FILE = "_inventory.json"
#: What builds wrote into this output (planning.run.manifest): what --overwrite may delete.
MANIFEST_FILE = "_manifest.json"


def join(base: str, *parts: str) -> str:
    """A path under ``base``: a local path, or a URL joined with '/'."""
    if is_remote(base):
        return "/".join([base.rstrip("/"), *parts])
    return os.path.join(base, *parts)


def new_run_id() -> str:
    return uuid.uuid4().hex[:12]


def is_run_id(text: object) -> bool:
    return isinstance(text, str) and _RUN_ID.fullmatch(text) is not None


def new_temporary_token() -> str:
    return uuid.uuid4().hex[:8]


def temporary_path(final: str, token: str) -> str:
    """Where a file is written before it is renamed to ``final``; ``token`` tells writers apart."""
    return f"{final}{TEMPORARY_MARK}{token}"


def is_temporary_of(name: str, final: str) -> bool:
    """Whether ``name`` is a temporary this tool writes before renaming it to ``final``."""
    prefix = f"{final}{TEMPORARY_MARK}"
    return name.startswith(prefix) and _TEMPORARY_TOKEN.fullmatch(name[len(prefix) :]) is not None


def shard_path(output: str, split: str, number: int, count: int, compression: str | None, generation: int = 0) -> str:
    return join(output, shard_name(split, number, count, compression, generation))


def run_dir(output: str, run_id: str) -> str:
    """A run's directory beside its output (the manifest owns it by the run id): removed when the run ends."""
    return join(output, TMP_DIR, run_id)


def work_dir(output: str, run_id: str) -> str:
    """Where a local run keeps its working files: under the output, or in local temp for remote outputs."""
    if is_remote(output):
        # This user's own folder (the build checks only they can write in it): a shared, predictable
        # folder would let another local user plant or read the run's files.
        return os.path.join(tempfile.gettempdir(), f"xarray-tfrecords-{os.geteuid()}", run_id)
    return run_dir(output, run_id)


def bucket_path(directory: str, shard: int, unit: int, piece: int = 0) -> str:
    """The bucket file a unit (or a piece of it, after the first) writes for one shard."""
    name = f"unit-{unit:06d}" if piece == 0 else f"unit-{unit:06d}-{piece}"
    return join(directory, f"shard-{shard:05d}", f"{name}.bucket")


def spill_path(directory: str, unit: int, piece: int = 0) -> str:
    """The spill object a unit (or a piece of it, after the first) writes: its buckets for every shard."""
    name = f"unit-{unit:06d}" if piece == 0 else f"unit-{unit:06d}-{piece}"
    return join(directory, f"{name}.spill")


def relative(base: str, path: str) -> str:
    return posixpath.relpath(path, base) if not is_remote(base) else path[len(base.rstrip("/")) + 1 :]
