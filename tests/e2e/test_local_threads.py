"""A local build left to its defaults runs no more worker threads than it has units (or shard sorts) to run at once."""

from __future__ import annotations

import functools
import hashlib
import os
from pathlib import Path

import pytest
import yaml
from apache_beam.options.pipeline_options import DirectOptions

import pipelines.graph as graph
from pipelines.build import main
from pipelines.runners import MAX_LOCAL_THREADS
from planning.plan import make_plan


@pytest.fixture
def threads_run(monkeypatch):
    """The threads and mode each build's runner was given, as the pipeline held them when it ran."""
    seen: list[tuple[int, str]] = []
    run_and_wait = graph._run_and_wait

    def spy(pipeline, options, local):
        direct = pipeline.options.view_as(DirectOptions)  # what Beam's runner reads when it starts
        seen.append((direct.direct_num_workers, direct.direct_running_mode))
        return run_and_wait(pipeline, options, local)

    monkeypatch.setattr(graph, "_run_and_wait", spy)
    return seen


def _build(tmp_path: Path, paths: str, name: str, *flags: str, in_place: bool = True) -> Path:
    output = tmp_path / name
    config = tmp_path / f"{name}.yaml"
    sample = {"window": {"lat": 4, "lon": 4}, "keep": ["level"]}
    out = {"path": str(output), "num_shards": 3, "in_place": in_place}
    config.write_text(yaml.safe_dump({"input": {"paths": paths}, "sample": sample, "output": out}))
    assert main(["--config", str(config), "--quiet", *flags]) == 0
    return output


def _shards(output: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(output.glob("*.tfrecord"))}


def test_a_build_of_one_unit_runs_one_thread_and_writes_what_two_write(small_archive, tmp_path, threads_run):
    one_file = str(sorted(small_archive.glob("*.nc"))[0])
    fitted = _build(tmp_path, one_file, "fitted")
    chosen = _build(tmp_path, one_file, "chosen", "--direct_num_workers=2", "--direct_running_mode=multi_threading")
    assert threads_run == [(1, "multi_threading"), (2, "multi_threading")]  # the user's choice is kept
    assert _shards(fitted) == _shards(chosen) and len(_shards(fitted)) == 3


def test_units_or_shard_sorts_keep_the_threads_the_machine_has(small_archive, tmp_path, threads_run, monkeypatch):
    cores = min(os.cpu_count() or 1, MAX_LOCAL_THREADS)
    one_file = str(sorted(small_archive.glob("*.nc"))[0])
    _build(tmp_path, one_file, "sorted", in_place=False)  # one unit, but 3 shards sorted from bucket files
    monkeypatch.setattr(graph, "make_plan", functools.partial(make_plan, unit_budget_bytes=4e3))  # dozens of units
    _build(tmp_path, str(small_archive / "*.nc"), "units")
    assert threads_run == [(min(cores, 3), "multi_threading"), (cores, "multi_threading")]
