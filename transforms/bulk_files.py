"""Many objects of an output at once: its listing page by page, and deleting named objects in parallel batches.

Not a stage: transforms.files deletes with these what the driver clears (``--overwrite``, a failed
run's files) and a run's working directory. On ``gs://`` a listing is one request per thousand
objects, never held whole, and deletes go as GCS batch requests of 100 (the most one batch takes),
several in flight, never a listing per object as ``FileSystems.delete`` makes.
"""

from __future__ import annotations

import collections
import itertools
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor

from apache_beam.io.filesystems import FileSystems

from planning.run.names import join, relative

#: GCS's most operations in one batch request.
BATCH = 100
#: Batch requests (or local unlinks) in flight at once: GCS serves them in parallel, a parallel filesystem too.
THREADS = 16


def list_remote(base: str) -> Iterator[str]:
    """Every object under ``base`` (a URL), relative to it, a page at a time (none held beyond its page).

    A folder's placeholder (an object named ``folder/``, which the Cloud Console's "Create folder" makes) is
    a folder, as an empty local directory is, not a file: not listed.
    """
    yield from (name for name in _listed(base) if name and not name.endswith("/"))


def _listed(base: str) -> Iterator[str]:
    prefix = base.rstrip("/") + "/"
    gcs = _gcs(base)
    if gcs is None:  # another object store: Beam's own listing
        yield from (relative(base, m.path) for m in FileSystems.match([join(base, "**")])[0].metadata_list)
        return
    bucket, _, key = prefix.removeprefix("gs://").partition("/")
    # Names alone (fields): a page of a thousand is then a few tens of KB.
    pages = gcs.client.list_blobs(
        bucket, prefix=key, fields="items(name),nextPageToken", retry=gcs._storage_client_retry
    )
    for blob in pages:
        yield blob.name[len(key) :]


def delete_objects(base: str, names: Iterable[str], threads: int = THREADS) -> int:
    """Delete these objects (relative to the URL ``base``) in batch requests, several in flight; how many.

    Raises OSError naming the first object that could not be deleted; one already gone is no error.
    """
    gcs = _gcs(base)

    def delete(batch: list[str]) -> None:
        if gcs is None:  # another object store: Beam's own deletes
            FileSystems.delete([join(base, name) for name in batch])
            return
        failed = [(path, code) for path, code in gcs.delete_batch([join(base, n) for n in batch]) if code]
        if failed:
            raise OSError(f"{failed[0][0]}: could not be deleted (HTTP {failed[0][1]})")

    return in_batches(names, BATCH, delete, threads)


def in_batches(names: Iterable[str], size: int, action: Callable[[list[str]], None], threads: int = THREADS) -> int:
    """``action`` on batches of ``size`` names, ``threads`` at once; how many names. Names are taken as batches go
    out, at most a few batches ahead (a streamed listing is never held whole); the first error is raised."""
    count = 0
    names = iter(names)
    with ThreadPoolExecutor(max_workers=threads) as pool:
        pending: collections.deque[Future] = collections.deque()
        while batch := list(itertools.islice(names, size)):
            count += len(batch)
            pending.append(pool.submit(action, batch))
            if len(pending) >= 2 * threads:
                pending.popleft().result()
        for future in pending:
            future.result()
    return count


def remove_prefix(path: str) -> int:
    """Delete every object under the URL ``path`` (a run's working directory), listed page by page; how many."""
    return delete_objects(path, list_remote(path))


def _gcs(url: str):
    """Beam's GCS client for a gs:// URL (with the options FileSystems was given), or None for another store."""
    if not url.startswith("gs://"):
        return None
    filesystem = FileSystems.get_filesystem(url)
    # The same client Beam writes the output with (its credentials, retries, the emulator's endpoint).
    return filesystem._gcsIO()
