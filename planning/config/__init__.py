"""The build configuration: its model (planning.config.model) and its loading from YAML and overrides (.loading).

The names callers use are importable from here; planning's own modules import the model directly.
"""

from planning.config.loading import load_config, parse_config, read_yaml, with_absolute_paths
from planning.config.model import (
    MAX_SHARD_BYTES,
    MAX_SHARD_MB,
    BuildConfig,
    CoordValue,
    SelectRange,
    format_validation_error,
)

__all__ = [
    "MAX_SHARD_BYTES",
    "MAX_SHARD_MB",
    "BuildConfig",
    "CoordValue",
    "SelectRange",
    "format_validation_error",
    "load_config",
    "parse_config",
    "read_yaml",
    "with_absolute_paths",
]
