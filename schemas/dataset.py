"""A written output as a tf.data pipeline: its shards checked, read, parsed, batched and (optionally) normalised."""

from __future__ import annotations

from schemas.errors import UserError
from schemas.metadata import load_schema, normalization_constants
from schemas.stored_order import warn_sequential_read


def load_dataset(
    path: str,
    split: str = "data",
    batch_size: int = 32,
    normalize: bool | str = False,
    epoch: int | None = None,
    **options,
):
    """A split as a tf.data pipeline: the same as the output's generated ``parser.make_dataset``.

    Each local shard is checked against schema.json before it is read, and every shard's records are counted as
    they are read: a shard cut short, emptied, appended to or damaged ends the read in one line naming it.

    Args:
        path: the output's folder, a local path or an fsspec URL (``gs://...``).
        split: the split to read (``"data"`` for a build without ``splits:``).
        batch_size: samples per batch.
        normalize: True: ``(x - mean) / std`` with stats.json's constants; ``"tendency"``: the ``targets``
            role's features as residuals, (x - x_before - mean) / std with the statistics of x(t+1) - x(t)
            (stats.tendency), the others as with True.
        epoch: read the samples in that epoch's global order instead (``schemas.epoch_order`` with ``seed``,
            default 0), by offset through each shard's index: a fresh order every epoch, the same on every
            machine; one thread reads, so it is slower than the sequential read. An output built with
            shuffle.mode: read stores its records in unit order: without ``epoch`` its read is in that order,
            and warns once (``schemas.stored_order.UnitOrderWarning``).
        **options: ``shuffle_buffer``, ``num_parallel_reads``, ``drop_remainder``, ``repeat``, ``seed``, and
            ``normalized_fill`` (with ``normalize``: what the points nan_policy: fill filled become, default 0).

    Returns:
        A ``tf.data.Dataset`` of dicts of tensors shaped (batch, *feature shape).

    Raises:
        UserError: no complete output at ``path``, a split it does not hold (or with no data yet), a shard that
            disagrees with schema.json, a bad epoch or seed, or options that do not apply.
    """
    from schemas import parser_template  # imports TensorFlow; only readers pay for it

    schema = load_schema(path)
    schema.check_has_samples(split, str(path))
    normalization = normalization_constants(path, normalize) if normalize else None
    if epoch is not None:
        return _in_epoch_order(path, split, schema, batch_size, normalize, normalization, epoch, **options)
    warn_sequential_read(path, schema.sample)
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
