"""EnumerateUnits: a few hundred ranges of unit numbers in the job graph, made into the units on the workers."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TypeVar

import apache_beam as beam

from planning.run.run_files import RunFile, load_once
from planning.sampling import Unit, Units
from transforms.compat import use_anonymous_credentials_for_emulator
from transforms.files import read_bytes

T = TypeVar("T")

#: Ranges of unit numbers the graph holds on runners that spread the units themselves (after the
#: Reshuffle): enough to start every worker at once, few enough to keep the graph a few KB.
DEFAULT_RANGES = 256


def _read(url: str) -> bytes:
    use_anonymous_credentials_for_emulator()
    return read_bytes(url)


def load_run_file(file: RunFile, decode: Callable[[bytes], T]) -> T:
    """A file of the run (planning.specs.run_files), read and decoded once per worker process."""
    return load_once(file, _read, decode)


def units_of_range(bounds: tuple[int, int], units: Units | RunFile):
    """The units numbered [start, stop), from the plan's units or the run's file of them."""
    if isinstance(units, RunFile):
        units = load_run_file(units, Units.from_bytes)
    yield from units.ranges(*bounds)


@dataclasses.dataclass
class EnumerateUnits(beam.PTransform):
    """Nothing -> every work unit, from ``ranges`` ranges of unit numbers (the units themselves stay out of the graph).

    ``file``: the run's file of the units (planning.specs.run_files), which workers read; without
    it the graph holds ``units`` (small runs, tests). Each range's units come out of one element,
    so on a runner that does not spread them further (Beam's DaskRunner) a range is a task.
    """

    units: Units
    file: RunFile | None = None
    ranges: int = DEFAULT_RANGES

    def expand(self, pbegin):
        return (
            pbegin
            | "Ranges" >> beam.Create(self.units.slices(self.ranges), reshuffle=False)
            # The ranges spread over the workers before they become units: made in one bundle, a range's units
            # would all be made by the worker that holds it (18 us a unit: 15 min for ARCO-ERA5's 49M), before
            # the pipeline's own Reshuffle spreads them. (Beam's DaskRunner drops Reshuffles: a range is a task.)
            | "SpreadRanges" >> beam.Reshuffle()
            | "Units" >> beam.FlatMap(units_of_range, self.file or self.units).with_output_types(Unit)
        )
