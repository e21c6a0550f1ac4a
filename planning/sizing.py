"""Sizing: a record's bytes (typical and at most), and how many shards a split needs so none outgrows MAX_SHARD_MB."""

from __future__ import annotations

import logging
import math

from planning.config.model import MAX_SHARD_BYTES, MAX_SHARD_MB, BuildConfig
from schemas.errors import UserError
from schemas.example_codec import ExampleEncoder
from schemas.schema import Feature, Schema
from schemas.tfrecord import FOOTER_BYTES, HEADER_BYTES

logger = logging.getLogger(__name__)

#: Shards receive uneven numbers of samples (each sample's key picks its shard): planning keeps
#: this many standard deviations above the mean within MAX_SHARD_MB.
_SHARD_SIGMAS = 6


def record_bytes(features: tuple[Feature, ...]) -> int:
    """A typical sample's record size (int64 values at 5 bytes, masks at 1): what a unit holds per sample."""
    payload = sum(4 * f.size if f.dtype == "float32" else (1 if f.role == "mask" else 5) * f.size for f in features)
    headers = sum(len(f.name) + 12 for f in features)
    return payload + headers + 16


def record_bytes_bound(features: tuple[Feature, ...], per_record: int) -> int:
    """The most bytes one framed record (of ``per_record`` samples) can take.

    Exact for float32 features and every header; int64 values at a varint's longest, 10 bytes.
    """
    record = Schema(features, examples_per_record=per_record).record_features()
    return ExampleEncoder(record).max_record_length() + HEADER_BYTES + FOOTER_BYTES


def num_shards(config: BuildConfig, samples: int, record_bound: int) -> int:
    """The configured shard count, or enough for target_shard_mb; never enough samples for a shard over MAX_SHARD_MB."""
    per_record = config.output.examples_per_record
    records_per_shard = MAX_SHARD_BYTES // record_bound
    if records_per_shard < 1:
        what = "a sample's record" if per_record == 1 else f"a record of {per_record} samples"
        fix = "cut smaller samples or fewer variables" if per_record == 1 else "lower output.examples_per_record"
        raise UserError(
            f"output: {what} may take {record_bound / 1e6:,.0f} MB, more than a shard may hold "
            f"({MAX_SHARD_MB} MB); {fix}"
        )
    # A shard of c samples holds ceil(c / per_record) records, so up to `fits` samples fit in one.
    fits = per_record * records_per_shard
    # A sample's key picks its shard, so a shard's count is binomial about the mean, with a
    # standard deviation under sqrt(mean): keep mean + _SHARD_SIGMAS deviations within `fits`.
    most = ((math.sqrt(_SHARD_SIGMAS**2 + 4 * fits) - _SHARD_SIGMAS) / 2) ** 2
    needed = math.ceil(samples / most)
    total_bytes = samples / per_record * record_bound
    wanted = config.output.num_shards or math.ceil(total_bytes / (config.output.target_shard_mb * 1e6))
    if wanted < needed:
        logger.warning(
            "output.num_shards: %d shards could hold up to about %.0f MB each; writing %d instead (at most %d MB each)",
            wanted,
            total_bytes / wanted / 1e6,
            needed,
            MAX_SHARD_MB,
        )
    return max(1, min(max(wanted, needed), samples))
