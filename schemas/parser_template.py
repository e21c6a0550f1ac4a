"""Reads an xarray-tfrecords output with TensorFlow alone (the template of every generated parser.py).

Usage:
    import parser                       # this file, beside the shards (or anywhere, with data_dir=)
    ds = parser.make_dataset("train", batch_size=32)
    for batch in ds.take(1):
        print({name: value.shape for name, value in batch.items()})
"""

import hashlib
import io
import json
import os
import threading
import warnings

import numpy as np
import tensorflow as tf

# The generator replaces the next four lines with this output's schema, location and
# normalisation constants (stats.tendency's residual ones last). They are data, not code: each is
# one quoted string literal.
SCHEMA = None
OUTPUT_URL = None
NORMALIZATION = None
RESIDUALS = None

_DTYPES = {"float32": tf.float32, "int64": tf.int64}
_COMPRESSION = {None: "", "gzip": "GZIP"}
_RECORD_COUNT = "record/count"
# The functions given to tf.data hold no Python control flow on tensors, so AutoGraph has nothing
# to convert; converting needs this module in sys.modules, which a parser.py loaded by its path
# may not be in (TensorFlow then warns "AutoGraph could not transform ...").
_AS_IS = tf.autograph.experimental.do_not_convert


def feature_spec(schema):
    """{feature name: tf.io.FixedLenFeature} of one sample."""
    return {f["name"]: tf.io.FixedLenFeature(shape=f["shape"], dtype=_DTYPES[f["dtype"]]) for f in schema["features"]}


def record_spec(schema):
    """The features as a record stores them: packed records add a leading axis and a count."""
    per_record = schema.get("examples_per_record", 1)
    if per_record == 1:
        return feature_spec(schema)
    spec = {
        f["name"]: tf.io.FixedLenFeature(shape=[per_record, *f["shape"]], dtype=_DTYPES[f["dtype"]])
        for f in schema["features"]
    }
    spec[_RECORD_COUNT] = tf.io.FixedLenFeature(shape=[], dtype=tf.int64)
    return spec


def shard_paths(schema, data_dir, split):
    """The shard files of one split, in written order."""
    return [_shard_path(data_dir, shard["file"]) for shard in _split_shards(schema, split, data_dir)]


def _split_shards(schema, split, data_dir):
    """The split's shards, each a dict of its ``file``, ``records`` and ``bytes``: listed in schema.json, or (its
    second format) named by each generation's rule, with their counts from the sidecar schema.json names."""
    splits = schema["splits"]
    if split not in splits:
        raise ValueError(f"no split {split!r} in this dataset; it has: {', '.join(splits)}")
    if not splits[split]["shards"]:  # (tf.data would fail on an empty file list, naming no split)
        reason = schema.get("sample", {}).get("splits", {}).get(split, {}).get("no_data_yet")
        why = f" ({reason})" if reason else ""
        raise ValueError(f"split {split!r} holds no samples yet{why}; append the data that reaches it, or read another")
    if "generations" not in splits[split]:
        return splits[split]["shards"]
    records, sizes = _shard_counts(schema["shards"], data_dir)
    shards, at = [], splits[split]["start"]
    for rule in splits[split]["generations"]:
        marked = f"{split}-g{rule['generation']:03d}" if rule["generation"] else split
        suffix = ".tfrecord.gz" if rule["compression"] == "gzip" else ".tfrecord"
        for number in range(rule["shards"]):
            name = f"{marked}-{number:05d}-of-{rule['shards']:05d}{suffix}"
            shards.append({"file": name, "records": int(records[at]), "bytes": int(sizes[at])})
            at += 1
    return shards


_COUNTS_READ = {}
# numpy parses an .npy header with ``ast``, which two threads must not do at once (python/cpython#106905).
_NPY_LOCK = threading.Lock()


def _shard_counts(reference, data_dir):
    """Every shard's records and bytes from the sidecar (shards.npz), read once, checked against schema.json's
    size and sha256 before any count in it is used: the output's files are data anyone may have replaced."""
    path = _shard_path(data_dir, reference["file"])
    key = (path, reference["sha256"])
    if key not in _COUNTS_READ:
        fix = "copy it again with the output, or build the output again"
        try:
            with tf.io.gfile.GFile(path, "rb") as stream:
                data = stream.read(reference["bytes"] + 1)
        except tf.errors.NotFoundError:
            raise ValueError(f"{path}: missing, but schema.json names it (its shards' counts); {fix}") from None
        if len(data) != reference["bytes"] or hashlib.sha256(data).hexdigest() != reference["sha256"]:
            raise ValueError(f"{path}: not the file schema.json was written with (its size or sha256 differs); {fix}")
        with _NPY_LOCK, np.load(io.BytesIO(data), allow_pickle=False) as arrays:
            counts = tuple(arrays[name].astype(np.int64) for name in ("records", "bytes"))
        if any(len(values) != reference["count"] or (values < 0).any() for values in counts):
            raise ValueError(f"{path}: does not hold {reference['count']} shards' counts; {fix}")
        _COUNTS_READ[key] = counts
    return _COUNTS_READ[key]


def check_shards(schema, data_dir, split):
    """Each local shard of a split checked against schema.json before TensorFlow reads it: its size, and (unless
    compressed) every record's length header, which must end inside the shard where the next record starts.

    TensorFlow's reader allocates whatever a record's length header says before reading it: a header of 2**40
    (its checksum valid) ends the process. One 8-byte read per record finds it first (a few microseconds a
    record on a local disk). Remote shards are not walked (a request per record would cost more than reading
    them); their records are counted as they are read, as every shard's are.
    """
    compressed = bool(schema.get("compression"))
    for shard in _split_shards(schema, split, data_dir):
        path = _shard_path(data_dir, shard["file"])
        local = path.removeprefix("file://")
        if "://" in local:
            continue
        try:
            size = os.stat(local).st_size
        except FileNotFoundError:
            raise ValueError(f"{path}: missing, but schema.json lists it; build the output again") from None
        if size != shard["bytes"]:
            raise ValueError(
                f"{path}: {size} bytes on disk, schema.json says {shard['bytes']} (the shard was cut short, emptied "
                "or written to since); build the output again"
            )
        if not compressed:
            _check_frames(local, path, shard["records"], size)


def _check_frames(local, path, records, size):
    """ValueError naming the record whose length header runs past the shard, or the shard's records miscounted."""
    offset = 0
    with open(local, "rb", buffering=0) as stream:
        for record in range(records):
            stream.seek(offset)
            header = stream.read(8)
            if len(header) < 8:
                raise ValueError(
                    f"{path}: record {record}: the shard ends at byte {offset}, but schema.json lists {records} "
                    "records; build the output again"
                )
            length = int.from_bytes(header, "little")
            if length > size - offset - 16:
                raise ValueError(
                    f"{path}: record {record}: its length header says {length} bytes, past the shard's end at byte "
                    f"{size}; the shard is damaged: build the output again"
                )
            offset += length + 16
    if offset != size:
        raise ValueError(
            f"{path}: its {records} records end at byte {offset}, the shard at byte {size}; build the output again"
        )


def _counted(records, path, expected, chunk):
    """A shard's records in chunks (1-D string tensors), ending in an error that names the shard (and the record)
    where it holds more or fewer than schema.json lists: a shard cut short or appended to after it was checked,
    or a remote or compressed one, which no check at open walks.

    Counted a chunk at a time, closed by an empty chunk, and the chunks are batched as they come (records fully
    shuffled on disk are as random in a run of one shard as taken shard by shard): a check per record cost
    more than the read (a scan per record read 400k small records in 38-45 s against 2.7 s).
    """
    chunks = records.batch(chunk).concatenate(tf.data.Dataset.from_tensors(tf.constant([], tf.string)))

    def count(seen, records):
        now = seen + tf.size(records, out_type=tf.int64)
        last = tf.equal(tf.size(records), 0)
        wrong = tf.logical_or(now > expected, tf.logical_and(last, now < expected))

        def refuse():
            listed = tf.strings.as_string(expected)
            short = tf.strings.join([": ", tf.strings.as_string(now), " records, but schema.json lists ", listed])
            extra = tf.strings.join([": record ", listed, ": more records than the ", listed, " schema.json lists"])
            changed = " (the shard changed after the output was built); build the output again"
            message = tf.strings.join([path, tf.where(last, short, extra), changed])
            with tf.control_dependencies([tf.debugging.Assert(False, [message])]):
                return tf.identity(records)

        return now, tf.cond(wrong, refuse, lambda: records)

    return chunks.scan(tf.constant(0, tf.int64), _AS_IS(count)).filter(_AS_IS(lambda records: tf.size(records) > 0))


#: Bytes of records held in chunks across the shards read at once (each shard holds one chunk at a time), and
#: the most one shard's chunk may hold.
_CHUNKS_BYTES, _CHUNK_BYTES = 64 * 2**20, 8 * 2**20


def _chunk(shards, batch, cycle):
    """Records counted (and batched) together: a whole batch where it fits in the shard's share of _CHUNKS_BYTES,
    so that batching the chunks copies nothing more (an unaligned chunk costs a copy: a third slower, measured);
    else as many records as fit. Gzip shards are sized by their compressed bytes."""
    largest = max((shard["bytes"] // max(1, shard["records"]) for shard in shards), default=1)
    fit = max(1, min(_CHUNK_BYTES, _CHUNKS_BYTES // max(1, cycle)) // max(1, largest))
    return batch if batch <= fit else fit


def _shard_path(data_dir, name):
    """Where a shard named in the schema is; refused where the name leaves the output's folder, or where a local
    path is not a regular file (TensorFlow would read a FIFO's writer's bytes, or block on it for ever)."""
    if name in ("", ".", "..") or os.path.basename(name) != name or "\\" in name:
        raise ValueError(f"schema.json: shard {name!r} is not the name of a file in the output's folder; rebuild it")
    path = os.path.join(data_dir, name)
    local = path.removeprefix("file://")
    if "://" not in local and os.path.exists(local) and not os.path.isfile(local):  # (isfile: stat's S_ISREG)
        raise ValueError(f"{path}: not a regular file; build the output again")
    return path


def _unpack(parsed, per_record):
    """Packed records -> their real samples, flattened into one batch."""
    count = parsed.pop(_RECORD_COUNT)
    real = tf.sequence_mask(count, per_record)
    return {name: tf.boolean_mask(values, real) for name, values in parsed.items()}


def _normalizer(normalization, normalized_fill):
    """(x - mean) / std per feature; then the points nan_policy: fill filled become ``normalized_fill``.

    stats.json says how to find them (``filled``): the feature's mask, or values equal to the
    fill value where no real value can equal it.
    """
    fill = tf.constant(normalized_fill, tf.float32)
    constants = {}
    for name, values in normalization.items():
        filled = values.get("filled") or {}
        where = tf.constant(filled["where"], tf.bool) if "where" in filled else None
        constants[name] = (
            tf.constant(values["mean"], tf.float32),
            tf.constant(values["std"], tf.float32),
            filled.get("mask"),
            filled.get("equal_to"),
            where,
            values.get("residual_of"),
        )

    def normalize(batch):
        out = dict(batch)
        for name, (mean, std, mask, equal_to, where, residual_of) in constants.items():
            if name not in batch:
                continue
            value = x = batch[name]
            if residual_of is not None:  # normalize="tendency": x - x_before, x_before from another feature
                before = batch[residual_of["feature"]]
                for axis, indices in residual_of["take"]:
                    before = tf.gather(before, indices, axis=axis + 1)
                x = value - before
            normalized = (x - mean) / std
            if mask is not None:
                normalized = tf.where(tf.not_equal(batch[mask], 0), fill, normalized)
            elif where is not None:
                normalized = tf.where(tf.logical_and(tf.equal(value, equal_to), where), fill, normalized)
            out[name] = normalized
        return out

    return _AS_IS(normalize)


def build_dataset(
    schema,
    data_dir,
    split="data",
    batch_size=32,
    shuffle_buffer=0,
    num_parallel_reads=tf.data.AUTOTUNE,
    drop_remainder=False,
    repeat=False,
    seed=None,
    normalize=False,
    normalization=None,
    normalized_fill=0.0,
):
    """A tf.data.Dataset of batches: dicts of tensors shaped (batch, *feature shape).

    The records are already fully shuffled on disk; ``shuffle_buffer`` > 0 adds a fresh
    shuffle of shard order and records for each epoch. ``normalize`` applies (x - mean) / std
    with the statistics of the reference split (stats.json), per variable or per level, and
    sets the points nan_policy: fill filled to ``normalized_fill`` (0: the mean) afterwards.
    """
    files = shard_paths(schema, data_dir, split)
    check_shards(schema, data_dir, split)
    shards = _split_shards(schema, split, data_dir)
    files_ds = tf.data.Dataset.from_tensor_slices((files, tf.constant([s["records"] for s in shards], tf.int64)))
    if shuffle_buffer:
        files_ds = files_ds.shuffle(len(files), seed=seed)
    compression = _COMPRESSION[schema.get("compression")]
    # Read every shard at once (up to 64): AUTOTUNE would read only as many as there are cores,
    # which starves the parser when records are small.
    cycle = len(files) if num_parallel_reads == tf.data.AUTOTUNE else num_parallel_reads
    per_record = schema.get("examples_per_record", 1)
    chunk = _chunk(shards, max(1, batch_size // per_record), max(1, min(cycle, 64)))
    dataset = files_ds.interleave(
        _AS_IS(lambda path, n: _counted(tf.data.TFRecordDataset(path, compression_type=compression), path, n, chunk)),
        cycle_length=max(1, min(cycle, 64)),
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=not shuffle_buffer,
    )
    if shuffle_buffer:
        dataset = dataset.unbatch().shuffle(shuffle_buffer, seed=seed)
    if repeat:
        dataset = dataset.repeat()
    return parse_batches(
        dataset, schema, batch_size, drop_remainder, normalize, normalization, normalized_fill, not shuffle_buffer
    )


def parse_batches(
    dataset, schema, batch_size, drop_remainder, normalize, normalization, normalized_fill, chunked=False
):
    """Serialized records (``chunked``: 1-D tensors of them) -> parsed batches (unpacked, normalised if asked),
    prefetched."""
    spec = record_spec(schema)
    per_record = schema.get("examples_per_record", 1)

    def batched(size, drop):
        return dataset.rebatch(size, drop_remainder=drop) if chunked else dataset.batch(size, drop_remainder=drop)

    # Batch before parsing: parse_example on a batch is far cheaper than per-record parsing.
    if per_record == 1:
        dataset = batched(batch_size, drop_remainder)
        parse = _AS_IS(lambda records: tf.io.parse_example(records, spec))
        dataset = dataset.map(parse, num_parallel_calls=tf.data.AUTOTUNE)
    else:
        dataset = batched(max(1, batch_size // per_record), False)
        dataset = dataset.map(
            _AS_IS(lambda records: _unpack(tf.io.parse_example(records, spec), per_record)),
            num_parallel_calls=tf.data.AUTOTUNE,
        )
        dataset = dataset.rebatch(batch_size, drop_remainder=drop_remainder)
    if normalize:
        if not normalization:
            raise ValueError("normalize needs the normalisation constants of stats.json")
        dataset = dataset.map(_normalizer(normalization, normalized_fill), num_parallel_calls=tf.data.AUTOTUNE)
    return dataset.prefetch(tf.data.AUTOTUNE)


#: schema.json's record of its commit (its generations and their digest): this file serves only the commit it was
#: generated for.
_COMMIT_KEYS = ("generations", "generations_sha256")


def check_output(schema, data_dir):
    """ValueError unless the output at ``data_dir`` is the one this schema describes (its schema.json equal): a
    parser.py copied elsewhere, or kept from an earlier build, would read another output's shards with its own
    shard list, shapes and normalisation constants; one an append stopped during its commit left would serve a
    commit that never happened. Shards copied elsewhere without their schema.json are read as this file describes
    them (each local shard's size and records are checked against it before reading: check_shards)."""
    url = os.path.join(data_dir, "schema.json")
    local = url.removeprefix("file://")
    if "://" not in local and os.path.exists(local) and not os.path.isfile(local):
        raise ValueError(f"{url}: not a regular file; build the output again")
    try:
        with tf.io.gfile.GFile(url, "rb") as stream:
            found = json.loads(stream.read())
    except tf.errors.NotFoundError:
        return
    except (ValueError, RecursionError):
        raise ValueError(f"{url}: not a schema of this tool (not JSON); build the output again") from None
    if found == schema:
        return
    if not isinstance(found, dict):
        raise ValueError(f"{url}: not a schema of this tool (not a JSON object); build the output again")
    committed, mine = found.get("sources") or {}, schema.get("sources") or {}
    if isinstance(committed, dict) and any(committed.get(key) != mine.get(key) for key in _COMMIT_KEYS):
        raise ValueError(
            f"{url}: commits {committed.get('generations')} generation(s), not the {mine.get('generations')} this "
            "parser.py was written for: an append stopped during its commit, or the output was appended to since; "
            "run the same --append again (it puts the committed files back, then completes), or use the parser.py "
            "written beside that schema.json"
        )
    keys = sorted(set(found) | set(schema), key=str)
    differ = [str(key) for key in keys if found.get(key) != schema.get(key)]
    raise ValueError(
        f"{url}: not the output this parser.py was generated for (they differ in {', '.join(differ)}: it was "
        "built again or appended to since); use the parser.py written beside that schema.json"
    )


def _default_data_dir():
    here = os.path.dirname(os.path.abspath(__file__))
    if os.path.exists(os.path.join(here, "schema.json")):
        return here
    return OUTPUT_URL


_WARNED = []

if SCHEMA is not None:
    SCHEMA = json.loads(SCHEMA)
    NORMALIZATION = json.loads(NORMALIZATION)
    RESIDUALS = json.loads(RESIDUALS)
    FEATURES = feature_spec(SCHEMA)

    def make_dataset(
        split="data",
        batch_size=32,
        shuffle_buffer=0,
        num_parallel_reads=tf.data.AUTOTUNE,
        drop_remainder=False,
        repeat=False,
        seed=None,
        normalize=False,
        data_dir=None,
        normalized_fill=0.0,
    ):
        """Batches of one split of this dataset: dicts of tensors shaped (batch, *feature shape).

        ``normalize`` applies (x - mean) / std from this output's statistics, then sets the
        points nan_policy: fill filled to ``normalized_fill``; ``normalize="tendency"`` the same,
        but the ``targets`` role's features become residuals, (x - x_before - mean) / std with
        the statistics of x(t+1) - x(t) (stats.tendency). ``data_dir``
        defaults to this file's directory if the shards are beside it, else to the output URL
        the dataset was written to (e.g. gs://...).
        """
        normalization = NORMALIZATION
        if normalize == "tendency":
            if not RESIDUALS:
                raise ValueError(
                    "normalize='tendency' needs residual constants: build with stats.tendency and sample.roles "
                    "holding a `targets` role whose steps' previous steps the sample holds"
                )
            normalization = {**NORMALIZATION, **RESIDUALS}
        data_dir = data_dir or _default_data_dir()
        check_output(SCHEMA, data_dir)
        if (SCHEMA.get("sample") or {}).get("stored_order") == "units" and not _WARNED:
            _WARNED.append(data_dir)  # (once: schemas.stored_order says why)
            warnings.warn(
                f"{data_dir}: its records lie in unit (archive) order (shuffle.mode: read), so this read is not "
                "shuffled; to train, read a global order each epoch with schemas.load_dataset(..., epoch=e)",
                UserWarning,
                stacklevel=2,
            )
        return build_dataset(
            SCHEMA,
            data_dir,
            split,
            batch_size,
            shuffle_buffer=shuffle_buffer,
            num_parallel_reads=num_parallel_reads,
            drop_remainder=drop_remainder,
            repeat=repeat,
            seed=seed,
            normalize=normalize,
            normalization=normalization,
            normalized_fill=normalized_fill,
        )
