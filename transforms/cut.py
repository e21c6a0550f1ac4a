"""CutSamples: read a unit's slab of the virtual dataset and cut it into a block of samples.

A block is an ``xr.Dataset`` with a leading ``sample`` dim: one data variable per feature
variable (already in its record dtype), and per-sample coordinates ``sample_id``,
``index/<dim>`` and ``coord/<dim>`` that place each sample on the source grid.
"""

from __future__ import annotations

import apache_beam as beam
import numpy as np
import xarray as xr
from apache_beam.metrics import Metrics

from schemas.errors import UserError
from transforms.plan import BuildPlan, VariablePlan
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


def _samples_off_gaps(plan: BuildPlan, unit: Unit) -> np.ndarray | None:
    """Which of the unit's samples to keep when some would cross a gap (None: all)."""
    if plan.valid_positions is None:
        return None
    which = [a.dim for a in plan.grid.grid_axes].index(plan.concat_dim)
    positions = plan.grid.unit_positions(unit)[which]
    return plan.valid_positions[positions]


def cut_unit(plan: BuildPlan, unit: Unit) -> xr.Dataset:
    """The block of samples of one unit, in sample-id order."""
    grid = plan.grid
    box = grid.source_box(unit)
    slabs = read_slabs(plan.files, plan.concat_dim, [v.name for v in plan.variables], box)
    keep = _samples_off_gaps(plan, unit)
    allow_overflow = plan.config.output.allow_float32_overflow
    data_vars = {}
    for variable in plan.variables:
        samples = grid.cut(slabs.pop(variable.name), variable.dims, unit)
        if keep is not None:
            samples = samples[keep]
        data_vars[variable.name] = (
            ("sample", *variable.feature.dims),
            to_record_dtype(samples, variable, unit, allow_overflow),
        )
    ids = grid.sample_ids(unit)
    all_positions = grid.unit_positions(unit)
    if keep is not None:
        ids = ids[keep]
        all_positions = [p[keep] for p in all_positions]
    coords: dict[str, tuple] = {"sample_id": ("sample", ids)}
    for axis, positions in zip(grid.grid_axes, all_positions):
        coords[f"index/{axis.dim}"] = ("sample", axis.first_index(positions).astype(np.int64))
        if axis.dim in plan.coords:
            values = plan.coords[axis.dim]
            if axis.role == "iterate":
                coords[f"coord/{axis.dim}"] = ("sample", values[axis.first_index(positions)])
            else:
                coords[f"coord/{axis.dim}"] = (("sample", axis.dim), values[axis.element_indices(positions)])
    return xr.Dataset(data_vars, coords, attrs={"unit": unit.index})


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
        return units | "CutUnit" >> beam.ParDo(_CutUnitFn(self._plan))
