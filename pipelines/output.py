"""The output directory on the driver: refusing or clearing an existing output, removing a failed run's files.

All I/O goes through Beam's ``FileSystems``, so local paths and ``gs://`` behave the same.
"""

from __future__ import annotations

import logging
import os

from apache_beam.io.filesystems import FileSystems

from planning.names import INVENTORY_FILE, TMP_DIR, is_ours, join, relative, temporary_path
from schemas.errors import UserError
from schemas.schema import SCHEMA_FILE
from schemas.urls import is_remote
from transforms.shards import remove_tree

logger = logging.getLogger(__name__)


def _is_file(path: str) -> bool:
    if not is_remote(path):
        return os.path.isfile(path)
    return any(m.path == path for m in FileSystems.match([path])[0].metadata_list)


def prepare_output(path: str, overwrite: bool) -> None:
    """Refuse an existing output unless ``overwrite``; then remove what an earlier build wrote.

    The old schema.json goes first, so an interrupted clean-up never leaves a directory that
    looks complete. Files this tool did not write are never deleted: their presence is an error.
    """
    if _is_file(path):
        raise UserError(f"output: {path} is an existing file; choose a directory path for the output")
    # The inventory cache (written by planning, just before) is kept: it is what makes a rerun fast.
    kept = join(path, INVENTORY_FILE)
    existing = [m.path for m in FileSystems.match([join(path, "**")])[0].metadata_list if m.path != kept]
    if not existing:
        return
    if not overwrite:
        raise UserError(f"output: {path} already exists; pass --overwrite to replace it, or choose another path")
    foreign = [p for p in existing if not is_ours(relative(path, p))]
    if foreign:
        raise UserError(
            f"output: {path} holds files this tool did not write (e.g. {foreign[0]}); "
            "--overwrite only replaces an earlier output: choose an empty or new directory"
        )
    schema = join(path, SCHEMA_FILE)
    if FileSystems.exists(schema):
        FileSystems.delete([schema])
    rest = [p for p in existing if p != schema]
    if rest:
        FileSystems.delete(rest)


def remove_temporary_files(output: str, run_id: str, work_dir: str | None) -> None:
    """Delete what a failed run left: its temporary shards and its working directory.

    A run killed outright cannot do this; the next run with --overwrite does (prepare_output).
    """
    pattern = temporary_path(join(output, "*"), run_id)
    temporary = [m.path for m in FileSystems.match([pattern])[0].metadata_list]
    for path in [*temporary, work_dir, join(output, TMP_DIR)]:
        if path is None:
            continue
        try:
            remove_tree(path)
        except Exception as error:  # cleaning up must not hide why the run failed
            logger.warning("could not remove %s: %s", path, error)
