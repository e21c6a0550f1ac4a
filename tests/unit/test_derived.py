"""The slab planning runs input.preprocess on, and where it cuts it to look for edge effects."""

from __future__ import annotations

import planning.derived as derived
from planning.run.variables import VariablePlan
from planning.sampling import Axis, SampleGrid
from schemas.schema import Feature


def plan(name: str, dims: tuple[str, ...]) -> VariablePlan:
    return VariablePlan(name, dims, "float32", Feature(name, "float32", (), (), "variable"))


GRID = SampleGrid((Axis.iterate("time", 100), Axis.keep("level", 10), Axis.window("lat", 50, 4, 1)))
INPUTS = (plan("t", ("time", "level", "lat")),)


def test_the_slab_is_widened_along_the_sample_dims_and_cut_in_its_middle():
    box = derived._probe_box(GRID, INPUTS, "time")
    assert box == {"time": (0, derived.PROBE_STEPS), "level": (0, 10), "lat": (0, derived.PROBE_STEPS)}
    assert derived._parts(GRID.axis("time"), 16) == ((0, 8), (8, 16))
    # Too short to halve: the slab less its last steps, less its first; a dim one sample long is whole everywhere.
    assert derived._parts(GRID.axis("lat"), 6) == ((0, 4), (2, 6))
    assert derived._parts(GRID.axis("lat"), 4) == ()


def test_the_slab_widens_less_beyond_its_byte_budget(monkeypatch):
    # 4 bytes x 10 levels x 5 lat = 200 bytes a step; the concat dim widens first, and not below span + 1.
    monkeypatch.setattr(derived, "PROBE_BYTES", 200 * 8)
    assert derived._probe_box(GRID, INPUTS, "time") == {"time": (0, 8), "level": (0, 10), "lat": (0, 5)}
    monkeypatch.setattr(derived, "PROBE_BYTES", 1)
    assert derived._probe_box(GRID, INPUTS, "time") == {"time": (0, 2), "level": (0, 10), "lat": (0, 5)}
