"""A whole output directory hashes the same across reruns, worker counts and runner modes."""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

import yaml

import pipelines.graph as graph
from pipelines.build import main
from planning.plan import make_plan


def _hashes(directory: Path) -> dict[str, str]:
    files = sorted(p for p in directory.rglob("*") if p.is_file())
    return {str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


def test_the_output_directory_hashes_the_same_however_it_is_run(small_archive, tmp_path, monkeypatch):
    # Many small units, so that blocks reach the statistics in an order the runner chooses.
    monkeypatch.setattr(graph, "make_plan", functools.partial(make_plan, unit_budget_bytes=4e3))
    output = tmp_path / "out"
    config = tmp_path / "c.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "input": {"paths": str(small_archive / "*.nc")},
                "variables": ["t", "q", "z"],
                "sample": {"window": {"lat": 4, "lon": 4}, "keep": ["level"]},
                "splits": {"train": {"time": [None, "2020-01-02T00"]}, "valid": {"time": ["2020-01-02T06", None]}},
                "stats": {"per": ["level"]},
                "output": {"path": str(output), "num_shards": 3},
            }
        )
    )
    runs = {
        "default": [],
        "rerun": [],
        "one thread": ["--direct_num_workers=1"],
        "three threads": ["--direct_running_mode=multi_threading", "--direct_num_workers=3"],
        "in memory": ["--direct_running_mode=in_memory"],
        "two processes": ["--direct_running_mode=multi_processing", "--direct_num_workers=2"],
    }
    hashes = {}
    for name, flags in runs.items():
        assert main(["--config", str(config), "--overwrite", "--quiet", *flags]) == 0, name
        hashes[name] = _hashes(output)
    reference = hashes["default"]
    assert {"schema.json", "stats.json", "parser.py", "_manifest.json", "_inventory.json"} <= reference.keys()
    assert sum(name.startswith(("train-", "valid-")) and name.endswith(".tfrecord") for name in reference) == 6
    assert sum(name.endswith(".tfrecord.tfindex") for name in reference) == 6
    for name, found in hashes.items():
        assert found == reference, name
