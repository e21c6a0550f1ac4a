"""GRIB planning in a pool of forked processes: the plan of the files planned one after another, and a corrupt file
among many refused in one line naming it, the pool ended."""

from __future__ import annotations

import multiprocessing as mp
import os
from pathlib import Path

import pytest
from grib_like import grib_along_time

from planning.inputs import grib_inventory

from helpers import refused

pytest.importorskip("cfgrib")
pytestmark = pytest.mark.skipif("fork" not in mp.get_all_start_methods(), reason="pools fork")

PRESSURE = {"typeOfLevel": "isobaricInhPa"}


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> list[Path]:
    """Twelve files along time (00 and 12 UTC of six days)."""
    return grib_along_time(tmp_path_factory.mktemp("grib-pool"), edition=2, days=6)


def _config(paths, output: Path) -> dict:
    return {
        "input": {"paths": [str(p) for p in paths], "concat_dim": "time", "grib": {"filter_by_keys": PRESSURE}},
        "variables": ["t", "z"],
        "sample": {"window": {"latitude": 3, "longitude": 4}, "keep": ["step", "isobaricInhPa"]},
        "output": {"path": str(output), "num_shards": 2},
    }


_PLAN_FILE = grib_inventory._plan_file
#: Where each call of _recording writes the id of the process it runs in.
_RECORD: list[Path] = []


def _recording(*args):
    """grib_inventory._plan_file, writing its process's id down (a module's function: a pool pickles it by name)."""
    with open(_RECORD[0], "a") as out:
        out.write(f"{os.getpid()}\n")
    return _PLAN_FILE(*args)


def _planned_in(monkeypatch, tmp_path: Path, pool: bool) -> Path:
    """Plans from here on pooled or not (whatever the cores); returns the file the processes that plan a file
    write their ids to (a forked process inherits the recording)."""
    monkeypatch.setattr(grib_inventory, "POOL_MIN_FILES", 2 if pool else 10**9)
    monkeypatch.setattr(grib_inventory, "pool_processes", lambda: 2)
    monkeypatch.setattr(grib_inventory, "_plan_file", _recording)
    record = tmp_path / f"pids-{pool}"
    _RECORD[:] = [record]
    return record


def _make_plan(paths, output: Path):
    from planning.config.loading import load_config
    from planning.plan import make_plan

    return make_plan(load_config(data=_config(paths, output)))


def test_a_pool_plans_what_the_launcher_plans_alone(files, monkeypatch, tmp_path):
    """Sources index (files in order, their messages' ranges, cells and checks) and schema: byte for byte."""
    serial_record = _planned_in(monkeypatch, tmp_path, pool=False)
    serial = _make_plan(files, tmp_path / "out")
    pooled_record = _planned_in(monkeypatch, tmp_path, pool=True)
    pooled = _make_plan(files, tmp_path / "out")
    assert set(serial_record.read_text().split()) == {str(os.getpid())}
    pids = pooled_record.read_text().split()
    assert len(pids) == len(files) and str(os.getpid()) not in pids  # every file planned in a pool process
    assert pooled.sources.to_bytes() == serial.sources.to_bytes()
    assert [s.path for s in pooled.sources] == [str(p) for p in files]
    assert pooled.schema.to_json() == serial.schema.to_json()


def test_a_corrupt_file_among_many_is_refused_in_one_line_naming_it_and_the_pool_ends(
    files, monkeypatch, tmp_path, capsys
):
    """Two broken files among twelve: the first in order is named (as planning them one by one names it), no pool
    process outlives the refusal."""
    record = _planned_in(monkeypatch, tmp_path, pool=True)
    monkeypatch.setattr(grib_inventory, "pool_processes", lambda: 2)
    copies = []
    for index, path in enumerate(files):
        copy = tmp_path / "in" / path.name
        copy.parent.mkdir(exist_ok=True)
        # a message whose sections are zeros: ecCodes finds no GRIB edition in it
        copy.write_bytes(b"GRIB" + b"\0" * 64 if index in (3, 7) else path.read_bytes())
        copies.append(copy)
    before = set(mp.active_children())  # (another module's Dask workers may share this test process)
    line = refused(_config(copies, tmp_path / "out"), tmp_path, capsys)
    assert line.startswith(f"error: {copies[3]}: cannot be read as GRIB (") and str(copies[7]) not in line
    assert line.endswith("fix or remove the file, or narrow input.paths")
    assert set(mp.active_children()) <= before  # none of the pool's processes is left
    assert str(os.getpid()) not in record.read_text().split()  # planned in the pool, not after it broke
