"""Spill objects: one a block, its buckets for every shard back to back; the shard writers fetch their byte ranges.

Where the workers share no filesystem, a unit's records reach their shards through the output's
own ``_tmp/<run>/spill/``: one object a block (not one a block and shard), and only a reference
(object, byte range) through the runner's GroupByKey. Each range is a whole bucket blob
(transforms.buckets.blobs), checked like one when it is read: its length, then its magic and
its payload's size.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator

import fsspec

from planning.run.cancellation import writing
from planning.run.names import spill_path
from schemas.errors import UserError
from schemas.urls import is_remote
from transforms.files import write_atomically

#: Ranges one fetch asks for at once (each a request to an object store, answered concurrently).
RANGES_IN_FLIGHT = 32


@dataclasses.dataclass(frozen=True)
class SpilledBucket:
    """One shard's bucket in a spill object: the object's URL and the bucket's [start, stop) bytes in it."""

    url: str
    start: int
    stop: int

    @property
    def nbytes(self) -> int:
        return self.stop - self.start


def spill_buckets(
    directory: str, unit: int, piece: int, buckets: list[tuple[int, list[bytes]]]
) -> list[tuple[int, SpilledBucket]]:
    """Write a block's buckets ([(shard, bucket pieces)]) as one object; (shard, its bucket's reference) each."""
    url = spill_path(directory, unit, piece)
    references, offset = [], 0
    for shard, pieces in buckets:
        size = sum(map(len, pieces))
        references.append((shard, SpilledBucket(url, offset, offset + size)))
        offset += size
    pieces = [piece for _, pieces in buckets for piece in pieces]
    if is_remote(url):
        _upload(url, pieces)
    else:
        write_atomically(url, pieces)
    return references


def _upload(url: str, pieces: list[bytes]) -> None:
    """One object written as one upload: an object store shows it whole or not at all, so it needs no temporary
    name and copy (a write and a rename cost 3 billed operations an object on Cloud Storage; this costs 1 below
    gcsfs's 50 MB chunk: a unit's records are a few MB)."""
    fs, path = fsspec.core.url_to_fs(url)
    with writing():  # an interrupted build waits for this write to end, then removes the run's files
        fs.pipe_file(path, b"".join(pieces))


def fetch_spilled(buckets: Iterable[SpilledBucket], batch_bytes: int) -> Iterator[bytes]:
    """The buckets' bytes, in the order given, fetched concurrently a batch at a time: up to RANGES_IN_FLIGHT
    ranges, and no more than ``batch_bytes`` in a batch unless one bucket is larger alone.

    Raises UserError when an object holds other bytes than the reference says (it was changed or cut
    short after its unit wrote it).
    """
    batch: list[SpilledBucket] = []
    held = 0
    for bucket in buckets:
        if batch and (len(batch) == RANGES_IN_FLIGHT or held + bucket.nbytes > batch_bytes):
            yield from _fetch(batch)
            batch, held = [], 0
        batch.append(bucket)
        held += bucket.nbytes
    if batch:
        yield from _fetch(batch)


def _fetch(batch: list[SpilledBucket]) -> Iterator[bytes]:
    fs, _ = fsspec.core.url_to_fs(batch[0].url)
    paths = [fs._strip_protocol(b.url) for b in batch]
    fetched = fs.cat_ranges(paths, [b.start for b in batch], [b.stop for b in batch], on_error="return")
    for i, bucket in enumerate(batch):
        data, fetched[i] = fetched[i], None  # each bucket's bytes are the caller's alone once handed over
        if isinstance(data, BaseException):
            raise UserError(f"{bucket.url}: the spill object could not be read ({data}); rerun the build") from None
        if len(data) != bucket.nbytes:
            raise UserError(
                f"{bucket.url}: {len(data)} bytes at {bucket.start}, not the {bucket.nbytes} its unit wrote; "
                "the run's working files under _tmp/ were changed: rerun the build"
            )
        yield data
