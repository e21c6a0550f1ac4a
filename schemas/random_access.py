"""A split read by position: ``len(source)``, ``source[i]``, ``source.__getitems__(indices)`` (Grain, PyTorch).

    from schemas import open_source
    source = open_source("out/patches", "train")   # local path or gs:// URL
    sample = source[123]                            # {name: array}, the 124th sample in file order
    batch = source.__getitems__([5, 17, 3])         # one read per run of records in a shard

File order is shard order, record order, then the slot inside a packed record: ``source[i]``
is the i-th sample ``schemas.Reader`` yields. Offsets come from each shard's ``.tfindex``
(checked against the shard first); both CRCs of every record read are checked.
"""

from __future__ import annotations

import bisect
import contextlib
import operator
import os
import posixpath
from collections.abc import Sequence

import fsspec
import numpy as np

from schemas.errors import UserError
from schemas.metadata import load_schema
from schemas.record_decoder import ExampleDecoder
from schemas.schema import RECORD_COUNT, Schema, Shard
from schemas.shard_index import ShardIndex, index_name, load_index
from schemas.shards import shard_counts
from schemas.tfrecord import CorruptRecordError, check_frame
from schemas.urls import check_regular_file, is_remote

Sample = dict[str, np.ndarray]


class RandomAccessSource:
    """The samples of one split, by position; pickles small (each process opens the shards itself).

    ``source[i]`` is the i-th sample ``Reader`` yields; both CRCs of every record read are checked, and each index
    is checked against its shard before an offset in it is used.

    Args:
        path: the output's folder, a local path or an fsspec URL.
        split: the split to read.
        schema: the output's schema, if already loaded.

    Raises:
        UserError: a split the output does not hold (or with no data yet), gzip shards (no index), or a damaged
            index or record when read.
    """

    def __init__(self, path: str, split: str = "data", *, schema: Schema | None = None):
        self.path = str(path).rstrip("/") or "/"
        self.schema = schema if schema is not None else load_schema(self.path)
        if split not in self.schema.splits:
            splits = ", ".join(self.schema.splits) or "none"
            raise UserError(f"{self.path}: no split {split!r}; it has: {splits}; choose one of those")
        self.schema.check_has_samples(split, self.path)
        if self.schema.compression:
            raise UserError(
                f"{self.path}: its shards are {self.schema.compression}-compressed, which cannot be read at an "
                "offset; build it with output.compression: none for random access, or read it with schemas.Reader"
            )
        self.split = split
        self.shards: Sequence[Shard] = self.schema.splits[split]
        self._per = self.schema.examples_per_record
        # Every shard's counts as arrays (millions of shards: no Shard object each).
        records, examples = shard_counts(self.shards, "records"), shard_counts(self.shards, "examples")
        wrong = np.flatnonzero(records != -(-examples // self._per))
        if len(wrong):
            shard = self.shards[int(wrong[0])]
            raise CorruptRecordError(
                f"{self._url(shard)}: {shard.records} records cannot hold {shard.examples} samples "
                f"{self._per} to a record; schema.json is damaged: rebuild the output"
            )
        self._starts = np.concatenate([[0], np.cumsum(examples, dtype=np.int64)])
        self._start_list = self._starts.tolist()
        self._record_starts = np.concatenate([[0], np.cumsum(records, dtype=np.int64)])
        self._decoder = ExampleDecoder(self.schema.record_features())
        self._names = [f.name for f in self.schema.features]
        self._indexes: dict[int, ShardIndex] = {}
        self._files: dict[int, int] = {}
        self._remote = is_remote(self.path)
        if not self._remote:
            self._check_sizes()
        self._fs = None

    def __len__(self) -> int:
        return int(self._starts[-1])

    def __getitem__(self, index: int) -> Sample:
        number, record, slot = self._locate(operator.index(index))
        block = self._decoded(number, np.array([record]), [self._read_one(number, record)])
        return {name: block[name][0, slot] if self._per > 1 else block[name][0] for name in self._names}

    def __getitems__(self, indices: Sequence[int]) -> list[Sample]:
        """The samples at ``indices`` (any order, repeats allowed), reading each run of records in a shard once."""
        parts, rows, slots = self._gather(indices)
        blocks = [self._decoded(number, records, self._read(number, records)) for number, records in parts]
        block = blocks[0] if len(blocks) == 1 else {n: np.concatenate([b[n] for b in blocks]) for n in self._names}
        if self._per > 1:
            return [{n: block[n][r, s] for n in self._names} for r, s in zip(rows.tolist(), slots.tolist())]
        return [{n: block[n][r] for n in self._names} for r in rows.tolist()]

    def records(self, indices: Sequence[int]) -> list[bytes]:
        """The serialized ``tf.train.Example`` of each sample at ``indices``, CRC-checked (for tf.data, or a copy).

        Only where a record is one sample (output.examples_per_record: 1).
        """
        if self._per > 1:
            raise UserError(
                f"{self.path}: records hold {self._per} samples each; read samples (source[i]) instead of records"
            )
        if len(indices) == 1:
            number, record, _ = self._locate(operator.index(indices[0]))
            return [self._read_one(number, record)]
        parts, rows, _ = self._gather(indices)
        data = [record for number, records in parts for record in self._read(number, records)]
        return [data[r] for r in rows.tolist()]

    def _locate(self, index: int) -> tuple[int, int, int]:
        """(shard, record in it, slot in the record) of one sample."""
        n = len(self)
        at = index + n if index < 0 else index
        if not 0 <= at < n:
            raise IndexError(f"sample {index} is outside the split's {n} samples")
        number = bisect.bisect_right(self._start_list, at) - 1
        record, slot = divmod(at - self._start_list[number], self._per)
        return number, record, slot

    def _gather(self, indices: Sequence[int]) -> tuple[list[tuple[int, np.ndarray]], np.ndarray, np.ndarray]:
        """The records to read (per shard, sorted, each once); each sample's row among them, and its slot."""
        wanted = np.asarray(indices, dtype=np.int64).reshape(-1)
        n = len(self)
        wanted = np.where(wanted < 0, wanted + n, wanted)
        if len(wanted) and (wanted.min() < 0 or wanted.max() >= n):
            bad = int(np.asarray(indices).reshape(-1)[(wanted < 0) | (wanted >= n)][0])
            raise IndexError(f"sample {bad} is outside the split's {n} samples")
        shard_of = np.searchsorted(self._starts, wanted, side="right") - 1
        within = wanted - self._starts[shard_of]
        # Records numbered across the split: sorted, they are in shard order, then record order.
        unique, rows = np.unique(self._record_starts[shard_of] + within // self._per, return_inverse=True)
        unique_shard = np.searchsorted(self._record_starts, unique, side="right") - 1
        parts = []
        for group in np.split(np.arange(len(unique)), np.flatnonzero(np.diff(unique_shard)) + 1):
            if len(group):
                number = int(unique_shard[group[0]])
                parts.append((number, unique[group] - self._record_starts[number]))
        return parts, rows.reshape(-1), within % self._per

    # Reading

    def _check_sizes(self) -> None:
        """Each local shard's size as schema.json says (one stat a shard): a shard cut short would serve the samples
        before the cut and fail at the first after it, mid-epoch; one written to since holds records no index lists.
        """
        for shard in self.shards:
            url = self._url(shard)
            check_regular_file(url)  # (a FIFO in its place: named as one, not as a shard of 0 bytes)
            try:
                size = os.stat(url).st_size
            except FileNotFoundError:
                raise UserError(f"{url}: missing, but schema.json lists it; build the output again") from None
            if size != shard.bytes:
                raise UserError(
                    f"{url}: {size} bytes on disk, schema.json says {shard.bytes} (the shard was cut short, emptied or "
                    "written to since); build the output again"
                )

    def _url(self, shard: Shard) -> str:
        return posixpath.join(self.path, shard.file)

    def _filesystem(self):
        if self._fs is None:
            self._fs = fsspec.core.url_to_fs(self.path)[0]
        return self._fs

    def _read_local(self, number: int, offsets: list[int], sizes: list[int]) -> list[bytes]:
        fd = self._files.get(number)
        if fd is None:
            check_regular_file(self._url(self.shards[number]))  # a FIFO would block the open for ever
            try:
                fd = os.open(self._url(self.shards[number]), os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                raise UserError(f"{self._url(self.shards[number])}: shard listed in schema.json is missing") from None
            self._files[number] = fd
        return [os.pread(fd, size, offset) for offset, size in zip(offsets, sizes)]

    def _read_ranges(self, number: int, offsets: list[int], sizes: list[int]) -> list[bytes]:
        """Bytes at (offset, size) ranges of one shard: one request a range, concurrently where remote."""
        if not self._remote:
            return self._read_local(number, offsets, sizes)
        url = self._url(self.shards[number])
        ends = [offset + size for offset, size in zip(offsets, sizes)]
        return self._filesystem().cat_ranges([url] * len(offsets), offsets, ends)

    def _index(self, number: int) -> ShardIndex:
        index = self._indexes.get(number)
        if index is not None:
            return index
        shard = self.shards[number]
        url = self._url(shard)
        read_at = None if self._remote else lambda offset, size: self._read_local(number, [offset], [size])[0]
        try:
            index = load_index(url, shard.records, shard.bytes, read_at)
        except FileNotFoundError:  # (a remote shard's: a local one's is scanned)
            raise UserError(
                f"{index_name(url)} is missing: random access needs each shard's index; build the output "
                "again (every build writes them), or read it in order with schemas.Reader"
            ) from None
        self._indexes[number] = index
        return index

    def _read_one(self, number: int, record: int) -> bytes:
        index = self._index(number)
        offset, size = int(index.offsets[record]), int(index.sizes[record])
        (chunk,) = self._read_ranges(number, [offset], [size])
        return check_frame(memoryview(chunk), self._url(self.shards[number]), record)

    def _read(self, number: int, records: np.ndarray) -> list[bytes]:
        """Records (sorted, unique) of one shard, CRC-checked; a run of neighbours (neighbouring bytes) read at once."""
        index = self._index(number)
        url = self._url(self.shards[number])
        offsets, sizes = index.offsets[records], index.sizes[records]
        first = np.ones(len(records), dtype=bool)
        np.not_equal(np.diff(records), 1, out=first[1:])
        starts = np.flatnonzero(first)
        stops = np.append(starts[1:], len(records))
        run_sizes = offsets[stops - 1] + sizes[stops - 1] - offsets[starts]
        chunks = self._read_ranges(number, offsets[starts].tolist(), run_sizes.tolist())
        data, sizes, numbers = [], sizes.tolist(), records.tolist()
        for chunk, start, stop in zip(chunks, starts.tolist(), stops.tolist()):
            view, at = memoryview(chunk), 0
            for k in range(start, stop):
                data.append(check_frame(view[at : at + sizes[k]], url, numbers[k]))
                at += sizes[k]
        return data

    def _decoded(self, number: int, records: np.ndarray, data: list[bytes]) -> dict[str, np.ndarray]:
        """Records of one shard decoded (packed ones checked to hold a possible number of samples)."""
        url = self._url(self.shards[number])
        try:
            block = self._decoder.decode_batch(data)
        except ValueError as error:
            raise CorruptRecordError(f"{url}: records {records.tolist()[:5]}...: {error}") from None
        if self._per > 1:
            counts = block.pop(RECORD_COUNT)
            if np.any((counts < 1) | (counts > self._per)):
                raise CorruptRecordError(
                    f"{url}: a record says it holds {int(counts.min())} samples; rebuild the output"
                )
        return block

    # Lifecycle

    def close(self) -> None:
        for fd in self._files.values():
            os.close(fd)
        self._files.clear()

    def __enter__(self) -> RandomAccessSource:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        with contextlib.suppress(Exception):  # at interpreter exit the os module may be gone
            self.close()

    def __getstate__(self) -> dict:
        # Open files and loaded indexes stay in this process: a worker opens its own, on first use.
        return {"path": self.path, "split": self.split, "schema": self.schema}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["path"], state["split"], schema=state["schema"])


def open_source(path: str, split: str = "data") -> RandomAccessSource:
    """The samples of a split by position (a map-style dataset for Grain and PyTorch).

    Args:
        path: the output's folder, a local path or an fsspec URL.
        split: the split to read.

    Returns:
        A ``RandomAccessSource``: ``len(source)``, ``source[i]``, ``source.__getitems__([i, j, ...])``.
    """
    return RandomAccessSource(path, split)
