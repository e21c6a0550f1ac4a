"""CutSamples: read a unit's slab of the virtual dataset and cut it into a block of samples.

A block (planning.run.contracts.Block) holds the unit's samples (planning.run.contracts.Samples), each array with
a leading ``sample`` dim, and per split how many samples were cut, dropped or filled for NaN.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import pickle
import threading
from collections.abc import Iterator

import apache_beam as beam
import numpy as np
from apache_beam.metrics import Metrics

from planning.aux_coords import cut_coordinates
from planning.formats.hdf5_chunks import unit_chunks
from planning.preprocess import read_derived
from planning.reads.slabs import Reader, SelectionReader, Slabs, files_reader
from planning.reads.source_index import SourceIndex
from planning.run.cancellation import check_stopped
from planning.run.contracts import (
    BYTES_READ,
    CHUNK_BYTES,
    CHUNKS_FETCHED,
    METRICS_NAMESPACE,
    SAMPLE_DIM,
    SAMPLE_ID,
    SAMPLES_CUT,
    SAMPLES_DROPPED,
    SPLIT,
    UNITS_DONE,
    Block,
    Column,
    NonFinite,
    Samples,
    UnitCounts,
)
from planning.run.variables import VariablePlan
from planning.sampling import Unit, unit_pieces
from planning.specs import CutSpec
from schemas.errors import UserError
from transforms.units import load_run_file


def to_record_dtype(values: np.ndarray, variable: VariablePlan, unit: Unit, allow_overflow: bool = False) -> np.ndarray:
    """Cast to what the record holds; values the record's type cannot hold are an error, not inf or a wrapped number."""
    if variable.feature.dtype == "int64":
        if values.dtype.kind == "u" and values.size and values.max() > np.iinfo(np.int64).max:
            beyond = values > np.iinfo(np.int64).max
            raise UserError(
                f"variable {variable.name!r}: {int(beyond.sum())} value(s) exceed int64's range (largest "
                f"{int(values.max())}) in unit {unit.index}; tf.Example stores int64: store the variable as "
                "float (e.g. cast it in input.preprocess) or drop it from variables"
            )
        return values.astype(np.int64)
    if values.dtype == np.float32:
        return values
    with np.errstate(over="ignore"):
        cast = values.astype(np.float32)
    if allow_overflow:
        return cast
    overflow = np.isinf(cast) & ~np.isinf(values)
    if overflow.any():
        raise UserError(
            f"variable {variable.name!r}: {int(overflow.sum())} value(s) exceed float32's range "
            f"(largest {np.nanmax(np.abs(values[overflow])):.6g}) in unit {unit.index}; "
            "tf.Example stores float32: rescale the variable (e.g. change its units) before building, "
            "or set output.allow_float32_overflow: true to store them as inf"
        )
    return cast


def _apply_nan_policy(
    spec: CutSpec, data: dict[str, np.ndarray]
) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """Samples to keep, which samples had NaN, and with nan_policy: fill where each variable was filled.

    Filling is in place; the masks (only of variables that had NaN) let statistics leave the
    filled values out and become the nan_mask features.
    """
    n = len(next(iter(data.values())))
    has_nan = np.zeros(n, dtype=bool)
    filled = {}
    policy = spec.nan_policy
    for name, values in data.items():
        # min() propagates NaN: one read of the values, not isnan's array and a second pass over it
        if values.dtype.kind != "f" or values.size == 0 or not np.isnan(values.min()):
            continue
        nan = np.isnan(values)
        has_nan |= nan.reshape(n, -1).any(axis=1)
        if policy == "fill":
            np.putmask(values, nan, spec.fill_value)
            filled[name] = nan
    keep = ~has_nan if policy == "drop" else np.ones(n, dtype=bool)
    return keep, has_nan, filled


def count_nonfinite(data: dict[str, np.ndarray], labels: np.ndarray, splits: int, unit: int) -> list[dict]:
    """Per split index, each float variable's NaN and inf values in the samples (``labels``: their splits)."""
    out: list[dict[str, NonFinite]] = [{} for _ in range(splits)]
    samples = np.bincount(labels, minlength=splits)
    for name, values in data.items():
        if values.dtype.kind != "f":
            continue
        flat = values.reshape(len(values), int(np.prod(values.shape[1:])))
        nan = inf = np.zeros(splits, dtype=np.int64)
        finite = np.isfinite(flat)
        if not finite.all():
            nans = np.isnan(flat).sum(axis=1)
            nan = np.bincount(labels, weights=nans, minlength=splits).astype(np.int64)
            inf = np.bincount(labels, weights=(~finite).sum(axis=1) - nans, minlength=splits).astype(np.int64)
        for i in range(splits):
            if samples[i]:
                seen = unit if nan[i] or inf[i] else None
                out[i][name] = NonFinite(int(samples[i]) * flat.shape[1], int(nan[i]), int(inf[i]), seen)
    return out


def _own(spec: CutSpec, unit: Unit) -> tuple[dict[str, np.ndarray], bool]:
    """Per grid dim, the source indices of the first elements of the unit's samples; and whether the unit is the
    first along the concat dim (zarr_reads: the chunks a unit owns)."""
    grid, own, first = spec.positions.grid, {}, True
    for axis, (start, stop) in zip(grid.grid_axes, unit.ranges):
        taken = spec.selection.indices(axis.dim, 0) if axis.dim in spec.selection.runs else None
        positions = np.arange(start, stop) * axis.stride
        own[axis.dim] = positions if taken is None else taken[positions]
        if axis.dim == spec.positions.concat_dim:
            first = start == 0
    return own, first


def _territory(spec: CutSpec, unit: Unit) -> tuple[dict[str, tuple[float, float]], bool]:
    """Per grid dim, the source indices from the unit's first sample's first element to the next unit's (either end
    open at the grid's ends); and whether the unit is the first along the concat dim (planning.formats.hdf5_chunks:
    the chunks a unit owns)."""
    grid, territory, first = spec.positions.grid, {}, True
    for axis, (start, stop) in zip(grid.grid_axes, unit.ranges):
        taken = spec.selection.indices(axis.dim, 0) if axis.dim in spec.selection.runs else None
        ends = (start, min(stop, axis.count - 1))  # (the last is not read where the unit reaches the grid's end)
        low, high = (p * axis.stride if taken is None else int(taken[p * axis.stride]) for p in ends)
        territory[axis.dim] = (-math.inf if start == 0 else low, math.inf if stop >= axis.count else high)
        if axis.dim == spec.positions.concat_dim:
            first = start == 0
    return territory, first


def unit_reader(spec: CutSpec, sources: SourceIndex, unit: Unit) -> Reader:
    """How the unit's box is read (planning.reads.slabs.Reader): a Zarr store's chunks, each once; or the box of
    the selected grid mapped to pieces of the files (of each member, with input.new_dim)."""
    concat_dim = spec.positions.concat_dim
    if spec.zarr_store is not None:
        from planning.reads.zarr_reads import StoreReader  # here: zarr loads only for a store's build

        own, first = _own(spec, unit)
        return StoreReader(
            spec.zarr_store, concat_dim, spec.zarr_missing_chunks, spec.selection, own, first, spec.zarr_snapshot
        )
    if spec.grib is not None:
        from planning.reads.grib_reads import GribReader  # here: cfgrib loads only for a GRIB build

        return SelectionReader(GribReader(sources, concat_dim, spec.grib), spec.selection)
    return SelectionReader(files_reader(sources, concat_dim), spec.selection)


def read_unit(spec: CutSpec, sources: SourceIndex, unit: Unit) -> Slabs:
    """Every variable's values over the unit's box of the selected grid (its samples' elements, halos included).

    ``sources``: the files along the concat dim.
    """
    box = spec.positions.grid.source_box(unit)
    reader = unit_reader(spec, sources, unit)
    where = f"unit {unit.index}"
    if spec.zarr_store is not None:
        return read_box(spec, sources, box, reader, where)
    # NetCDF-4 chunks: each read once by the unit, and weighed against those it owns.
    with unit_chunks(*_territory(spec, unit), spec.positions.concat_dim) as ledger:
        slabs = read_box(spec, sources, box, reader, where)
    slabs.chunks_fetched, slabs.chunk_bytes = ledger.fetched, ledger.needed
    return slabs


def read_box(spec: CutSpec, sources: SourceIndex, box: dict, reader: Reader, where: str) -> Slabs:
    """Every variable's values over ``box`` of the selected grid, through ``reader`` (or input.preprocess)."""
    if spec.preprocess is not None:  # (never with a store: planning refuses it)
        concat_dim = spec.positions.concat_dim
        slabs = read_derived(spec.preprocess, sources, concat_dim, box, spec.selection, where)
        if spec.coords:  # the coordinates of config `coords` are read as they are, not derived
            slabs.values.update(reader.read(spec.coords, box).values)
        return slabs
    return reader.read((*spec.variables, *spec.coords), box)  # config `coords` are read like variables


def _piece_slabs(spec: CutSpec, unit: Unit, piece: Unit, slabs: Slabs) -> Slabs:
    """The part of the unit's slabs a piece of it reads (views: nothing is copied)."""
    grid = spec.positions.grid
    outer, inner = grid.source_box(unit), grid.source_box(piece)
    values = {}
    for variable in (*spec.variables, *spec.coords):
        where = tuple(slice(inner[d][0] - outer[d][0], inner[d][1] - outer[d][0]) for d in variable.dims)
        values[variable.name] = slabs.values[variable.name][where]
    return Slabs(values)


def cut_pieces(spec: CutSpec, unit: Unit, slabs: Slabs) -> Iterator[Block]:
    """The unit's blocks, a piece at a time (planning.sampling.unit_pieces), so the samples held at once stay
    within the unit budget however many whole chunks the unit read; one block for a unit of one piece."""
    pieces = unit_pieces(unit, spec.pieces)
    if len(pieces) == 1:
        yield cut_slabs(spec, unit, slabs)
        return
    for number, piece in enumerate(pieces):
        block = cut_slabs(spec, piece, _piece_slabs(spec, unit, piece, slabs))
        yield dataclasses.replace(block, piece=number, pieces=len(pieces))


def cut_slabs(spec: CutSpec, unit: Unit, slabs: Slabs) -> Block:
    """The block of samples of one unit, in sample-id order, cut from what ``read_unit`` read (consumed)."""
    grid = spec.positions.grid
    positions = grid.unit_positions(unit)
    labels = spec.positions.split_labels(positions)
    in_split = labels >= 0
    values = slabs.values
    data = {}
    for variable in spec.variables:
        samples = grid.cut(values.pop(variable.name), variable.dims, unit)
        if not in_split.all():
            samples = samples[in_split]
        data[variable.name] = to_record_dtype(samples, variable, unit, spec.allow_float32_overflow)
    labels = labels[in_split]
    splits = len(spec.split_names)
    # What the function returned, as stored, before NaN are dropped or filled: the build reports it.
    nonfinite = count_nonfinite(data, labels, splits, unit.index) if spec.preprocess is not None else [{}] * splits
    keep, has_nan, filled = _apply_nan_policy(spec, data)
    counts = {
        name: UnitCounts(
            cut=int((labels == i).sum()),
            dropped_nan=int(((labels == i) & ~keep).sum()),
            with_nan=int(((labels == i) & has_nan).sum()),
            nonfinite=nonfinite[i],
        )
        for i, name in enumerate(spec.split_names)
    }
    if not keep.all():
        data = {name: values[keep] for name, values in data.items()}
        labels = labels[keep]
    chosen = np.flatnonzero(in_split)[keep]
    coords = {
        SAMPLE_ID: Column((SAMPLE_DIM,), grid.sample_ids(unit)[chosen]),
        SPLIT: Column((SAMPLE_DIM,), labels),
    }
    for name, (dims, values) in spec.positions.columns([where[chosen] for where in positions]).items():
        coords[name] = Column((SAMPLE_DIM, *dims), values)
    for name, (dims, values) in cut_coordinates(grid, spec.coords, unit, slabs.values, chosen).items():
        coords[name] = Column(tuple(dims), values)
    data_vars = {v.name: Column((SAMPLE_DIM, *v.feature.dims), data[v.name]) for v in spec.variables}
    return Block(unit.index, Samples(data_vars, coords), counts, filled)


def cut_unit(spec: CutSpec, sources: SourceIndex, unit: Unit) -> Block:
    """The block of samples of one unit, whole (not in pieces), in sample-id order; ``sources``: the files along
    the concat dim."""
    return cut_slabs(spec, unit, read_unit(spec, sources, unit))


def with_run_files(spec: CutSpec) -> CutSpec:
    """The spec with what it left in the run's files (the input files' index, the positions' arrays) loaded.

    Once per worker process (transforms.units.load_run_file), not per DoFn instance: Beam's
    DaskRunner sets a DoFn up again for every partition.
    """
    changes: dict = {}
    if spec.sources is None and spec.sources_file is not None:
        changes.update(sources=load_run_file(spec.sources_file, SourceIndex.from_bytes), sources_file=None)
    if spec.positions_file is not None:
        changes.update(positions=load_run_file(spec.positions_file, spec.positions.filled), positions_file=None)
    return dataclasses.replace(spec, **changes) if changes else spec


class BlockCoder(beam.coders.Coder):
    """Pickles blocks like Beam's fallback coder, but estimates their size from the arrays.

    Beam samples the size of elements flowing between steps; through the fallback coder that
    means pickling a whole block (tens of MB) just to measure it.
    """

    def encode(self, block: Block) -> bytes:
        return pickle.dumps(block, protocol=pickle.HIGHEST_PROTOCOL)

    def decode(self, data: bytes) -> Block:
        return pickle.loads(data)

    def estimate_size(self, block: Block) -> int:
        return int(block.samples.nbytes) + sum(mask.nbytes for mask in block.filled.values())

    def is_deterministic(self) -> bool:
        return False


def slab_bytes(spec: CutSpec, unit: Unit) -> int:
    """The bytes of the values read for a unit: every variable over its box."""
    box = spec.positions.grid.source_box(unit)
    return sum(
        np.dtype(v.dtype).itemsize * math.prod(box[d][1] - box[d][0] for d in v.dims)
        for v in (*spec.variables, *spec.coords)
    )


class HeldBytes:
    """Bytes a worker process's threads hold at once, bounded: a thread waits while others hold too much
    (one holder always passes, whatever it holds)."""

    def __init__(self, limit: float):
        self.limit = limit
        self._held = 0
        self._changed = threading.Condition()

    @contextlib.contextmanager
    def holding(self, nbytes: int) -> Iterator[None]:
        if not nbytes:
            yield
            return
        with self._changed:
            while self._held and self._held + nbytes > self.limit:
                self._changed.wait(timeout=0.5)
                check_stopped()  # a stopped build does not wait for a turn
            self._held += nbytes
        try:
            yield
        finally:
            with self._changed:
                self._held -= nbytes
                self._changed.notify_all()


#: What units in pieces (a Zarr store's whole chunks over the unit budget) may hold at once in a worker
#: process: an ARCO-ERA5 step of four variables on all 37 levels is 0.6 GB, so one at a time.
HELD_SLABS = HeldBytes(1e9)


class _CutUnitFn(beam.DoFn):
    def __init__(self, spec: CutSpec):
        self._spec = spec
        self._units = Metrics.counter(METRICS_NAMESPACE, UNITS_DONE)
        self._samples = Metrics.counter(METRICS_NAMESPACE, SAMPLES_CUT)
        self._dropped = Metrics.counter(METRICS_NAMESPACE, SAMPLES_DROPPED)
        self._bytes_read = Metrics.counter(METRICS_NAMESPACE, BYTES_READ)
        self._chunk_bytes = Metrics.counter(METRICS_NAMESPACE, CHUNK_BYTES)
        self._chunks_fetched = Metrics.counter(METRICS_NAMESPACE, CHUNKS_FETCHED)

    def setup(self):
        self._spec = with_run_files(self._spec)
        self._sources = self._spec.sources

    @property
    def spec(self) -> CutSpec:
        """The cut's spec; once set up, with the run's files (sources, positions) loaded."""
        return self._spec

    def process(self, unit: Unit):
        check_stopped()  # a stopped build (Ctrl-C, SIGTERM) cuts no further unit
        spec = self._spec
        # A unit in pieces holds whole chunks over the budget until its last piece: such units take turns.
        held = slab_bytes(spec, unit) if len(unit_pieces(unit, spec.pieces)) > 1 else 0
        with HELD_SLABS.holding(held):
            slabs = read_unit(spec, self._sources, unit)
            self._bytes_read.inc(slabs.bytes_read)
            self._chunk_bytes.inc(slabs.chunk_bytes)
            self._chunks_fetched.inc(slabs.chunks_fetched)
            cut = 0
            for block in cut_pieces(spec, unit, slabs):
                cut += block.num_samples
                self._samples.inc(block.num_samples)
                yield block
        self._dropped.inc(unit.num_samples - cut)
        self._units.inc()


@dataclasses.dataclass
class CutSamples(beam.PTransform):
    """Units -> blocks of samples (planning.run.contracts.Block)."""

    spec: CutSpec

    def expand(self, units):
        # Our own element type gets our coder; registered when the graph is built, not at import.
        beam.coders.registry.register_coder(Block, BlockCoder)
        return units | "CutUnit" >> beam.ParDo(_CutUnitFn(self.spec)).with_output_types(Block)
