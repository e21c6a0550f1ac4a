"""An output's metadata files, read and checked: schema.json (the commit), stats.json, normalisation constants."""

from __future__ import annotations

import dataclasses
import json
import posixpath
from typing import Any

import fsspec

from schemas.errors import UserError
from schemas.sample_shapes import check_axis_lengths
from schemas.schema import SCHEMA_FILE, STATS_FILE, Schema, SchemaError
from schemas.urls import check_regular_file


def _read_text(url: str) -> str:
    check_regular_file(url)  # a FIFO in schema.json's place would block the read for ever
    with fsspec.open(url, "r") as stream:
        return stream.read()


def load_schema(path: str) -> Schema:
    """The schema of a complete output (local path or any fsspec URL).

    Every reader loads it here, so a schema.json that is damaged or edited (not JSON, wrong types, shard
    names outside the output) is refused here, in one line naming the file and the entry at fault.

    Args:
        path: the output's folder.

    Returns:
        The ``Schema``: features, splits and their shards, the sample's axes, provenance.

    Raises:
        UserError: no schema.json (not a complete output), or one that is damaged or edited.
    """
    url = posixpath.join(str(path), SCHEMA_FILE)
    try:
        text = _read_text(url)
    except (FileNotFoundError, NotADirectoryError):
        raise UserError(
            f"{path}: no {SCHEMA_FILE}, so this is not a complete xarray-tfrecords output "
            "(a run that failed or is still running leaves none); build it again"
        ) from None
    except UnicodeDecodeError:
        raise UserError(f"{url}: not a valid schema (not UTF-8 text); build the output again") from None
    try:
        schema = Schema.loads(text)
    except SchemaError as error:
        raise UserError(f"{url}: not a valid schema ({error}); build the output again") from None
    check_axis_lengths(schema, url)  # a shape permuted in schema.json would decode into the wrong places
    return dataclasses.replace(schema, location=str(path))


def load_stats(path: str) -> dict[str, Any]:
    """The statistics written beside the shards, checked to be those of the committed schema.json.

    An append writes stats.json (and parser.py) before schema.json, its commit: killed between them, it
    leaves the new generation's statistics beside the old schema, which would normalise the data the
    schema lists with statistics of data it does not list.

    Args:
        path: the output's folder.

    Returns:
        stats.json as a dict: ``over``, ``variables``, ``splits``, ``normalization``, and ``tendency`` where built.

    Raises:
        UserError: statistics of another commit than schema.json's.
    """
    stats = json.loads(_read_text(posixpath.join(str(path), STATS_FILE)))
    held = stats.get("generations")
    if isinstance(held, list):
        committed = json.loads(_read_text(posixpath.join(str(path), SCHEMA_FILE))).get("sources", {})
        count = committed.get("generations")
        if isinstance(count, int) and count != len(held):
            raise UserError(
                f"{path}: {STATS_FILE} holds the statistics of {len(held)} generation(s) but {SCHEMA_FILE} commits "
                f"{count}: an append stopped between writing them; run the same append again to complete it"
            )
    return stats


def normalization_constants(path: str, normalize: bool | str) -> dict:
    """stats.json's normalisation constants by feature; ``normalize="tendency"``: with the ``targets`` role's
    features as residuals (stats.tendency's constants); UserError where stats.json has none."""
    stats = load_stats(path)
    normalization = stats.get("normalization")
    if not normalization:
        raise UserError(f"{path}: stats.json has no normalisation constants; read without normalize")
    if normalize == "tendency":
        residual = stats.get("tendency", {}).get("normalization")
        if not residual:
            raise UserError(
                f"{path}: stats.json has no residual constants for normalize='tendency'; build with stats.tendency: "
                "true and sample.roles with a `targets` role whose steps' previous steps the sample holds"
            )
        return {**normalization, **residual}
    if normalize is not True:
        raise UserError(f"normalize: {normalize!r} is not True, False or 'tendency'")
    return normalization
