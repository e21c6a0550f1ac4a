"""A model's predictions on disk, read as batches for reassembly: TFRecords of tf.Example, or .npz of batched arrays.

Each prediction keeps the ``index/<dim>`` features of the record it was made from. A tf.Example
holds flat lists, so each feature is shaped as the output's feature of its name, or (another name)
as the first one whose size it has: the output's variables, then their shape without the kept dims.
"""

from __future__ import annotations

import io
import math
import os
import stat
import zipfile
from collections.abc import Iterator

import fsspec
import numpy as np

from schemas.errors import UserError
from schemas.example_codec import decode_varints, iter_fields
from schemas.npy_files import npz_arrays
from schemas.reader import DEFAULT_CHUNK, Batch
from schemas.schema import Schema
from schemas.tfrecord import read_records
from schemas.urls import special_kind

SUFFIXES = (".npz", ".tfrecord", ".tfrecord.gz")
#: Values per sample an array under a name the output has no feature of may hold, as a multiple of the output's
#: largest feature: room for a channel dim a model adds (an ensemble's members), not for a decompression bomb.
EXTRA_VALUES_FACTOR = 1024


def list_predictions(directory: str) -> list[str]:
    """The prediction files in ``directory`` (any fsspec URL), sorted; UserError when there are none."""
    fs, path = fsspec.core.url_to_fs(directory)
    if not fs.isdir(path):
        raise UserError(f"--predictions: {directory} is not a directory; give the folder of prediction files")
    entries = sorted((e for e in fs.ls(path, detail=True) if e["name"].endswith(SUFFIXES)), key=lambda e: e["name"])
    for entry in entries:
        _check_regular(fs, entry)
    names = [e["name"] for e in entries]
    if not names:
        raise UserError(
            f"--predictions: {directory} holds no {', '.join(SUFFIXES)} file; write the predictions there as "
            "TFRecords of tf.Example or .npz batches, with the records' index/<dim> features"
        )
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    return [n if protocol in ("file", "local") else f"{protocol}://{n}" for n in names]


def _check_regular(fs, entry: dict) -> None:
    """UserError unless a listed prediction file is a regular file: a FIFO would block its read for ever, a device
    read without end, a folder fail deep inside the pipeline."""
    name = entry["name"]
    protocols = fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)
    if "file" in protocols:
        try:
            mode = os.stat(name).st_mode  # (following a link: what it points at is what would be read)
        except OSError as error:
            raise UserError(f"--predictions: {name} cannot be read ({error.strerror}); fix or remove it") from None
        kind = None if stat.S_ISREG(mode) else special_kind(mode) or "a directory"
    else:
        kind = "a directory" if entry.get("type") == "directory" else None
    if kind is not None:
        raise UserError(f"--predictions: {name} is not a regular file ({kind}); move it out of the folder")


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
        if values.dtype.kind not in "iu" or values.size != 1:
            raise UserError(
                f"{where}: {name!r} holds {values.size} {values.dtype} value(s); an index is the record's one "
                "integer index/<dim>: keep it as the records hold it (an int64_list)"
            )
        return values.reshape(())
    try:
        return values.reshape(schema.feature(name).shape)
    except KeyError:
        check_name(name, where)
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


def read_predictions(url: str, schema: Schema, most_samples: int | None = None) -> Iterator[Batch]:
    """Batches of predictions from one file: {name: (samples, *shape)}. ``most_samples``: the most samples one
    file can hold (the split's distinct keys); an .npz declaring more is refused before it is decompressed."""
    if url.endswith(".npz"):
        with fsspec.open(url, "rb") as stream:
            data = stream.read()
        declared = _npz_headers(data, url)
        _check_declared(declared, schema, url, most_samples)
        try:
            with npz_arrays(data) as npz:
                batch = {key: npz[key] for key in npz.files}
        except (ValueError, OSError, EOFError, zipfile.BadZipFile) as error:
            raise UserError(f"{url}: not a readable .npz file ({error}); write it with numpy.savez") from None
        yield batch
        return
    compression = "gzip" if url.endswith(".gz") else None
    with fsspec.open(url, "rb", compression=compression) as stream:
        rows: list[dict[str, np.ndarray]] = []
        for i, record in enumerate(read_records(_RecordsCapped(stream, url, _largest_record(schema)), name=url)):
            try:
                decoded = decode_example(record)
            except ValueError as error:
                message = f"{url}: record {i} is not a tf.Example ({error}); write tf.train.Example records"
                raise UserError(message) from None
            rows.append({k: _shaped(schema, k, v, f"{url}: record {i}") for k, v in decoded.items()})
            if len(rows) == DEFAULT_CHUNK:
                yield _stacked(rows, url)
                rows = []
        if rows:
            yield _stacked(rows, url)


def _largest_record(schema: Schema) -> int:
    """The most bytes a tf.Example of one prediction can take: every feature of the output, and another name at
    EXTRA_VALUES_FACTOR times its largest sample, at 10 bytes a value (an int64 varint's most) and 1 KB a name."""
    largest = max((f.size for f in schema.variable_features), default=1)
    values = sum(f.size for f in schema.features) + largest * EXTRA_VALUES_FACTOR
    return 10 * values + 1024 * (len(schema.features) + 1)


class _RecordsCapped:
    """A TFRecord stream whose reads of a record's data are refused beyond what a prediction can take: a record's
    header declares its length, and a compressed file would be decompressed that far (a few KB can declare GBs)."""

    def __init__(self, stream, url: str, limit: int):
        self.stream, self.url, self.limit = stream, url, limit

    def read(self, size: int = -1) -> bytes:
        if size < 0 or size > self.limit:
            raise UserError(
                f"{self.url}: a record declares at least {size:,} bytes, more than a prediction of this output's "
                "samples "
                f"takes ({self.limit:,}); write one tf.Example per sample"
            )
        return self.stream.read(size)


def _npz_headers(data: bytes, url: str) -> dict[str, tuple[np.dtype, tuple[int, ...]]]:
    """Each array of an .npz file's bytes: its dtype and shape, from its .npy header alone (the few bytes of each
    member decompressed to read it, never its data)."""
    declared = {}
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            for info in archive.infolist():
                key = info.filename.removesuffix(".npy")
                with archive.open(info) as member:
                    version = np.lib.format.read_magic(member)
                    if version == (1, 0):
                        shape, _, dtype = np.lib.format.read_array_header_1_0(member)
                    else:
                        shape, _, dtype = np.lib.format.read_array_header_2_0(member)
                declared[key] = (np.dtype(dtype), tuple(shape))
    except (ValueError, OSError, EOFError, zipfile.BadZipFile, RuntimeError, NotImplementedError) as error:
        raise UserError(f"{url}: not a readable .npz file ({error}); write it with numpy.savez") from None
    return declared


def _check_declared(
    declared: dict[str, tuple[np.dtype, tuple[int, ...]]], schema: Schema, url: str, most_samples: int | None
) -> None:
    """UserError unless every array an .npz declares is one a prediction may hold: numbers, one leading batch
    axis of one length, integer index/<dim> of one value per sample, an output's feature at its shape; and no
    more samples, nor values per sample, than the output's grid can take."""
    if not declared:
        raise UserError(f"{url}: holds no array; write the predictions with their index/<dim> arrays")
    lengths = {shape[0] for _, shape in declared.values() if shape}
    if len(lengths) != 1 or any(not shape for _, shape in declared.values()):
        raise UserError(f"{url}: arrays of lengths {sorted(lengths)}; every array needs one leading batch axis")
    samples = lengths.pop()
    if most_samples is not None and samples > most_samples:
        raise UserError(
            f"{url}: its arrays declare {samples:,} samples, more than the split holds ({most_samples:,}); "
            "write the predictions of this output's samples only"
        )
    features = {f.name: f for f in schema.features}
    largest = max((f.size for f in schema.variable_features), default=1)
    for key, (dtype, shape) in declared.items():
        if dtype.kind not in "biuf":
            raise UserError(f"{url}: {key!r} holds {dtype}, not numbers; write numeric arrays")
        if key.startswith("index/"):
            if dtype.kind not in "iu":
                raise UserError(
                    f"{url}: {key!r} holds {dtype}; an index is the record's integer index/<dim>: keep it as "
                    "the records hold it (int64)"
                )
            if len(shape) != 1:
                raise UserError(f"{url}: {key!r} has shape {shape[1:]} per sample; an index is one integer")
            continue
        feature = features.get(key)
        per_sample = math.prod(shape[1:])
        if feature is not None and feature.role == "variable" and per_sample != feature.size:
            raise UserError(
                f"{url}: {key!r} has shape {shape[1:]} where the output's feature has {feature.shape}; "
                "predict on the output's sample shape"
            )
        if per_sample > largest * EXTRA_VALUES_FACTOR:
            raise UserError(
                f"{url}: {key!r} declares {per_sample:,} values per sample, more than {EXTRA_VALUES_FACTOR} x "
                f"the output's largest sample ({largest:,}); predict on the output's sample shape"
            )
        if feature is None:
            check_name(key, url)


def check_name(name: str, where: str) -> None:
    """UserError for a prediction's name (not a feature of the output) that Zarr would change into another: a
    backslash or slash is a folder separator to it, and '.', '..' or a leading '.' are its own."""
    if "\\" in name or "/" in name or name.startswith(".") or not name:
        raise UserError(
            f"{where}: the prediction name {name!r} cannot name a variable of a Zarr store (a slash or backslash "
            "separates its folders, a leading '.' marks its metadata); rename it"
        )


def _stacked(rows: list[dict[str, np.ndarray]], url: str) -> Batch:
    names = rows[0].keys()
    if any(row.keys() != names for row in rows):
        raise UserError(f"{url}: its records hold different features; give every prediction the same features")
    return {name: np.stack([row[name] for row in rows]) for name in names}
