"""grid.npz: the values of schema.json's large grid entries (a curvilinear grid's 2-D lat, lon), beside it.

schema.json stays small whatever the grid: an entry with more than INLINE_VALUES values holds, in
place of its list, a reference ``{"file": "grid.npz", "array": ..., "count": ..., "sha256": ...}``
to one array of the sidecar (NumPy's .npz, no pickles, schemas.sidecar), whose bytes' sha256 it
records; readers read it only when a coordinate's values are asked for.
"""

from __future__ import annotations

import dataclasses
import posixpath
import zipfile
from typing import Any

import numpy as np

from schemas.errors import UserError
from schemas.npy_files import npz_arrays
from schemas.schema import GRID_FILE, Schema, plain_file_name
from schemas.sidecar import digest as sidecar_digest
from schemas.sidecar import npz_bytes, read_sidecar

#: Values a grid entry holds inline in schema.json; above this its values go to grid.npz. A 1-D axis stays inline
#: (a regular one is a start and a step anyway); a 64 x 64 2-D coordinate is 4,096 values, about 80 KB of JSON.
INLINE_VALUES = 4096
#: The keys of a grid entry that hold its values (numbers, or a time's seconds).
VALUE_KEYS = ("values", "seconds")


def _large(entry: Any, key: str) -> bool:
    """Whether a grid entry's ``key`` holds more numbers than schema.json keeps inline (text always stays)."""
    stored = entry.get(key) if isinstance(entry, dict) else None
    return isinstance(stored, list) and len(stored) > INLINE_VALUES and entry.get("dtype") != "str"


def _array_name(name: str) -> str:
    """The sidecar member of a grid entry: its name with what a zip member name would make a folder of replaced."""
    return name.replace("/", "_").replace("\\", "_")


def split_grid(schema: Schema) -> tuple[Schema, bytes | None]:
    """The schema with each large grid entry's values replaced by a reference to grid.npz, and grid.npz's bytes
    (None where every entry is small enough to stay inline: no sidecar then)."""
    arrays: dict[str, np.ndarray] = {}
    moved: list[tuple[str, str, str]] = []  # (entry, its key holding values, array)
    for name, entry in schema.grid.items():
        for key in VALUE_KEYS:
            if _large(entry, key):
                array = _array_name(name) if key == "values" else f"{_array_name(name)}.{key}"
                dtype = "int64" if key == "seconds" else entry["dtype"]
                arrays[array] = np.asarray(entry[key], dtype=dtype)
                moved.append((name, key, array))
    if not arrays:
        return schema, None
    data = npz_bytes(arrays)
    digest = sidecar_digest(data)
    grid = dict(schema.grid)
    for name, key, array in moved:
        reference = {"file": GRID_FILE, "array": array, "count": len(arrays[array]), "sha256": digest}
        grid[name] = {**grid[name], key: reference}
    return dataclasses.replace(schema, grid=grid), data


def is_reference(stored: Any) -> bool:
    """Whether a grid entry's values are a reference to the sidecar (else the values themselves)."""
    return isinstance(stored, dict) and "file" in stored


def referenced_values(reference: dict[str, Any], dtype: str, folder: str | None) -> np.ndarray:
    """The values a grid entry's reference names, read from the sidecar in ``folder`` (the output's) and checked.

    Raises:
        UserError: no folder to read from, a missing or replaced sidecar, or one not holding the array as named.
    """
    name = reference["file"]
    if not plain_file_name(name):  # (load_schema refuses it first; a schema made otherwise meets this)
        raise UserError(f"schema.json's grid names {name!r}, not a file of the output's folder; build the output again")
    if not folder:
        raise UserError(
            f"schema.json's grid keeps some values in {name}, and this schema was not loaded from an output's "
            "folder; load it with schemas.load_schema(output) so they can be read"
        )
    data = read_sidecar(folder, name, reference["sha256"], "the values of the grid's large coordinates")
    url = posixpath.join(folder, name)
    try:
        with npz_arrays(data) as archive:
            values = archive[reference["array"]]
    except (KeyError, ValueError, OSError, zipfile.BadZipFile) as error:
        raise UserError(f"{url}: holds no array {reference['array']!r} ({error}); build the output again") from None
    if values.ndim != 1 or len(values) != reference["count"] or values.dtype != np.dtype(dtype):
        raise UserError(
            f"{url}: array {reference['array']!r} holds {values.dtype} {values.shape} where schema.json says "
            f"{dtype} ({reference['count']},); build the output again"
        )
    return values
