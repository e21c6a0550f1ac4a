"""Opening a written output from Python: its schema, its statistics, and a tf.data pipeline."""

from __future__ import annotations

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
    return schema


def load_stats(path: str) -> dict[str, Any]:
    """The statistics written beside the shards, checked to be those of the committed schema.json.

    An append writes stats.json (and parser.py) before schema.json, its commit: killed between them, it
    leaves the new generation's statistics beside the old schema, which would normalise the data the
    schema lists with statistics of data it does not list.
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


def load_dataset(
    path: str,
    split: str = "data",
    batch_size: int = 32,
    normalize: bool | str = False,
    epoch: int | None = None,
    **options,
):
    """The same tf.data pipeline as the output's generated ``parser.make_dataset``.

    Options: shuffle_buffer, num_parallel_reads, drop_remainder, repeat, seed, and
    normalized_fill: with ``normalize``, what the points nan_policy: fill filled become (default 0).
    ``normalize="tendency"``: the ``targets`` role's features as residuals, (x - x_before - mean) / std
    with the statistics of x(t+1) - x(t) (stats.tendency); the other features as with ``normalize=True``.
    ``epoch``: the samples in that epoch's global order instead (``schemas.epoch_order`` with
    ``seed``, default 0), read by offset through each shard's index: a fresh order every epoch,
    the same on every machine; one thread reads, so it is slower than the sequential read.
    """
    from schemas import parser_template  # imports TensorFlow; only readers pay for it

    schema = load_schema(path)
    schema.check_has_samples(split, str(path))
    normalization = normalization_constants(path, normalize) if normalize else None
    if epoch is not None:
        return _in_epoch_order(path, split, schema, batch_size, normalize, normalization, epoch, **options)
    try:
        return parser_template.build_dataset(
            schema.to_json(), str(path), split, batch_size, normalize=normalize, normalization=normalization, **options
        )
    except ValueError as error:  # the parser's checks of the shards (it imports TensorFlow alone: no UserError)
        raise UserError(str(error)) from None


#: Records read by offset together for the epoch-order dataset (one coalesced read per shard run).
_EPOCH_READ = 1024


def _in_epoch_order(path, split, schema, batch_size, normalize, normalization, epoch, seed=None, **options):
    """Batches of a split in ``epoch_order(n, seed, epoch)``, read record by record through the shard indexes."""
    import numpy as np
    import tensorflow as tf

    from schemas import parser_template
    from schemas.epochs import checked_word, epoch_order
    from schemas.random_access import RandomAccessSource

    unknown = set(options) - {"drop_remainder", "normalized_fill"}
    if unknown:
        raise UserError(f"load_dataset(epoch=...): {', '.join(sorted(unknown))} do not apply to a global order")
    # Checked now: inside tf.data a bad seed would surface as a generator's error, not as this line.
    epoch = checked_word(epoch, "load_dataset(epoch=...)")
    seed = checked_word(0 if seed is None else seed, "load_dataset(seed=...)")
    try:  # a shard cut short or damaged: one line now, rather than from inside tf.data, with its traceback
        parser_template.check_shards(schema.to_json(), str(path), split)
    except ValueError as error:
        raise UserError(str(error)) from None
    source = RandomAccessSource(path, split, schema=schema)
    n = len(source)
    source.records([])  # refuses packed records now, not inside tf.data

    def records():
        for start in range(0, n, _EPOCH_READ):
            yield from source.records(epoch_order(n, seed, epoch, np.arange(start, min(n, start + _EPOCH_READ))))

    dataset = tf.data.Dataset.from_generator(records, output_signature=tf.TensorSpec((), tf.string))
    return parser_template.parse_batches(
        dataset,
        schema.to_json(),
        batch_size,
        options.get("drop_remainder", False),
        normalize,
        normalization,
        options.get("normalized_fill", 0.0),
    )
