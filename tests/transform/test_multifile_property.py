"""Property: for any split of the data into files and any units, the samples equal those of one file."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import xarray as xr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planning.config import parse_config
from planning.plan import make_plan
from planning.specs import cut_spec
from transforms.cut import cut_unit


@st.composite
def cases(draw):
    steps = draw(st.integers(2, 14))
    cuts = sorted(draw(st.sets(st.integers(1, steps - 1), max_size=4)))
    sizes = np.diff([0, *cuts, steps]).tolist()
    lat = draw(st.integers(1, 5))
    kind = draw(st.sampled_from(["iterate", "window", "offsets"]))
    sample: dict = {}
    if kind == "window":
        size = draw(st.integers(1, steps))
        sample["window"] = {"time": {"size": size, "stride": draw(st.integers(1, 4))}}
    elif kind == "offsets":
        offsets = draw(st.lists(st.integers(-3, 3), min_size=1, max_size=3, unique=True))
        if max(offsets) - min(offsets) >= steps:
            offsets = [0]
        sample["offsets"] = {"time": offsets}
    if draw(st.booleans()):
        sample["window"] = {**sample.get("window", {}), "lat": {"size": draw(st.integers(1, lat)), "stride": 1}}
    budget = draw(st.integers(1, 600))  # bytes per unit: from one position per unit to all in one
    return sizes, lat, sample, budget


def _write(directory: Path, values: np.ndarray, sizes: list[int]) -> None:
    time = pd.date_range("2001-01-01", periods=values.shape[0], freq="D")
    start = 0
    for i, size in enumerate(sizes):
        part = slice(start, start + size)
        xr.Dataset(
            {"x": (("time", "lat"), values[part])}, coords={"time": time[part], "lat": np.arange(values.shape[1])}
        ).to_netcdf(directory / f"f{len(sizes) - i:02d}.nc")  # names in reverse time order
        start += size


def _samples(directory: Path, sample: dict, budget: float) -> dict[int, np.ndarray]:
    config = parse_config({"input": {"paths": str(directory / "*.nc")}, "sample": sample, "output": {"path": "x"}})
    plan = make_plan(config, unit_budget_bytes=budget)
    out: dict[int, np.ndarray] = {}
    spec = cut_spec(plan)
    for unit in plan.units:
        samples = cut_unit(spec, plan.sources, unit).samples
        for sample_id, values, index in zip(
            samples["sample_id"].values, samples["x"].values, samples["index/time"].values
        ):
            assert sample_id not in out, "a sample was cut twice"
            out[int(sample_id)] = (values, int(index))
    assert len(out) == plan.num_samples
    return out


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases())
def test_split_files_and_units_give_the_samples_of_one_file(case):
    sizes, lat, sample, budget = case
    values = np.arange(sum(sizes) * lat, dtype=np.float32).reshape(sum(sizes), lat)
    with tempfile.TemporaryDirectory() as tmp:
        whole, split = Path(tmp, "whole"), Path(tmp, "split")
        whole.mkdir()
        split.mkdir()
        _write(whole, values, [sum(sizes)])
        _write(split, values, sizes)
        expected = _samples(whole, sample, budget=10**9)
        got = _samples(split, sample, budget=budget)
    assert expected.keys() == got.keys()
    for sample_id, (data, index) in expected.items():
        np.testing.assert_array_equal(got[sample_id][0], data)
        assert got[sample_id][1] == index
