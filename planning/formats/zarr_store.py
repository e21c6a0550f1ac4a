"""A Zarr store as input: recognising one in input.paths, opening it (local or any fsspec URL), and its errors."""

from __future__ import annotations

import contextvars
import os
import re
import threading
import warnings
from collections.abc import Mapping

import numcodecs
import numcodecs.errors
import xarray as xr
import zarr.errors
from fsspec.implementations.reference import ReferenceNotReachable
from zarr.storage import FsspecStore, LocalStore, WrapperStore

from planning.formats.sources import NETCDF_LOCK
from planning.formats.store_sources import missing_target, open_icechunk, open_reference_store, target_of
from planning.formats.zarr_paths import MARKERS, is_icechunk, is_reference
from schemas.errors import UserError
from schemas.urls import is_remote

#: Keys that hold metadata, not chunks: a missing one is xarray looking for another Zarr version.
_METADATA_KEYS = {*MARKERS, ".zarray", ".zattrs"}

#: The package that reads a codec (by its id, without Zarr v3's "numcodecs." prefix), where numcodecs
#: itself is not it: numcodecs registers these ids but imports their package to use them.
_CODEC_PACKAGES = {"zfpy": "zfpy", "pcodec": "pcodec"}


#: Where a read wants what the store returns noted, as (key, byte range, bytes): a context variable, as zarr
#: fetches on its own event loop's thread, in tasks that copy the reading thread's context.
FETCHED: contextvars.ContextVar[list[tuple[str, str, int]] | None] = contextvars.ContextVar("FETCHED", default=None)


class RecordingStore(WrapperStore):
    """A store that remembers the chunk keys it found missing (zarr reads them as fill values, silently)
    and notes the keys it returned, with their sizes, in FETCHED where a read sets it."""

    #: an Icechunk repository's: the snapshot the store reads
    snapshot: str | None = None

    def __init__(self, store):
        super().__init__(store)
        self.missing: set[str] = set()
        self._lock = threading.Lock()

    def _with_store(self, store):
        return type(self)(store)

    def _note(self, key: str, buffer, byte_range=None) -> None:
        with self._lock:
            if buffer is None:
                if key.rsplit("/", 1)[-1] not in _METADATA_KEYS:
                    self.missing.add(key)
            else:
                fetched = FETCHED.get()
                if fetched is not None:  # (a sharded store's chunks are byte ranges of its shards' keys)
                    fetched.append((key, repr(byte_range), len(buffer)))

    async def get(self, key, prototype, byte_range=None):
        buffer = await self._store.get(key, prototype, byte_range)
        self._note(key, buffer, byte_range)
        return buffer

    async def get_partial_values(self, prototype, key_ranges):
        key_ranges = list(key_ranges)
        buffers = await self._store.get_partial_values(prototype, key_ranges)
        for (key, byte_range), buffer in zip(key_ranges, buffers):
            self._note(key, buffer, byte_range)
        return buffers

    def missing_chunk(self, variable: str) -> str | None:
        """A missing chunk key of ``variable`` seen so far, if any."""
        with self._lock:
            return min((k for k in self.missing if k.startswith(f"{variable}/")), default=None)

    def forget_missing(self) -> None:
        """Drop the missing keys seen so far (where they read as fill values by choice: they would only pile up)."""
        with self._lock:
            self.missing.clear()


class ReferenceStore(RecordingStore):
    """A kerchunk reference file's store: a chunk whose referenced file is not there is an error naming that file,
    never a missing chunk (which input.missing_chunks: fill would read as fill values)."""

    def __init__(self, store, url: str, fs):
        super().__init__(store)
        self.url, self.fs = url, fs

    def _with_store(self, store):
        return type(self)(store, self.url, self.fs)

    def _note(self, key: str, buffer, byte_range=None) -> None:
        target = target_of(self.fs, key) if buffer is None else None
        if target is not None:
            raise missing_target(self.url, key, target)
        super()._note(key, buffer, byte_range)

    async def get(self, key, prototype, byte_range=None):
        try:
            return await super().get(key, prototype, byte_range)
        except ReferenceNotReachable as error:  # fsspec's word for a referenced file that could not be read
            raise missing_target(self.url, error.reference, error.target) from None

    async def get_partial_values(self, prototype, key_ranges):
        try:
            return await super().get_partial_values(prototype, key_ranges)
        except ReferenceNotReachable as error:
            raise missing_target(self.url, error.reference, error.target) from None


def open_store(url: str, version: Mapping[str, str] | None = None) -> RecordingStore:
    """The store at a local path or fsspec URL, read-only; a kerchunk reference file's as a store of byte ranges;
    an Icechunk repository's at ``version`` (config input.icechunk; default: branch main)."""
    if version is not None or is_icechunk(url):
        store, snapshot = open_icechunk(url, version or {"branch": "main"})
        recording = RecordingStore(store)
        recording.snapshot = snapshot
        return recording
    if is_reference(url):
        store, fs = open_reference_store(url)
        return ReferenceStore(store, url, fs)
    if is_remote(url):
        return RecordingStore(FsspecStore.from_url(url, read_only=True))
    if not os.path.isdir(url):
        raise UserError(f"{url}: no such Zarr store (not found); check input.paths")
    return RecordingStore(LocalStore(url, read_only=True))


def _codec_package(codec: str) -> str:
    """How to install what reads a codec id (``imagecodecs_jpeg2k``, ``numcodecs.zfpy``, ``zfpy``, ...)."""
    bare = codec.removeprefix("numcodecs.")
    if bare in _CODEC_PACKAGES:
        return f"install {_CODEC_PACKAGES[bare]} (pip install {_CODEC_PACKAGES[bare]})"
    if bare.startswith("imagecodecs_"):
        return "install imagecodecs (pip install imagecodecs)"
    if codec.startswith("numcodecs."):
        return "install a numcodecs that has it (pip install -U numcodecs)"
    return "install the package that registers it with numcodecs or zarr (imagecodecs, hdf5plugin, ...)"


def codec_error(url: str, error: Exception, codec: str | None = None) -> UserError:
    """An unreadable codec, named with the package that would read it; ``codec``: its name, if known."""
    if codec is None:
        # zarr: "Unknown codec: 'x'"; numcodecs: "codec not available: ''x''" (quoted twice).
        found = re.search(r"'+([^']+)'+", str(error))
        codec = found.group(1) if found else str(error)
    return UserError(f"{url}: codec {codec!r} is not available; {_codec_package(codec)}")


def check_codecs(url: str, ds: xr.Dataset) -> None:
    """Refuse a Zarr v3 variable whose numcodecs codec cannot be loaded here: zarr opens the store without it,
    and only a chunk's decoding would fail, on a worker."""
    for var in ds.variables.values():
        encoding = var.encoding
        for codec in (
            encoding.get("serializer"),
            *(encoding.get("compressors") or ()),
            *(encoding.get("filters") or ()),
        ):
            config = getattr(codec, "codec_config", None)
            if not isinstance(config, dict):
                continue
            try:
                numcodecs.get_codec(dict(config))
            except numcodecs.errors.UnknownCodecError as error:
                raise codec_error(url, error, getattr(codec, "codec_name", None)) from None


def open_store_dataset(url: str, store: RecordingStore, decode_times: bool = True, indexes: bool = True) -> xr.Dataset:
    """The store as a lazy dataset (metadata only: with consolidated metadata, one request), decoded as xarray
    decodes it; ``indexes``: load the dim coordinates into indexes (planning wants them, workers do not)."""
    try:
        # Under the lock every warnings filter of ours is set under (filters are process-wide).
        with NETCDF_LOCK, warnings.catch_warnings():
            # zarr warns that consolidated metadata is not in the v3 spec; xarray about NaN fills on integers.
            warnings.simplefilter("ignore")
            return xr.open_zarr(
                store,
                consolidated=None,
                chunks=None,
                decode_times=decode_times,
                create_default_indexes=indexes,
            )
    except (zarr.errors.UnknownCodecError, numcodecs.errors.UnknownCodecError) as error:
        raise codec_error(url, error) from None
    except UserError:
        raise
    except (zarr.errors.NodeNotFoundError, FileNotFoundError):
        raise UserError(f"{url}: not a Zarr store (no {', '.join(MARKERS)} at its root); check input.paths") from None
    except Exception as error:
        reason = str(error).splitlines()[0][:200] if str(error) else type(error).__name__
        raise UserError(f"{url}: cannot be read as a Zarr store ({reason}); check input.paths") from None
