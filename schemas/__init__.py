"""The schema of an xarray-tfrecords output, its record encoder/decoder and its readers (no Beam)."""

from schemas.dataset import load_dataset, load_schema, load_stats
from schemas.errors import UserError
from schemas.schema import Feature, Schema, Shard

__all__ = ["Feature", "Schema", "Shard", "UserError", "load_dataset", "load_schema", "load_stats"]
