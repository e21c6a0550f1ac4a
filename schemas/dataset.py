"""Opening a written output from Python: its schema, its statistics, and a tf.data pipeline."""

from __future__ import annotations

import json
import posixpath
from typing import Any

import fsspec

from schemas.errors import UserError
from schemas.schema import SCHEMA_FILE, STATS_FILE, Schema


def _read_text(url: str) -> str:
    with fsspec.open(url, "r") as stream:
        return stream.read()


def load_schema(path: str) -> Schema:
    """The schema of a complete output (local path or any fsspec URL)."""
    url = posixpath.join(str(path), SCHEMA_FILE)
    try:
        return Schema.loads(_read_text(url))
    except (FileNotFoundError, NotADirectoryError):
        raise UserError(
            f"{path}: no {SCHEMA_FILE}, so this is not a complete xarray-tfrecords output "
            "(a run that failed or is still running leaves none); build it again"
        ) from None


def load_stats(path: str) -> dict[str, Any]:
    """The statistics written beside the shards."""
    return json.loads(_read_text(posixpath.join(str(path), STATS_FILE)))


def load_dataset(path: str, split: str = "data", batch_size: int = 32, normalize: bool = False, **options):
    """The same tf.data pipeline as the output's generated ``parser.make_dataset``.

    Options: shuffle_buffer, num_parallel_reads, drop_remainder, repeat, seed, and
    normalized_fill: with ``normalize``, what the points nan_policy: fill filled become (default 0).
    """
    from schemas import parser_template  # imports TensorFlow; only readers pay for it

    schema = load_schema(path)
    normalization = load_stats(path).get("normalization") if normalize else None
    return parser_template.build_dataset(
        schema.to_json(), str(path), split, batch_size, normalize=normalize, normalization=normalization, **options
    )
