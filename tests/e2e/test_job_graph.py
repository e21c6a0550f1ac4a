"""The job graph a build submits stays the same few KB however many work units the plan holds."""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/ is not an installed package
from benchmarks.job_graph import patches_config, write_metadata_store
from pipelines import graph
from pipelines.build import graph_line
from planning.config import load_config


def _dry_run(tmp_path, steps: int):
    store = write_metadata_store(tmp_path / f"store{steps}.zarr", steps)
    path = tmp_path / f"config{steps}.yaml"
    config = patches_config(store, tmp_path / f"out{steps}")
    config["stats"] = {"tendency": True, "over": "field"}  # (their own units, and the tendency's pairs, grow too)
    path.write_text(yaml.safe_dump(config))
    return graph.run_build(load_config(str(path)), ["--dry_run=True"])[0]


def test_a_month_and_a_million_units_submit_the_same_small_graph(tmp_path):
    """ARCO-ERA5 at full resolution, all levels, 32x32 patches, 128 x 128 chunks: 72 units a step; 744 steps,
    then 16,000 (python -m benchmarks.job_graph measures up to 30M).

    Before, every unit travelled in the graph (twice): 13.7 MB for 4.24M units; the statistics' own units and
    pairs (stats.tendency, stats.over: field) grew it by 2.5 bytes a step.
    """
    month = _dry_run(tmp_path, 744)
    years = _dry_run(tmp_path, 16_000)
    assert len(years.units) / 16_000 == len(month.units) / 744 and len(years.units) > 1_000_000
    assert years.job_graph_bytes < 200_000
    assert abs(years.job_graph_bytes - month.job_graph_bytes) < 0.1 * month.job_graph_bytes
    assert graph_line(years) == f"  job graph: {years.job_graph_bytes / 1e6:.2f} MB (Dataflow's limit: 10 MB)"
