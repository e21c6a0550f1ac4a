"""Property: for any split of the data into files and any unit budget, the samples equal those of one file.

With or without a selection (a time range, a list of lon values read as pieces).

Budgets go down to below one step of the concat dim, where units split along the other dims too.
"""

from __future__ import annotations

import tempfile
import uuid
from pathlib import Path

import fsspec
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
    lon = draw(st.integers(1, 4))
    # A selection: a time range (some files left out) and lon values (runs read as pieces).
    select: dict = {}
    taken_steps, taken_lon = steps, lon  # as selected
    if draw(st.booleans()):
        first = draw(st.integers(0, steps - 1))
        last = draw(st.integers(first, steps - 1))
        select["time"] = {"min": f"2001-01-{first + 1:02d}", "max": f"2001-01-{last + 1:02d}"}
        taken_steps = last - first + 1
    if draw(st.booleans()):
        select["lon"] = sorted(draw(st.sets(st.integers(0, lon - 1), min_size=1)))
        taken_lon = len(select["lon"])
    kind = draw(st.sampled_from(["iterate", "window", "offsets"]))
    sample: dict = {}
    if kind == "window":
        size = draw(st.integers(1, taken_steps))
        sample["window"] = {"time": {"size": size, "stride": draw(st.integers(1, 4))}}
    elif kind == "offsets":
        others = draw(st.lists(st.integers(-3, 3).filter(bool), max_size=2, unique=True))
        offsets = draw(st.permutations([0, *others]))
        if max(offsets) - min(offsets) >= taken_steps:
            offsets = [0]
        sample["offsets"] = {"time": offsets}
    if draw(st.booleans()):
        sample["window"] = {**sample.get("window", {}), "lat": {"size": draw(st.integers(1, lat)), "stride": 1}}
    if draw(st.booleans()):
        size = draw(st.integers(1, taken_lon))
        sample["window"] = {**sample.get("window", {}), "lon": {"size": size, "stride": draw(st.integers(1, 2))}}
    budget = draw(st.integers(1, 3000))  # bytes per unit: from one position per unit to all in one
    # Where the split files are: local (read in place), or behind an fsspec URL (read by ranges),
    # classic with time as a record dim or fixed, or NetCDF-4.
    storage = draw(st.sampled_from(["local", "NETCDF3_CLASSIC records", "NETCDF3_64BIT", "NETCDF4"]))
    return sizes, (lat, lon), {"sample": sample, "select": select}, budget, storage


def _write(directory: Path, values: np.ndarray, sizes: list[int], storage: str = "local") -> None:
    time = pd.date_range("2001-01-01", periods=values.shape[0], freq="D")
    lat, lon = np.arange(values.shape[1]), np.arange(values.shape[2])
    start = 0
    for i, size in enumerate(sizes):
        part = slice(start, start + size)
        xr.Dataset(
            {"x": (("time", "lat", "lon"), values[part])}, coords={"time": time[part], "lat": lat, "lon": lon}
        ).to_netcdf(
            directory / f"f{len(sizes) - i:02d}.nc",  # names in reverse time order
            format=None if storage == "local" else storage.split()[0],
            unlimited_dims=["time"] if storage.endswith("records") else None,
        )
        start += size


def _samples(directory: str, sample: dict, budget: float) -> dict[int, np.ndarray]:
    config = parse_config({"input": {"paths": f"{directory}/*.nc"}, **sample, "output": {"path": "x"}})
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


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(case=cases())
def test_split_files_and_units_give_the_samples_of_one_file(case):
    sizes, (lat, lon), sample, budget, storage = case
    values = np.arange(sum(sizes) * lat * lon, dtype=np.float32).reshape(sum(sizes), lat, lon)
    memory = fsspec.filesystem("memory")
    remote = f"memory://split-{uuid.uuid4().hex}"
    with tempfile.TemporaryDirectory() as tmp:
        whole, split = Path(tmp, "whole"), Path(tmp, "split")
        whole.mkdir()
        split.mkdir()
        _write(whole, values, [sum(sizes)])
        _write(split, values, sizes, storage)
        expected = _samples(str(whole), sample, budget=10**9)
        if storage != "local":
            memory.put(f"{split}/*.nc", remote)
        try:
            got = _samples(str(split) if storage == "local" else remote, sample, budget=budget)
        finally:
            if storage != "local":
                memory.rm(remote, recursive=True)
    assert expected.keys() == got.keys()
    for sample_id, (data, index) in expected.items():
        np.testing.assert_array_equal(got[sample_id][0], data)
        assert got[sample_id][1] == index
