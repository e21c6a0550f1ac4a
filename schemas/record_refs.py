"""A split's records by reference (shard, byte offset, framed size, slot): keys from their tails, values by feature.

    records = ReferencedRecords(output, schema, split)
    for batch in records.index_batches(shard_number): ...  # {index/<dim>: keys, ref/*: where each sample is}
    for keys in records.checked(refs, bucket_names, ["index/time"]): ...  # each record read whole once, checked
    values = records.values("t", 0, 128)                   # the first 128 samples' t: its bytes alone

A scan reads only the tail of each record (its int64 entries follow the float entries, whose sizes the
schema fixes), so finding where every sample goes costs a few bytes a record, not the record. The
references come back from disk (bucket files): before any value is used, every record referenced is
read whole, its CRCs checked, and its keys compared with the reference's; then a feature is read as its
own bytes, straight into its array. Local, uncompressed outputs only (a remote one's references would
be a request per record and feature: reassembly copies those samples instead).
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Iterator, Mapping, Sequence

import numpy as np

from schemas.errors import UserError
from schemas.record_decoder import ExampleDecoder
from schemas.schema import RECORD_COUNT, Schema
from schemas.shard_index import ShardIndex, load_index
from schemas.tfrecord import HEADER_BYTES, CorruptRecordError, read_frame_at
from schemas.urls import check_regular_file

#: The arrays a reference is made of (beside the sample's index/<dim> keys).
REF_SHARD, REF_OFFSET, REF_SIZE, REF_SLOT = "ref/shard", "ref/offset", "ref/size", "ref/slot"
REF_NAMES = (REF_SHARD, REF_OFFSET, REF_SIZE, REF_SLOT)
#: Which bucket file a reference came from (the error names it).
REF_BUCKET = "ref/bucket"
_FIX = "the work folder or the output changed during the run: run the reassembly again"
#: Records read whole at once while checking references (only their int64 payloads are kept).
CHECK_RECORDS = 256


class ReferencedRecords:
    """The records of one split of a local, uncompressed output, read at their offsets (os.pread)."""

    def __init__(self, path: str, schema: Schema, split: str):
        self.path, self.schema, self.split = path, schema, split
        self.shards = schema.splits[split]
        self.per = schema.examples_per_record
        self.decoder = ExampleDecoder(schema.record_features())
        self.features = {f.name: f for f in schema.features}
        self._floats = self.decoder.float_names
        self._files: dict[int, int] = {}
        self._sizes: dict[int, int] = {}
        # Set by ``checked``: the samples referenced, in reading order, and where each float feature starts.
        self.refs: dict[str, np.ndarray] = {}
        self._starts = np.zeros((0, len(self._floats)), dtype=np.int64)
        self._record_of = np.zeros(0, dtype=np.int64)

    def url(self, number: int) -> str:
        return posixpath.join(self.path, self.shards[number].file)

    # ---- the scan: where each sample is, from the records' tails -------------------------------------------

    def index_batches(self, number: int, records: int = 256) -> Iterator[dict[str, np.ndarray]]:
        """One shard's samples, ``records`` records at a time: their index/<dim> keys and references."""
        url = self.url(number)
        index = self._index(number)
        fd = self._fd(number)
        keys = [f.name for f in self.schema.features if f.role == "index"]
        for begin in range(0, len(index), records):
            offsets = index.offsets[begin : begin + records]
            sizes = index.sizes[begin : begin + records]
            rows = []
            for k, (offset, size) in enumerate(zip(offsets.tolist(), sizes.tolist())):
                length = size - HEADER_BYTES - 4
                start = self.decoder.tail_start(length)
                payloads = None
                if 0 <= start <= length:
                    payloads = self.decoder.tail_payloads(os.pread(fd, length - start, offset + HEADER_BYTES + start))
                if payloads is None:  # another layout, or damaged: the whole record, its CRCs checked
                    record = read_frame_at(fd, offset, size, url, begin + k)  # (its errors name the record)
                    try:
                        payloads = self.decoder.locate(record)[1]
                    except ValueError as error:
                        raise CorruptRecordError(f"{url}: record {begin + k}: {error}; rebuild the output") from None
                rows.append(payloads)
            if not rows:
                continue
            try:
                batch = self.decoder.decode_ints(rows)
            except ValueError as error:
                raise CorruptRecordError(f"{url}: records {begin} to {begin + len(rows)}: {error}") from None
            if self.per > 1:
                counts = batch[RECORD_COUNT]
                if np.any((counts < 1) | (counts > self.per)):
                    raise CorruptRecordError(f"{url}: a record says it holds {int(counts.min())} samples")
                real = np.arange(self.per) < counts[:, None]
            else:
                real = np.ones((len(offsets), 1), dtype=bool)
            record, slot = np.nonzero(real)
            out = {name: batch[name].reshape(len(offsets), -1)[real] for name in keys}
            out[REF_SHARD] = np.full(len(record), number, dtype=np.int64)
            out[REF_OFFSET] = offsets[record]
            out[REF_SIZE] = sizes[record]
            out[REF_SLOT] = slot.astype(np.int64)
            yield out

    def _index(self, number: int) -> ShardIndex:
        shard = self.shards[number]
        read_at = lambda at, size: os.pread(self._fd(number), size, at)  # noqa: E731
        return load_index(self.url(number), shard.records, shard.bytes, read_at)

    def _fd(self, number: int) -> int:
        fd = self._files.get(number)
        if fd is None:
            check_regular_file(self.url(number))  # a FIFO would block the open for ever
            try:
                fd = os.open(self.url(number), os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                raise UserError(f"{self.url(number)}: shard listed in schema.json is missing") from None
            self._files[number] = fd
            self._sizes[number] = os.fstat(fd).st_size
        return fd

    # ---- a chunk's samples: references checked, then features read alone -----------------------------------

    def checked(
        self, refs: Mapping[str, np.ndarray], where: Sequence[str], keys: Sequence[str]
    ) -> Iterator[dict[str, np.ndarray]]:
        """Take the samples ``refs`` name (REF_NAMES, ``keys`` and ``ref/bucket``: which of ``where`` each came
        from), sorted by where they are; read every record once, whole, and check it is one (both CRCs) with the
        keys the reference says. Yields the samples' keys in batches of CHECK_RECORDS records' samples."""
        order = np.lexsort((refs[REF_SLOT], refs[REF_OFFSET], refs[REF_SHARD]))
        self.refs = {name: np.asarray(values)[order] for name, values in refs.items()}
        shard, offset = self.refs[REF_SHARD], self.refs[REF_OFFSET]
        new = np.ones(len(offset), dtype=bool)
        new[1:] = (shard[1:] != shard[:-1]) | (offset[1:] != offset[:-1])
        self._record_of = np.cumsum(new) - 1
        firsts = np.flatnonzero(new)
        self._check_bounds(where)
        self._starts = np.zeros((len(firsts), len(self._floats)), dtype=np.int64)
        numbers, offsets, sizes = (self.refs[n].tolist() for n in (REF_SHARD, REF_OFFSET, REF_SIZE))
        for begin in range(0, len(firsts), CHECK_RECORDS):
            records = firsts[begin : begin + CHECK_RECORDS]
            stop = firsts[begin + CHECK_RECORDS] if begin + CHECK_RECORDS < len(firsts) else len(offset)
            payloads, starts = [], []
            for row in records.tolist():
                number, at = numbers[row], offsets[row]
                url = self.url(number)
                try:
                    floats, ints = self.decoder.locate(read_frame_at(self._files[number], at, sizes[row], url, at))
                except ValueError as error:
                    bucket = where[int(self.refs[REF_BUCKET][row])]
                    raise UserError(f"{bucket}: no whole record of {url} at byte {at} ({error}); {_FIX}") from None
                payloads.append(ints)
                starts.append(floats)
            if self._floats:
                at = self.refs[REF_OFFSET][records] + HEADER_BYTES
                self._starts[begin : begin + len(records)] = np.asarray(starts, dtype=np.int64) + at[:, None]
            try:
                ints = self.decoder.decode_ints(payloads)
            except ValueError as error:
                bucket = where[int(self.refs[REF_BUCKET][records[0]])]
                raise UserError(f"{bucket}: records referenced hold no keys ({error}); {_FIX}") from None
            rows = slice(records[0], stop)
            record = self._record_of[rows] - begin
            slot = self.refs[REF_SLOT][rows]
            if self.per > 1:
                count = ints[RECORD_COUNT][record]
                bad = np.flatnonzero((slot < 0) | (slot >= count))
                if len(bad):
                    self._refuse(records[0] + int(bad[0]), where, f"holds {int(count[bad[0]])} samples, not that one")
            else:
                bad = np.flatnonzero(slot != 0)
                if len(bad):
                    self._refuse(records[0] + int(bad[0]), where, "holds one sample, not that one")
            for name in keys:
                held = ints[name].reshape(len(records), -1)[record, slot if self.per > 1 else 0]
                bad = np.flatnonzero(held != self.refs[name][rows])
                if len(bad):
                    row = records[0] + int(bad[0])
                    self._refuse(row, where, f"holds {name} = {int(held[bad[0]])}, not {int(self.refs[name][row])}")
            yield {name: self.refs[name][rows] for name in keys}

    def _check_bounds(self, where: Sequence[str]) -> None:
        """UserError unless every reference lies inside a shard of the split (naming the bucket it came from)."""
        number, offset, size = (self.refs[n] for n in (REF_SHARD, REF_OFFSET, REF_SIZE))
        bad = np.flatnonzero((number < 0) | (number >= len(self.shards)))
        if len(bad):
            bucket = where[int(self.refs[REF_BUCKET][bad[0]])]
            raise UserError(f"{bucket}: a reference to shard {int(number[bad[0]])} of {len(self.shards)}; {_FIX}")
        for each in np.unique(number).tolist():
            self._fd(each)
        shard_bytes = np.zeros(len(self.shards), dtype=np.int64)
        shard_bytes[list(self._sizes)] = list(self._sizes.values())
        bad = np.flatnonzero((offset < 0) | (size < HEADER_BYTES + 4) | (offset + size > shard_bytes[number]))
        if len(bad):
            row = int(bad[0])
            bucket = where[int(self.refs[REF_BUCKET][row])]
            url, at, end = self.url(int(number[row])), int(offset[row]), int(offset[row] + size[row])
            raise UserError(
                f"{bucket}: a reference to bytes {at} to {end} of {url}, which holds "
                f"{int(shard_bytes[number[row]])}; {_FIX}"
            )

    def _refuse(self, row: int, where: Sequence[str], what: str) -> None:
        bucket = where[int(self.refs[REF_BUCKET][row])]
        number, offset, slot = (int(self.refs[n][row]) for n in (REF_SHARD, REF_OFFSET, REF_SLOT))
        raise UserError(f"{bucket}: the record of {self.url(number)} at byte {offset} (sample {slot}) {what}; {_FIX}")

    def feature(self, name: str, begin: int, stop: int, out: np.ndarray | None = None) -> np.ndarray:
        """A float feature of the samples ``begin:stop`` (in ``checked``'s order), read as its own bytes (into
        ``out``'s first rows, if given)."""
        feature = self.features[name]
        column = self._floats.index(name)
        n = stop - begin
        out = np.empty((n, *feature.shape), dtype=np.float32) if out is None else out[:n]
        nbytes = 4 * feature.size
        flat = out.reshape(n, nbytes // 4).view(np.uint8)
        records = self._record_of[begin:stop]
        at = (self._starts[records, column] + self.refs[REF_SLOT][begin:stop] * nbytes).tolist()
        shards = self.refs[REF_SHARD][begin:stop].tolist()
        files = self._files
        for i, (number, offset) in enumerate(zip(shards, at)):  # (each range checked to lie in its record)
            if os.preadv(files[number], [flat[i]], offset) != nbytes:
                raise UserError(f"{self.url(number)}: cut short at byte {offset}; the output changed during the run")
        return out

    def values(self, name: str, begin: int, stop: int, out: np.ndarray | None = None) -> np.ndarray:
        """Any feature of the samples ``begin:stop``: a float one as its own bytes (into ``out``, if given), else
        from the whole records."""
        if name in self._floats:
            return self.feature(name, begin, stop, out)
        feature = self.features[name]
        out = np.empty((stop - begin, *feature.shape), dtype=feature.dtype)
        for i in range(begin, stop):
            number, offset, size = (int(self.refs[n][i]) for n in (REF_SHARD, REF_OFFSET, REF_SIZE))
            record = read_frame_at(self._files[number], offset, size, self.url(number), offset)
            held = self.decoder.decode_ints([self.decoder.locate(record)[1]])[name][0]
            out[i - begin] = held[int(self.refs[REF_SLOT][i])] if self.per > 1 else held
        return out

    def close(self) -> None:
        for fd in self._files.values():
            os.close(fd)
        self._files.clear()

    def __enter__(self) -> ReferencedRecords:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
