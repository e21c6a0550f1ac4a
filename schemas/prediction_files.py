"""A model's predictions on disk, read as batches for reassembly: TFRecords of tf.Example, or .npz of batched arrays.

Each prediction keeps the ``index/<dim>`` features of the record it was made from. A tf.Example
holds flat lists, so each feature is shaped as the output's feature of its name, or (another name)
as the first one whose size it has: the output's variables, then their shape without the kept dims.
"""

from __future__ import annotations

import math
import posixpath
from collections.abc import Iterator

import fsspec
import numpy as np

from schemas.errors import UserError
from schemas.example_codec import decode_varints, iter_fields
from schemas.npy_files import npz_arrays
from schemas.reader import DEFAULT_CHUNK, Batch
from schemas.schema import Schema
from schemas.tfrecord import read_records

SUFFIXES = (".npz", ".tfrecord", ".tfrecord.gz")


def list_predictions(directory: str) -> list[str]:
    """The prediction files in ``directory`` (any fsspec URL), sorted; UserError when there are none."""
    fs, path = fsspec.core.url_to_fs(directory)
    if not fs.isdir(path):
        raise UserError(f"--predictions: {directory} is not a directory; give the folder of prediction files")
    names = sorted(p for p in fs.ls(path, detail=False) if p.endswith(SUFFIXES))
    if not names:
        raise UserError(
            f"--predictions: {directory} holds no {', '.join(SUFFIXES)} file; write the predictions there as "
            "TFRecords of tf.Example or .npz batches, with the records' index/<dim> features"
        )
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    return [n if protocol in ("file", "local") else f"{protocol}://{n}" for n in names]


def decode_example(record: bytes) -> dict[str, np.ndarray]:
    """Every feature of a serialized tf.Example as a flat array (float32, int64, or bytes as object)."""
    out = {}
    for number, start, end in iter_fields(record, 0, len(record)):
        if number != 1:
            continue
        for entry, entry_start, entry_end in iter_fields(record, start, end):
            if entry != 1:
                continue
            name, values = None, None
            for field, a, b in iter_fields(record, entry_start, entry_end):
                if field == 1:
                    name = record[a:b].decode()
                elif field == 2:
                    values = _feature_values(record, a, b)
            if name is not None:
                out[name] = values if values is not None else np.zeros(0, np.float32)
    return out


def _feature_values(record: bytes, start: int, end: int) -> np.ndarray:
    for kind, a, b in iter_fields(record, start, end):
        lists = list(iter_fields(record, a, b))
        if kind == 2:  # FloatList, packed
            return np.concatenate([np.frombuffer(record[x:y], "<f4") for _, x, y in lists] or [np.zeros(0, "<f4")])
        if kind == 3:  # Int64List, packed varints
            return np.concatenate([decode_varints(record, x, y) for _, x, y in lists] or [np.zeros(0, np.int64)])
        if kind == 1:
            return np.array([record[x:y] for _, x, y in lists], dtype=object)
    return np.zeros(0, np.float32)


def _shaped(schema: Schema, name: str, values: np.ndarray, where: str) -> np.ndarray:
    if name.startswith("index/"):
        return values.reshape(())
    try:
        return values.reshape(schema.feature(name).shape)
    except KeyError:
        pass
    except ValueError:
        raise UserError(
            f"{where}: {name!r} holds {values.size} values where the output's feature has "
            f"{schema.feature(name).shape}; predict on the output's sample shape"
        ) from None
    keep = {a["dim"] for a in schema.sample["axes"] if a["role"] == "keep"}
    for feature in schema.variable_features:
        unkept = tuple(n for n, d in zip(feature.shape, feature.dims) if d not in keep)
        for shape in (feature.shape, unkept):
            if math.prod(shape) == values.size:
                return values.reshape(shape)
    raise UserError(
        f"{where}: {name!r} holds {values.size} values, the size of no sample of the output; write such "
        "predictions as .npz batches, whose arrays keep their shape"
    )


def read_predictions(url: str, schema: Schema) -> Iterator[Batch]:
    """Batches of predictions from one file: {name: (samples, *shape)}."""
    name = posixpath.basename(url)
    if url.endswith(".npz"):
        with fsspec.open(url, "rb") as stream:
            data = stream.read()
        with npz_arrays(data) as npz:
            batch = {key: npz[key] for key in npz.files}
        lengths = {len(v) for v in batch.values() if v.ndim}
        if len(lengths) != 1 or any(v.ndim == 0 for v in batch.values()):
            raise UserError(f"{url}: arrays of lengths {sorted(lengths)}; every array needs one leading batch axis")
        yield batch
        return
    compression = "gzip" if url.endswith(".gz") else None
    with fsspec.open(url, "rb", compression=compression) as stream:
        rows: list[dict[str, np.ndarray]] = []
        for i, record in enumerate(read_records(stream, name=url)):
            try:
                decoded = decode_example(record)
            except ValueError as error:
                message = f"{url}: record {i} is not a tf.Example ({error}); write tf.train.Example records"
                raise UserError(message) from None
            rows.append({k: _shaped(schema, k, v, f"{name}: record {i}") for k, v in decoded.items()})
            if len(rows) == DEFAULT_CHUNK:
                yield _stacked(rows, url)
                rows = []
        if rows:
            yield _stacked(rows, url)


def _stacked(rows: list[dict[str, np.ndarray]], url: str) -> Batch:
    names = rows[0].keys()
    if any(row.keys() != names for row in rows):
        raise UserError(f"{url}: its records hold different features; give every prediction the same features")
    return {name: np.stack([row[name] for row in rows]) for name in names}
