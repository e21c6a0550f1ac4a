"""Planning derived variables: what ``input.preprocess`` reads, and what it returns, learnt on a tiny slab.

The function runs at planning on a slab at the start of the selected grid (sample.keep dims
whole, ``PROBE_STEPS`` steps along the others), so the schema knows its outputs' dims and
dtypes before any worker starts. It runs again on that slab's two halves along each sample
dim: a unit's slab ends where the unit does, so an output whose values near the cut change
or turn NaN (a gradient, a running mean) would depend on the unit budget, and is refused.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import xarray as xr

from planning.config.model import BuildConfig
from planning.features import Candidates, build_grid, check_sample_dims, choose_variables, variable_plans
from planning.inputs.inventory import Inventory
from planning.inputs.metadata import VariableInfo
from planning.inputs.metadata import _attrs as json_attrs
from planning.preprocess import Box, Output, Preprocess, check_output, load_function
from planning.reads.slabs import read_selected
from planning.run.variables import VariablePlan
from planning.sampling import Axis, SampleGrid
from planning.selected import SelectedDataset
from schemas.errors import UserError
from schemas.schema import Feature

#: How far an output's values at a slab's edge may move when the slab is cut there, relative to
#: its largest value: vectorised maths may round a value's last bit differently by array length.
EDGE_TOLERANCE = 1e-6

#: Steps along each non-kept sample dim of the slab planning runs the function on (twice a
#: sample's span if that is more; fewer where the dim or PROBE_BYTES has fewer). It is cut in the
#: middle, so a running window or gradient up to about half as long changes values next to the cut.
PROBE_STEPS = 16
#: At most what the function's inputs over that slab may take (sample.keep dims are whole in it):
#: beyond, the slab widens less, down to one sample's span plus one step.
PROBE_BYTES = 64e6

_PLANNING = "a slab at the start of the input at planning"


def preprocess_inputs(config: BuildConfig, inventory: Inventory) -> list[VariableInfo]:
    """``input.preprocess_inputs``, or every numeric variable with all the sample dims."""
    check_sample_dims(config, inventory)  # as for `variables:`, against every variable of the input
    available = inventory.variables
    where = inventory.reference.path
    candidates = Candidates(
        available,
        "input.preprocess_inputs",
        lambda dims: (
            f"{where}: no numeric data variable has all the sample dims ({dims}); "
            "list the function's inputs under input.preprocess_inputs or change the sample dims"
        ),
        lambda _: f"is not a data variable of the input (it has: {', '.join(available)}); fix the name",
        f"in {where}",
        "remove it",
    )
    return choose_variables(config, candidates, config.input.preprocess_inputs, widest=False)


def _returned(preprocess: Preprocess, dataset: xr.Dataset) -> dict[str, VariableInfo]:
    """The function's data variables, dims in the slab's order (foreign dims after, to be refused)."""
    out = {}
    for name, array in dataset.data_vars.items():
        dims = tuple(d for d in preprocess.dims if d in array.dims)
        dims += tuple(d for d in array.dims if d not in dims)
        dtype = str(array.dtype)
        attrs = json_attrs(array.variable)
        for key, value in attrs.items():
            if not _json_ready(value):
                raise UserError(
                    f"input.preprocess {preprocess.path}: output {name!r} has attribute {key!r} of type "
                    f"{type(value).__name__}, which schema.json cannot hold; make it text or numbers in the "
                    "function (e.g. str(value)), or drop it"
                )
        out[str(name)] = VariableInfo(str(name), dims, dtype, dtype, attrs)
    return out


def _json_ready(value) -> bool:
    """Whether an attribute's value is what JSON holds: text, a number, a bool, None, or a list of them."""
    if isinstance(value, (list, tuple)):
        return all(_json_ready(v) for v in value)
    return value is None or isinstance(value, (str, bool, int, float))


def _choose(config: BuildConfig, path: str, returned: dict[str, VariableInfo]) -> list[VariableInfo]:
    """``variables:`` among the function's outputs, or every numeric output with all the sample dims."""
    listing = ", ".join(f"{v.name} ({', '.join(v.dims)})" for v in returned.values()) or "nothing"
    candidates = Candidates(
        returned,
        "variables",
        lambda dims: (
            f"input.preprocess: {path} returns no numeric variable with all the sample dims ({dims}); "
            f"it returns {listing}: return one, or name outputs under `variables:`"
        ),
        lambda name: (
            f"is not among what input.preprocess {path} returns ({listing}); "
            f"return it (e.g. ds.assign({name}=...)) or remove it from `variables:`"
        ),
        f"as input.preprocess {path} returns it",
        "cast it in the function or remove it",
        listed_as=f" (returned by {path})",
    )
    return choose_variables(config, candidates, config.variables)


def _check_dims(
    preprocess: Preprocess,
    grid: SampleGrid,
    inputs: list[VariableInfo],
    chosen: list[VariableInfo],
    returned: xr.Dataset,
    box: Box,
) -> None:
    """Outputs on the slab's dims and sizes, lacking no sample dim every input has (a reduction along it)."""
    path = preprocess.path
    shared = [a.dim for a in grid.axes if a.role != "keep" and all(a.dim in v.dims for v in inputs)]
    for variable in chosen:
        check_output(path, variable.name, returned[variable.name].variable, preprocess.dims, box, _PLANNING)
        lacking = [d for d in shared if d not in variable.dims]
        if lacking:
            raise UserError(
                f"input.preprocess: {path} returned {variable.name!r} without the dim {lacking[0]!r} its inputs have; "
                f"a unit's slab holds only part of {lacking[0]}, so reduce along sample.keep dims only"
            )


def _differs(whole: np.ndarray, part: np.ndarray) -> bool:
    whole, part = whole.astype(np.float64), part.astype(np.float64)
    if whole.shape != part.shape or not np.array_equal(np.isnan(whole), np.isnan(part)):
        return True
    # The largest finite value: an inf would make any two values close.
    scale = float(np.abs(whole[np.isfinite(whole)]).max(initial=0.0))
    return not np.allclose(whole, part, rtol=EDGE_TOLERANCE, atol=EDGE_TOLERANCE * scale, equal_nan=True)


def _along(dims: tuple[str, ...], dim: str, start: int, stop: int) -> tuple[slice, ...]:
    return tuple(slice(start, stop) if d == dim else slice(None) for d in dims)


def _probe_box(grid: SampleGrid, inputs: tuple[VariablePlan, ...], concat_dim: str) -> Box:
    """The slab planning runs the function on: at the start of the grid, sample.keep dims whole (see PROBE_STEPS)."""
    lengths = {a.dim: a.length if a.role == "keep" else min(a.length, a.span + 1) for a in grid.axes}

    def nbytes() -> int:
        return sum(np.dtype(v.dtype).itemsize * math.prod(lengths[d] for d in v.dims) for v in inputs)

    # The concat dim first: units end along it most.
    for axis in sorted(grid.grid_axes, key=lambda a: a.dim != concat_dim):
        least = lengths[axis.dim]
        lengths[axis.dim] = max(least, min(axis.length, max(PROBE_STEPS, 2 * axis.span)))
        while lengths[axis.dim] > least and nbytes() > PROBE_BYTES:
            lengths[axis.dim] -= 1
    return {d: (0, n) for d, n in lengths.items()}


def _parts(axis: Axis, length: int) -> tuple[tuple[int, int], ...]:
    """Where along ``axis`` to cut a planning slab ``length`` long, as [start, stop) parts that each hold a sample."""
    if length >= 2 * axis.span:
        return (0, length // 2), (length // 2, length)  # halves: the cut lies inside the whole slab
    if length > axis.span:
        return (0, axis.span), (length - axis.span, length)  # the slab less its last steps, less its first
    return ()  # every unit holds this dim whole


def _check_edges(preprocess: Preprocess, grid: SampleGrid, values: dict[str, np.ndarray], box: Box) -> None:
    """Refuse outputs whose values change (NaN included) where the slab is cut in parts (see the module)."""
    whole = preprocess.apply({k: v.copy() for k, v in values.items()}, box, _PLANNING)
    for axis in grid.axes:
        low, high = box[axis.dim]
        if axis.role == "keep":
            continue
        parts = _parts(axis, high - low)
        split = " and ".join(f"{b - a}" for a, b in parts)
        for start, stop in parts:
            part = {v.name: values[v.name][_along(v.dims, axis.dim, start, stop)].copy() for v in preprocess.inputs}
            where = f"{_PLANNING}, cut to {stop - start} {axis.dim}"
            cut = preprocess.apply(part, {**box, axis.dim: (low + start, low + stop)}, where)
            for output in preprocess.outputs:
                if _differs(whole[output.name][_along(output.dims, axis.dim, start, stop)], cut[output.name]):
                    raise UserError(
                        f"input.preprocess: {preprocess.path} gives {output.name!r} values that depend on where a "
                        f"slab ends along {axis.dim!r} (they changed or turned NaN when a slab of {high - low} "
                        f"{axis.dim} was cut into {split}); units end anywhere along it, so the function must be "
                        f"pointwise along {axis.dim}: no running window, gradient or mean along it (only sample.keep "
                        "dims are whole in every slab)"
                    )


def plan_preprocess(
    config: BuildConfig, inventory: Inventory, dataset: SelectedDataset, inputs: list[VariableInfo]
) -> tuple[Preprocess, list[VariableInfo]]:
    """What workers need to apply the function, and the outputs the build cuts (as variables to plan)."""
    path = config.input.preprocess
    load_function(path)
    grid = build_grid(config, inputs, dataset.sizes)
    plans = tuple(variable_plans(grid, inputs, inventory))
    sizes = {a.dim: a.length for a in grid.axes}
    coords = {d: found for d in sizes if (found := dataset.coordinate(d)) is not None}
    preprocess = Preprocess.of(path, plans, sizes, coords)
    box = _probe_box(grid, plans, inventory.concat_dim)
    sources = dataset.source_index()
    values = read_selected(sources, inventory.concat_dim, plans, box, dataset.selection).values
    returned = preprocess.run({k: v.copy() for k, v in values.items()}, box, _PLANNING)
    found = _returned(preprocess, returned)
    chosen = _choose(config, path, found)
    _check_dims(preprocess, grid, inputs, chosen, returned, box)
    outputs = tuple(Output(v.name, v.dims, v.dtype) for v in chosen)
    preprocess = dataclasses.replace(preprocess, outputs=outputs)
    _check_edges(preprocess, grid, values, box)
    return preprocess, chosen


def derived_plans(grid: SampleGrid, chosen: list[VariableInfo], preprocess: Preprocess) -> list[VariablePlan]:
    """The outputs as variables to cut (computed on the slab, so read from no file), with their provenance."""
    inputs = [v.name for v in preprocess.inputs]
    plans = []
    for var in chosen:
        shape, dims = grid.feature_shape(var.dims)
        dtype = "float32" if np.dtype(var.dtype).kind == "f" else "int64"
        source = {"variable": var.name, "dtype": var.dtype, "preprocess": preprocess.path, "inputs": inputs}
        source["attrs"] = var.attrs
        source["dims"] = list(var.dims)
        if dtype == "float32" and np.dtype(var.dtype).itemsize > 4:
            source["stored_as"] = "float32 (tf.Example holds no float64)"
        feature = Feature(var.name, dtype, shape, dims, "variable", source)
        plans.append(VariablePlan(var.name, var.dims, var.dtype, feature))
    return plans
