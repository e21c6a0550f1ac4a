"""What the stages hand each other: the block of samples, per-unit counts, shard results, metric names.

A stage reads these fields and nothing else of another stage's output, so a change to one
stage shows here first.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import xarray as xr

#: The block's leading dim: one entry per sample.
SAMPLE_DIM = "sample"
#: Per-sample coordinates of a block: the sample's id (its row-major position on the grid)
#: and the index of its split.
SAMPLE_ID = "sample_id"
SPLIT = "split"

#: Beam counters and distributions (Metrics.counter(METRICS_NAMESPACE, name)).
METRICS_NAMESPACE = "xarray_tfrecords"
UNITS_DONE = "units_done"
SAMPLES_CUT = "samples_cut"
SAMPLES_DROPPED = "samples_dropped"
#: Bytes fetched from remote input files (local files are read in place and not counted), and from a Zarr store.
BYTES_READ = "bytes_read"
#: A Zarr store's or NetCDF-4 files' chunks: the stored bytes of the chunks units own, and the stored bytes of the
#: chunks fetched (over it: how often a chunk is fetched)
CHUNK_BYTES = "chunk_bytes"
CHUNKS_FETCHED = "chunks_fetched"
BYTES_ENCODED = "bytes_encoded"
RECORDS_WRITTEN = "records_written"
BYTES_WRITTEN = "bytes_written"
SHARD_BYTES = "shard_bytes"


def index_feature(dim: str) -> str:
    """Name of the feature (and block coordinate) holding a sample's start index along ``dim``."""
    return f"index/{dim}"


def coord_feature(dim: str) -> str:
    """Name of the feature (and block coordinate) holding the coordinate values a sample covers."""
    return f"coord/{dim}"


@dataclasses.dataclass(frozen=True)
class NonFinite:
    """A derived variable's (input.preprocess output's) values in the samples cut, before nan_policy."""

    values: int = 0
    nan: int = 0
    inf: int = 0  # +inf and -inf
    first_unit: int | None = None  # the lowest unit with a NaN or inf

    def merge(self, other: NonFinite) -> NonFinite:
        units = [u for u in (self.first_unit, other.first_unit) if u is not None]
        return NonFinite(
            self.values + other.values, self.nan + other.nan, self.inf + other.inf, min(units) if units else None
        )


@dataclasses.dataclass(frozen=True)
class UnitCounts:
    """What one unit did to one split's samples."""

    cut: int = 0  # samples of the split in the unit (before nan_policy: drop)
    dropped_nan: int = 0
    with_nan: int = 0  # samples that held NaN (kept, filled or dropped)
    #: per derived variable (input.preprocess), its NaN and inf values
    nonfinite: dict[str, NonFinite] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Column:
    """One named array of a block's samples: its dims (the leading one ``sample``) and values."""

    dims: tuple[str, ...]
    values: np.ndarray

    @property
    def shape(self) -> tuple[int, ...]:
        return self.values.shape


@dataclasses.dataclass(frozen=True)
class Samples:
    """A block's samples: each variable's and per-sample coordinate's array, with its dims.

    What the stages read of an ``xr.Dataset`` (``data_vars``, ``samples[name].values`` and ``.dims``), without
    its cost: building one for every block took 1.7 ms of Python, held under the GIL the other worker thread
    waits for (``to_dataset`` gives one, to inspect or compare).
    """

    data_vars: dict[str, Column]
    coords: dict[str, Column]

    def __getitem__(self, name: str) -> Column:
        return self.data_vars[name] if name in self.data_vars else self.coords[name]

    @property
    def sizes(self) -> dict[str, int]:
        columns = (*self.coords.values(), *self.data_vars.values())
        return {SAMPLE_DIM: len(columns[0].values)}

    @property
    def nbytes(self) -> int:
        return sum(c.values.nbytes for c in (*self.data_vars.values(), *self.coords.values()))

    def to_dataset(self) -> xr.Dataset:
        def pairs(columns: dict[str, Column]) -> dict:
            return {name: (c.dims, c.values) for name, c in columns.items()}

        return xr.Dataset(pairs(self.data_vars), pairs(self.coords))


@dataclasses.dataclass(frozen=True)
class Block:
    """What CutSamples yields for one unit, or for one piece of it.

    ``samples``: a leading ``sample`` dim, one data variable per selected variable (already in its record
    dtype), and per-sample coordinates ``sample_id``, ``split``, ``index/<dim>`` and ``coord/<dim>`` that place
    each sample on the source grid (and ``coord/<name>`` for each of the config's ``coords``); samples are in
    sample-id order.
    ``counts``: per split name, what the unit cut, dropped and filled.
    ``filled``: with nan_policy: fill, per variable that had NaN in the unit, where its values
    were NaN before the fill (bool, the variable's shape): statistics leave those out, and
    they become the ``mask/<feature>`` features.
    """

    unit: int
    samples: Samples
    counts: dict[str, UnitCounts]
    filled: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
    #: which of the unit's pieces this is, of how many (a unit over the budget yields a block per piece)
    piece: int = 0
    pieces: int = 1

    @property
    def num_samples(self) -> int:
        return self.samples.sizes[SAMPLE_DIM]


@dataclasses.dataclass(frozen=True)
class ShardResult:
    """What a write stage reports for one written shard."""

    split: str
    shard: int  # number within the split
    file: str
    records: int
    bytes: int
    examples: int
    index: str | None = None  # the shard's .tfindex beside it (None: a gzip shard has none)
