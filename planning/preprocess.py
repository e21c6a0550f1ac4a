"""The user's ``input.preprocess`` function: imported by its path, applied to a unit's slab, its outputs checked.

Workers call it on each unit's slab (halos included) as an ``xr.Dataset`` of the input
variables with the coordinates of the box on the selected grid; the variables cut are its
outputs, which must lie on the slab's dims with the slab's sizes. Every failure is one line
naming ``input.preprocess`` and the function.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
from collections.abc import Mapping

import numpy as np
import xarray as xr

from planning.formats.calendars import is_cftime
from planning.reads.selection import Selection
from planning.reads.slabs import Reader, Slabs, read_selected
from planning.reads.source_index import SourceIndex
from planning.run.variables import VariablePlan
from schemas.errors import UserError

Box = dict[str, tuple[int, int]]

#: cftime dates travel to the workers as integers (an object array pickles at ~60 bytes a step).
_CFTIME_UNITS = "microseconds since 1970-01-01"

#: What the function is given and must return, for messages.
CONTRACT = "it gets an xr.Dataset of the input variables over a unit's slab and returns an xr.Dataset"


def _reason(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0][:200]}" if text else type(error).__name__


@functools.cache
def load_function(path: str):
    """The function ``package.module:function`` names (a dotted name after the colon reaches an attribute)."""
    module_name, _, name = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except (Exception, SystemExit, GeneratorExit) as error:  # ImportError, or what the module raises (sys.exit too)
        raise UserError(
            f"input.preprocess: cannot import {module_name!r} for {path} ({_reason(error)}); make the module "
            "importable here and on every worker (docs/guides/derived.md)"
        ) from error
    found = module
    for part in name.split("."):
        found = getattr(found, part, None)
        if found is None:
            raise UserError(f"input.preprocess: module {module_name!r} has no {name!r}; fix the name after the colon")
    if not callable(found):
        raise UserError(f"input.preprocess: {path} is a {type(found).__name__}, not a function; name a function")
    return found


def call(path: str, dataset: xr.Dataset, where: str) -> xr.Dataset:
    """The function applied to ``dataset``; what it raises or a return that is not a Dataset is one line."""
    function = load_function(path)
    try:
        out = function(dataset)
    except UserError:
        raise
    except (Exception, SystemExit, GeneratorExit) as error:  # (a sys.exit in it must not end a build or worker)
        raise UserError(f"input.preprocess: {path} raised {_reason(error)} on {where}; fix the function") from error
    if not isinstance(out, xr.Dataset):
        hint = " (a DataArray: return da.to_dataset(name=...))" if isinstance(out, xr.DataArray) else ""
        raise UserError(
            f"input.preprocess: {path} returned {type(out).__name__}{hint} on {where}; {CONTRACT} "
            "of the derived variables (e.g. ds.assign(speed=...))"
        )
    return out


@dataclasses.dataclass(frozen=True)
class Output:
    """A variable the function returns and the build cuts: its dims in the slab's order, its dtype."""

    name: str
    dims: tuple[str, ...]
    dtype: str


@dataclasses.dataclass(frozen=True)
class _Coordinate:
    values: np.ndarray  # on the selected grid (cftime dates as integers of _CFTIME_UNITS)
    attrs: dict
    calendar: str | None = None  # the cftime calendar of ``values`` stored as integers

    @classmethod
    def of(cls, values: np.ndarray, attrs: dict) -> _Coordinate:
        if not is_cftime(values):
            return cls(values, attrs)
        import cftime

        calendar = values[0].calendar
        return cls(np.asarray(cftime.date2num(values, _CFTIME_UNITS, calendar), dtype=np.int64), attrs, calendar)

    def take(self, start: int, stop: int) -> np.ndarray:
        values = self.values[start:stop]
        if self.calendar is None:
            return values
        import cftime

        return cftime.num2date(values, _CFTIME_UNITS, self.calendar, only_use_cftime_datetimes=True)


@dataclasses.dataclass(frozen=True, eq=False)
class Preprocess:
    """What a worker needs to apply ``input.preprocess``: the function's path, its inputs and the grid's coordinates."""

    path: str  # "package.module:function"
    inputs: tuple[VariablePlan, ...]  # read over the unit's box and given to the function
    dims: tuple[str, ...]  # the slab's dims, in the files' order
    sizes: Mapping[str, int]  # each slab dim's length on the selected grid
    coords: Mapping[str, _Coordinate]  # each slab dim's coordinate, if it has one
    outputs: tuple[Output, ...] = ()  # the function's variables that the build cuts, in `variables:` order

    @classmethod
    def of(
        cls,
        path: str,
        inputs: tuple[VariablePlan, ...],
        sizes: Mapping[str, int],
        coords: Mapping[str, tuple[np.ndarray, dict]],
    ) -> Preprocess:
        return cls(path, inputs, tuple(sizes), dict(sizes), {d: _Coordinate.of(*c) for d, c in coords.items()})

    def full_box(self, box: Box) -> Box:
        """``box`` with the slab's dims the samples lack (reduced by the function) read whole."""
        return {**{d: (0, n) for d, n in self.sizes.items()}, **box}

    def held(self, dims: tuple[str, ...]) -> tuple[tuple[tuple[str, ...], int], ...]:
        """The inputs as planning.sampling.UnitCost counts arrays: dims among ``dims``, bytes per element."""
        out = []
        for variable in self.inputs:
            whole = int(np.prod([self.sizes[d] for d in variable.dims if d not in dims]))
            out.append((tuple(d for d in variable.dims if d in dims), np.dtype(variable.dtype).itemsize * whole))
        return tuple(out)

    def dataset(self, values: Mapping[str, np.ndarray], box: Box) -> xr.Dataset:
        """The slab as the function sees it: the inputs over ``box`` with their attrs and the box's coordinates."""
        data = {v.name: xr.Variable(v.dims, values[v.name], v.feature.source.get("attrs", {})) for v in self.inputs}
        coords = {d: xr.Variable(d, c.take(*box[d]), c.attrs) for d, c in self.coords.items()}
        return xr.Dataset(data, coords)

    def run(self, values: Mapping[str, np.ndarray], box: Box, where: str) -> xr.Dataset:
        return call(self.path, self.dataset(values, box), where)

    def apply(self, values: Mapping[str, np.ndarray], box: Box, where: str) -> dict[str, np.ndarray]:
        """Each output's values over ``box``, in its planned dims, checked against the plan."""
        box = self.full_box(box)
        returned = self.run(values, box, where)
        out = {}
        for output in self.outputs:
            if output.name not in returned.data_vars:
                raise UserError(
                    f"input.preprocess: {self.path} returned no {output.name!r} on {where} (it did at planning); "
                    "return the same variables for every slab"
                )
            variable = returned[output.name].variable
            check_output(self.path, output.name, variable, self.dims, box, where)
            if np.dtype(variable.dtype) != np.dtype(output.dtype):
                raise UserError(
                    f"input.preprocess: {self.path} returned {output.name!r} as {variable.dtype} on {where} but as "
                    f"{output.dtype} at planning; cast it (.astype) so every slab gives one dtype"
                )
            array = np.asarray(variable.transpose(*output.dims).values)
            # Cutting may fill NaN in place (nan_policy: fill): a broadcast or read-only result is copied.
            out[output.name] = array if array.flags.writeable else array.copy()
        return out


def check_output(path: str, name: str, variable: xr.Variable, dims: tuple[str, ...], box: Box, where: str) -> None:
    """Refuse an output off the slab's dims or sizes: its samples could not be cut where the inputs' are."""
    foreign = [d for d in variable.dims if d not in dims]
    if foreign:
        raise UserError(
            f"input.preprocess: {path} returned {name!r} on dims ({', '.join(variable.dims)}) on {where}, but the "
            f"slab has ({', '.join(dims)}); an output may use only the slab's dims"
        )
    for dim, length in variable.sizes.items():
        expected = box[dim][1] - box[dim][0]
        if length != expected:
            raise UserError(
                f"input.preprocess: {path} returned {name!r} with {length} {dim} where its input had {expected} "
                f"(on {where}); an output must keep the slab's sizes (derive pointwise, or along sample.keep dims)"
            )


def read_derived(
    preprocess: Preprocess,
    sources: SourceIndex,
    concat_dim: str,
    box: Box,
    selection: Selection,
    where: str,
    reader: Reader | None = None,
) -> Slabs:
    """The function's outputs over ``box`` (a unit's source box), from its inputs read over the same box.

    ``reader``: how the inputs are read where not from files (a Zarr store).
    """
    box = preprocess.full_box(box)
    slabs = read_selected(sources, concat_dim, preprocess.inputs, box, selection, reader)
    slabs.values = preprocess.apply(slabs.values, box, where)
    return slabs
