"""CutSamples: read a unit's slab of the virtual dataset and cut it into a block of samples.

A block (planning.run.contracts.Block) holds the unit's samples as an ``xr.Dataset`` with a
leading ``sample`` dim, and per split how many samples were cut, dropped or filled for NaN.
"""

from __future__ import annotations

import dataclasses
import functools
import pickle

import apache_beam as beam
import numpy as np
import xarray as xr
from apache_beam.metrics import Metrics

from planning.aux_coords import cut_coordinates
from planning.preprocess import read_derived
from planning.reads.slabs import Slabs, read_selected
from planning.reads.source_index import SourceIndex
from planning.reads.zarr_reads import read_store_box
from planning.run.cancellation import check_stopped
from planning.run.contracts import (
    BYTES_READ,
    METRICS_NAMESPACE,
    SAMPLE_DIM,
    SAMPLE_ID,
    SAMPLES_CUT,
    SAMPLES_DROPPED,
    SPLIT,
    UNITS_DONE,
    Block,
    NonFinite,
    UnitCounts,
)
from planning.run.variables import VariablePlan
from planning.sampling import Unit
from planning.specs import CutSpec
from schemas.errors import UserError
from transforms.units import load_run_file


def to_record_dtype(values: np.ndarray, variable: VariablePlan, unit: Unit, allow_overflow: bool = False) -> np.ndarray:
    """Cast to what the record holds; float values too large for float32 are an error, not inf."""
    if variable.feature.dtype == "int64":
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
        if values.dtype.kind != "f":
            continue
        nan = np.isnan(values)
        if nan.any():
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


def read_unit(spec: CutSpec, sources: SourceIndex, unit: Unit) -> Slabs:
    """Every variable's values over the unit's box of the selected grid (its samples' elements, halos included).

    ``sources``: the files along the concat dim.
    """
    box = spec.positions.grid.source_box(unit)
    concat_dim = spec.positions.concat_dim
    store = spec.zarr_store
    reader = None
    if store is not None:
        reader = functools.partial(read_store_box, store, concat_dim, missing_chunks=spec.zarr_missing_chunks)
    if spec.preprocess is not None:
        where = f"unit {unit.index}"
        slabs = read_derived(spec.preprocess, sources, concat_dim, box, spec.selection, where, reader)
        if spec.coords:  # the coordinates of config `coords` are read as they are, not derived
            slabs.values.update(read_selected(sources, concat_dim, spec.coords, box, spec.selection, reader).values)
        return slabs
    variables = (*spec.variables, *spec.coords)  # the coordinates of config `coords` are read like variables
    return read_selected(sources, concat_dim, variables, box, spec.selection, reader)


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
    coords: dict[str, tuple] = {
        SAMPLE_ID: (SAMPLE_DIM, grid.sample_ids(unit)[chosen]),
        SPLIT: (SAMPLE_DIM, labels),
    }
    for name, (dims, values) in spec.positions.columns([where[chosen] for where in positions]).items():
        coords[name] = ((SAMPLE_DIM, *dims), values)
    coords.update(cut_coordinates(grid, spec.coords, unit, slabs.values, chosen))
    data_vars = {v.name: ((SAMPLE_DIM, *v.feature.dims), data[v.name]) for v in spec.variables}
    return Block(unit.index, xr.Dataset(data_vars, coords), counts, filled)


def cut_unit(spec: CutSpec, sources: SourceIndex, unit: Unit) -> Block:
    """The block of samples of one unit, in sample-id order; ``sources``: the files along the concat dim."""
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


class _CutUnitFn(beam.DoFn):
    def __init__(self, spec: CutSpec):
        self._spec = spec
        self._units = Metrics.counter(METRICS_NAMESPACE, UNITS_DONE)
        self._samples = Metrics.counter(METRICS_NAMESPACE, SAMPLES_CUT)
        self._dropped = Metrics.counter(METRICS_NAMESPACE, SAMPLES_DROPPED)
        self._bytes_read = Metrics.counter(METRICS_NAMESPACE, BYTES_READ)

    def setup(self):
        self._spec = with_run_files(self._spec)
        self._sources = self._spec.sources

    def process(self, unit: Unit):
        check_stopped()  # a stopped build (Ctrl-C, SIGTERM) cuts no further unit
        slabs = read_unit(self._spec, self._sources, unit)
        self._bytes_read.inc(slabs.bytes_read)
        block = cut_slabs(self._spec, unit, slabs)
        self._samples.inc(block.num_samples)
        self._dropped.inc(unit.num_samples - block.num_samples)
        self._units.inc()
        yield block


@dataclasses.dataclass
class CutSamples(beam.PTransform):
    """Units -> blocks of samples (planning.run.contracts.Block)."""

    spec: CutSpec

    def expand(self, units):
        # Our own element type gets our coder; registered when the graph is built, not at import.
        beam.coders.registry.register_coder(Block, BlockCoder)
        return units | "CutUnit" >> beam.ParDo(_CutUnitFn(self.spec)).with_output_types(Block)
