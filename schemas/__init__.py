"""The schema of an xarray-tfrecords output, its record encoder/decoder and its readers (no Beam).

Names load on first use, so that importing a submodule (``schemas.errors`` for the command
line's --help) does not pull in numpy or fsspec.
"""

import importlib

_EXPORTS = {
    "Feature": "schemas.schema",
    "Schema": "schemas.schema",
    "Shard": "schemas.schema",
    "UserError": "schemas.errors",
    "Reader": "schemas.reader",
    "read_split": "schemas.reader",
    "load_dataset": "schemas.dataset",
    "load_schema": "schemas.metadata",
    "load_stats": "schemas.metadata",
    "RandomAccessSource": "schemas.random_access",
    "open_source": "schemas.random_access",
    "epoch_order": "schemas.epochs",
    "ShuffledStream": "schemas.stream",
    "shuffled_stream": "schemas.stream",
    "reassemble": "schemas.reassembly",
    "Reassembly": "schemas.reassembly",
    "verify_output": "schemas.verify",
    "VerifyError": "schemas.verify",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'schemas' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
