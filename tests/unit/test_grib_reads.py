"""GRIB reads on a worker: the messages a box needs, decoded with ecCodes where planning placed them, give exactly
cfgrib's values (every grid and scanning order, missing points, GRIB 1 and 2) without a cfgrib open; what is not
placed for sure (multi-field messages, an older output's index) is read through cfgrib; an index that lies, or a file
that changed, is refused in one line."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from grib_like import (
    cfgrib_dataset,
    grib_along_step,
    grib_along_time,
    write_ensemble,
    write_multi_field,
    write_polar_stereographic,
    write_reduced_gaussian,
    write_scanned,
)

import planning.reads.grib_reads as grib_reads
from planning.reads.grib_reads import GribReader
from planning.reads.source_index import SourceIndex
from schemas.errors import UserError

pytest.importorskip("cfgrib")

PRESSURE = {"typeOfLevel": "isobaricInhPa"}


@pytest.fixture(autouse=True)
def planned_in_this_process(monkeypatch):
    """Planning here, file by file: a pool of processes plans GRIB files from a few on (tests/e2e test that)."""
    from planning.inputs import grib_inventory

    monkeypatch.setattr(grib_inventory, "POOL_MIN_FILES", 10**9)


def _plan(paths, concat_dim: str = "time", filter_by_keys: dict | None = None):
    from planning.config.loading import load_config
    from planning.plan import make_plan

    data = {
        "input": {"paths": [str(p) for p in paths], "concat_dim": concat_dim},
        "sample": {},
        "output": {"path": "/nonexistent/out"},
    }
    if filter_by_keys is not None:
        data["input"]["grib"] = {"filter_by_keys": filter_by_keys}
    return make_plan(load_config(data=data))


@pytest.fixture
def cfgrib_opens(monkeypatch) -> list[str]:
    """The files a worker opens through cfgrib (each open recorded, then made as before)."""
    opened: list[str] = []
    real = grib_reads.open_grib

    def recording(path, *args, **kwargs):
        opened.append(path)
        return real(path, *args, **kwargs)

    monkeypatch.setattr(grib_reads, "open_grib", recording)
    return opened


def _read(plan, sizes, box_of=None, sources: SourceIndex | None = None) -> dict[str, np.ndarray]:
    """Every variable of the plan over its whole extent (``sizes``, or ``box_of(dims, shape)``), as a worker reads
    it (the index as workers load it, unless ``sources``)."""
    sources = sources or SourceIndex.from_bytes(plan.sources.to_bytes())
    out = {}
    for variable in plan.variables:
        shape = tuple(sizes[d] for d in variable.dims)
        box = box_of(variable.dims, shape) if box_of else {d: (0, n) for d, n in zip(variable.dims, shape)}
        out[variable.name] = GribReader(sources, plan.concat_dim, plan.grib).read([variable], box).values[variable.name]
    return out


def _cases(root: Path) -> dict[str, tuple[list[Path], str, dict]]:
    return {
        "grib2 pressure levels": (grib_along_time(root / "a", 2, days=2), "time", PRESSURE),
        "grib1 along step": (grib_along_step(root / "b", 1, steps=3), "step", {"typeOfLevel": "surface"}),
        "reduced gaussian": (
            [write_reduced_gaussian(root / f"r{d}.grib2", 20200101 + d, d) for d in range(2)],
            "time",
            {},
        ),
        "polar stereographic": (
            [write_polar_stereographic(root / f"p{d}.grib2", 20200101 + d, d) for d in range(2)],
            "time",
            {},
        ),
        "ensemble": ([write_ensemble(root / f"e{d}.grib2", 20200101 + d, seed=d) for d in range(2)], "time", {}),
        **{
            f"grib{edition} {' '.join(scanning) or 'default scanning'}": (
                [write_scanned(root / f"s{edition}{n}_{d}.grib", edition, scanning, 20200101 + d, d) for d in range(2)],
                "time",
                {},
            )
            for edition, scans in (
                (1, [{}]),
                (2, [{}, {"jScansPositively": 1}, {"iScansNegatively": 1}, {"alternativeRowScanning": 1}]),
            )
            for n, scanning in enumerate(scans)
        },
    }


@pytest.fixture(scope="module")
def cases(tmp_path_factory) -> dict:
    return _cases(tmp_path_factory.mktemp("grib"))


CASES = [
    "grib2 pressure levels",
    "grib1 along step",
    "reduced gaussian",
    "polar stereographic",
    "ensemble",
    "grib1 default scanning",
    "grib2 default scanning",
    "grib2 jScansPositively",
    "grib2 iScansNegatively",
    "grib2 alternativeRowScanning",
]


@pytest.mark.parametrize("case", CASES)
def test_every_field_read_by_its_messages_is_cfgrib_s(cases, case, cfgrib_opens):
    paths, concat_dim, keys = cases[case]
    plan = _plan(paths, concat_dim, keys)
    source = cfgrib_dataset(paths, concat_dim, keys)
    values = _read(plan, source.sizes)
    assert values and not cfgrib_opens  # every message decoded by ecCodes alone
    for name, read in values.items():
        expected = source[name].values
        assert read.dtype == expected.dtype == np.float32
        np.testing.assert_array_equal(read, expected)  # NaN where cfgrib has NaN
    if "scanning" in case or "Scans" in case:
        assert np.isnan(values["t"]).any() and not np.isnan(values["t"]).all()


@pytest.mark.parametrize("case", ["grib2 pressure levels", "grib2 alternativeRowScanning", "polar stereographic"])
def test_a_box_within_the_files_is_cfgrib_s_slice(cases, case, cfgrib_opens):
    paths, concat_dim, keys = cases[case]
    plan = _plan(paths, concat_dim, keys)
    source = cfgrib_dataset(paths, concat_dim, keys)

    def inner(dims, shape):  # from the second element to the one before last along each dim (one, if just one)
        return {d: (min(1, n - 1), max(min(1, n - 1) + 1, n - 1)) for d, n in zip(dims, shape)}

    for name, read in _read(plan, source.sizes, inner).items():
        box = inner(source[name].dims, source[name].shape)
        np.testing.assert_array_equal(read, source[name].isel({d: slice(*r) for d, r in box.items()}).values)
    assert not cfgrib_opens


def test_fields_of_a_multi_field_message_are_read_throughcfgrib_dataset(tmp_path, cfgrib_opens):
    """cfgrib numbers the fields of one message; planning does not place them, so workers leave them to cfgrib."""
    paths = [write_multi_field(tmp_path / f"m{d}.grib2", 20200101 + d, d) for d in range(2)]
    plan = _plan(paths)
    assert plan.sources.grib_cells is None and plan.sources.grib_messages(plan.sources[0]) is not None
    source = cfgrib_dataset(paths, "time", {})
    np.testing.assert_array_equal(_read(plan, source.sizes)["t"], source["t"].values)
    assert cfgrib_opens == [str(p) for p in paths]


def test_an_index_without_placements_is_read_throughcfgrib_dataset(cases, cfgrib_opens):
    """An output planned before messages were placed (its sources.npz holds their byte ranges alone)."""
    paths, concat_dim, keys = cases["grib2 pressure levels"]
    plan = _plan(paths, concat_dim, keys)
    older = dataclasses.replace(plan.sources, grib_cells=None, grib_checks=None, grib_layout=())
    source = cfgrib_dataset(paths, concat_dim, keys)
    values = _read(plan, source.sizes, sources=SourceIndex.from_bytes(older.to_bytes()))
    np.testing.assert_array_equal(values["t"], source["t"].values)
    assert len(cfgrib_opens) == len(paths) * len(plan.variables)  # each variable read on its own here


def test_a_saved_placement_that_is_not_sane_is_dropped(cases):
    paths, concat_dim, keys = cases["grib2 pressure levels"]
    plan = _plan(paths, concat_dim, keys)
    for bad in (
        {"grib_cells": plan.sources.grib_cells[:-1]},  # a row short of the messages
        {"grib_cells": np.where(plan.sources.grib_cells == 0, 5, plan.sources.grib_cells)},  # a variable not there
        {"grib_checks": plan.sources.grib_checks[:, None]},
    ):
        loaded = SourceIndex.from_bytes(dataclasses.replace(plan.sources, **bad).to_bytes())
        assert loaded.grib_cells is None and loaded.grib_fields(loaded[0]) is None
        assert loaded.grib_messages(loaded[0]) is not None  # its byte ranges still read, through cfgrib


def _refused(plan, sources: SourceIndex, pattern: str) -> None:
    sizes = {"time": int(sources.stops[-1]), "step": 2, "isobaricInhPa": 2, "latitude": 7, "longitude": 12}
    with pytest.raises(UserError, match=pattern) as raised:
        _read(plan, sizes, sources=sources)
    assert "\n" not in str(raised.value)


def test_an_index_that_points_at_another_message_is_refused(cases):
    """Offsets swapped between two whole messages of the file: each is a GRIB message, but not the one planning
    placed there, so its field would land in the wrong cell."""
    paths, concat_dim, keys = cases["grib2 pressure levels"]
    plan = _plan(paths, concat_dim, keys)
    ranges = plan.sources.grib_ranges.copy()
    ranges[[0, 1]] = ranges[[1, 0]]
    swapped = dataclasses.replace(plan.sources, grib_ranges=ranges)
    _refused(plan, swapped, f"^{paths[0]}: bytes .* are not the GRIB message planning indexed there")


def test_a_placement_that_moves_a_message_to_another_cell_is_refused(cases):
    paths, concat_dim, keys = cases["grib2 pressure levels"]
    plan = _plan(paths, concat_dim, keys)
    cells = plan.sources.grib_cells.copy()
    used = np.flatnonzero(cells[:, 0] >= 0)
    cells[used[0], 1:], cells[used[1], 1:] = cells[used[1], 1:].copy(), cells[used[0], 1:].copy()
    _refused(plan, dataclasses.replace(plan.sources, grib_cells=cells), "are not the GRIB message planning indexed")


def test_a_message_rewritten_in_place_after_planning_is_refused(tmp_path):
    """Same size, and (as a file system that keeps no times would show it) no version to tell: the message's
    bytes no longer match their check."""
    paths = grib_along_time(tmp_path, 2, days=1)
    plan = _plan(paths, "time", PRESSURE)
    offset, length = plan.sources.grib_messages(plan.sources[0])[0]
    data = bytearray(paths[0].read_bytes())
    data[offset + length - 10] ^= 0xFF  # a packed value of the message's data section
    paths[0].write_bytes(bytes(data))
    unversioned = dataclasses.replace(plan.sources, versions=())
    _refused(plan, unversioned, f"^{paths[0]}: bytes {offset} to {offset + length} are not the GRIB message")


def test_a_file_truncated_after_planning_is_refused(tmp_path):
    paths = grib_along_time(tmp_path, 2, days=1)
    plan = _plan(paths, "time", PRESSURE)
    offset, length = plan.sources.grib_messages(plan.sources[1])[-1]  # the file's last message read
    cut = int(offset + length // 2)
    paths[1].write_bytes(paths[1].read_bytes()[:cut])
    _refused(plan, SourceIndex.from_bytes(plan.sources.to_bytes()), f"^{paths[1]}: changed since the build was planned")
    # With no size nor version to tell (an index that says the truncated size): the message cut short is refused.
    sizes = plan.sources.nbytes.copy()
    sizes[1] = cut
    _refused(
        plan,
        dataclasses.replace(plan.sources, nbytes=sizes, versions=()),
        f"^{paths[1]}: bytes {offset} to {cut} are not the GRIB message planning indexed there",
    )
