"""CutSamples: read a unit's slab of the virtual dataset and cut it into a block of samples.

A block is an ``xr.Dataset`` with a leading ``sample`` dim: one data variable per selected
variable (already in its record dtype), and per-sample coordinates ``sample_id``, ``split``,
``index/<dim>`` and ``coord/<dim>`` that place each sample on the source grid. Its attrs hold
the unit's index and, per split, how many samples were cut, dropped or filled for NaN.
"""

from __future__ import annotations

import pickle

import apache_beam as beam
import numpy as np
import xarray as xr
from apache_beam.metrics import Metrics

from schemas.errors import UserError
from transforms.features import VariablePlan
from transforms.plan import BuildPlan
from transforms.positions import position_columns, split_labels
from transforms.sampling import Unit
from transforms.sources import read_slabs

METRICS_NAMESPACE = "xarray_tfrecords"


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


def _apply_nan_policy(plan: BuildPlan, data: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Samples to keep, and which samples had NaN (filled in place with nan_policy: fill)."""
    n = len(next(iter(data.values())))
    has_nan = np.zeros(n, dtype=bool)
    for values in data.values():
        if values.dtype.kind == "f":
            has_nan |= np.isnan(values.reshape(n, -1)).any(axis=1)
    policy = plan.config.nan_policy
    if policy == "fill" and has_nan.any():
        for values in data.values():
            if values.dtype.kind == "f":
                np.nan_to_num(values, copy=False, nan=plan.config.fill_value, posinf=np.inf, neginf=-np.inf)
    keep = ~has_nan if policy == "drop" else np.ones(n, dtype=bool)
    return keep, has_nan


def cut_unit(plan: BuildPlan, unit: Unit) -> xr.Dataset:
    """The block of samples of one unit, in sample-id order."""
    grid = plan.grid
    positions = grid.unit_positions(unit)
    labels = split_labels(plan, positions)
    in_split = labels >= 0
    sources = [(v.name, v.static_path) for v in plan.variables]
    slabs = read_slabs(plan.files, plan.concat_dim, sources, grid.source_box(unit))
    allow_overflow = plan.config.output.allow_float32_overflow
    data = {}
    for variable in plan.variables:
        samples = grid.cut(slabs.pop(variable.name), variable.dims, unit)
        if not in_split.all():
            samples = samples[in_split]
        data[variable.name] = to_record_dtype(samples, variable, unit, allow_overflow)
    keep, has_nan = _apply_nan_policy(plan, data)
    labels = labels[in_split]
    counts = {
        split.name: {
            "cut": int((labels == i).sum()),
            "dropped_nan": int(((labels == i) & ~keep).sum()),
            "with_nan": int(((labels == i) & has_nan).sum()),
        }
        for i, split in enumerate(plan.splits)
    }
    if not keep.all():
        data = {name: values[keep] for name, values in data.items()}
        labels = labels[keep]
    chosen = np.flatnonzero(in_split)[keep]
    coords: dict[str, tuple] = {
        "sample_id": ("sample", grid.sample_ids(unit)[chosen]),
        "split": ("sample", labels),
    }
    for name, (dims, values) in position_columns(plan, [where[chosen] for where in positions]).items():
        coords[name] = (("sample", *dims), values)
    data_vars = {v.name: (("sample", *v.feature.dims), data[v.name]) for v in plan.variables}
    return xr.Dataset(data_vars, coords, attrs={"unit": unit.index, "counts": counts})


class BlockCoder(beam.coders.Coder):
    """Pickles blocks like Beam's fallback coder, but estimates their size from the arrays.

    Beam samples the size of elements flowing between steps; through the fallback coder that
    means pickling a whole block (tens of MB) just to measure it.
    """

    def encode(self, block: xr.Dataset) -> bytes:
        return pickle.dumps(block, protocol=pickle.HIGHEST_PROTOCOL)

    def decode(self, data: bytes) -> xr.Dataset:
        return pickle.loads(data)

    def estimate_size(self, block: xr.Dataset) -> int:
        return int(block.nbytes)

    def is_deterministic(self) -> bool:
        return False


class _CutUnitFn(beam.DoFn):
    def __init__(self, plan: BuildPlan):
        self._plan = plan
        self._units = Metrics.counter(METRICS_NAMESPACE, "units_done")
        self._samples = Metrics.counter(METRICS_NAMESPACE, "samples_cut")
        self._dropped = Metrics.counter(METRICS_NAMESPACE, "samples_dropped")

    def process(self, unit: Unit):
        block = cut_unit(self._plan, unit)
        self._samples.inc(block.sizes["sample"])
        self._dropped.inc(unit.num_samples - block.sizes["sample"])
        self._units.inc()
        yield block


class CutSamples(beam.PTransform):
    """Units -> blocks of samples (``xr.Dataset`` with a leading ``sample`` dim)."""

    def __init__(self, plan: BuildPlan):
        super().__init__()
        self._plan = plan

    def expand(self, units):
        blocks = units | "CutUnit" >> beam.ParDo(_CutUnitFn(self._plan))
        blocks.element_type = xr.Dataset
        return blocks


beam.coders.registry.register_coder(xr.Dataset, BlockCoder)
