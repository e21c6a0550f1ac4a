"""The cost benchmark (``benchmarks.cost``) builds three sizes on the PortableRunner to gs://, counts what the runner
shuffled and what the storage emulator answered, prices the ERA5 plan term by term and evaluates the targets;
benchmarks.run runs it only when asked. Its operation counting and fits, on hand-written request logs."""

from __future__ import annotations

import json

import pytest

from conftest import REPO
from helpers import run_benchmark

ROWS = [
    "== cost: PortableRunner (LOOPBACK) builds to gs:// (storage emulator), spill objects ==",
    "2 files",
    "8 files",
    "shuffle bytes, references    references",
    "ARCO-ERA5 1940-2024 plan (a 24-step dry run, scaled):",
    "USD, ERA5 1940-2024",
    "Dataflow Shuffle",
    "class A operations",
    "no shuffle (shuffle.mode: read): each shard written whole from its run of units, to gs://",
    "fitted, no shuffle",
    "target cost: shuffle bytes / output bytes, ERA5 plan:",
    "target cost: intermediate objects / (units + shards), ERA5 plan:",
    "target cost: intermediate bytes / output bytes:",
    "target cost: objects left under _tmp/ after the commit: 0 (limit 0) PASS",
    "target cost: ERA5 1940-2024 bill, spill objects:",
    "target cost: shuffle bytes / output bytes, no shuffle, ERA5 plan:",
    "target cost: ERA5 1940-2024 bill, no shuffle:",
]


@pytest.fixture
def cost(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO))  # benchmarks/ is not an installed package
    from benchmarks import cost

    return cost


def test_quick_cost_benchmark_measures_the_spill_path_and_the_no_shuffle_mode_and_prices_the_plan(tmp_path):
    result_file = tmp_path / "cost.json"
    printed = run_benchmark("benchmarks.cost", "--quick", "--workdir", str(tmp_path), "--json", str(result_file))
    for row in ROWS:
        assert row in printed, f"no row {row!r} in:\n{printed}"
    results = json.loads(result_file.read_text())
    assert results["failed"] == [] and len(results["runs"]) == 3
    for run in results["runs"]:
        # Every shard's references crossed the write's GroupByKey, as a few hundred bytes each, not the records.
        assert run["references"] >= run["shards"] and run["shuffle_bytes"] < run["output_bytes"] / 10
        assert run["operations"]["spill"]["written"] >= run["output_bytes"] * 0.9  # every record spilled once
        assert run["operations"]["spill"]["B"] >= run["references"]  # each reference read back
        assert run["left_after_commit"] == 0
    assert len(results["no_shuffle_runs"]) == 3
    for run in results["no_shuffle_runs"]:
        # Each shard written whole, straight to gs://: no spill object, no reference, no record through a shuffle.
        assert "spill" not in run["operations"] and run["references"] == 0 and run["units"] >= 1
        assert run["shuffle_bytes"] < run["output_bytes"] / 10 and run["left_after_commit"] == 0
        assert run["operations"]["output"]["written"] >= run["output_bytes"]
    plan = results["plan"]
    assert plan["samples"] > 700_000_000 and plan["shards"] > 1_000_000  # ARCO-ERA5 1940-2024, 5 variables
    spill, before = results["bills"]["spill objects"], results["bills"]["runner shuffle (before)"]
    assert before["Dataflow Shuffle"] > 100 * spill["Dataflow Shuffle"]
    unshuffled = results["bills"]["no shuffle"]
    assert unshuffled["Dataflow Shuffle"] <= spill["Dataflow Shuffle"]
    assert unshuffled["storage (intermediates)"] <= spill["storage (intermediates)"]
    evaluated = {t["name"]: t["status"] for t in results["targets"]}
    assert set(evaluated) == {
        "cost: shuffle bytes / output bytes, largest run",
        "cost: shuffle bytes / output bytes, ERA5 plan",
        "cost: intermediate objects / (units + shards), ERA5 plan",
        "cost: intermediate bytes / output bytes",
        "cost: objects left under _tmp/ after the commit",
        "cost: ERA5 1940-2024 bill, spill objects",
        "cost: shuffle bytes / output bytes, no shuffle, ERA5 plan",
        "cost: ERA5 1940-2024 bill, no shuffle",
    }
    assert set(evaluated.values()) <= {"PASS", "FAIL"}


def test_run_includes_the_cost_benchmark_only_when_asked(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO))
    from benchmarks import run

    assert "cost" in run.COMPETITORS and "cost" not in run.DEFAULT_COMPETITORS


def test_operations_are_classed_as_gcs_bills_them(cost):
    output = "gs://b/out"

    def row(method, path, name=None, query=None, nested=(), received=0):
        return {"method": method, "path": path, "query": query or {}, "name": name, "nested": list(nested)}

    api = "/storage/v1/b/b/o"
    lines = [
        {**row("POST", "/upload/storage/v1/b/b/o", "out/_tmp/r/spill/unit-000001.spill.tmp-1"), "received": 500},
        row("GET", "/download/storage/v1/b/b/o/x", "out/_tmp/r/spill/unit-000001.spill"),  # a range read: B
        row("GET", api, "out/shard-0", query={"prefix": "out/_tmp/"}),  # a listing: A, of what it lists
        row("DELETE", f"{api}/out%2Fschema.json", "out/schema.json"),  # free
        row(
            "POST",
            "/batch/storage/v1",
            nested=[
                ("POST", f"http://h{api}/out%2Fa.tmp-1/copyTo/b/b/o/out%2Fa"),  # a copy: A, of its source
                ("DELETE", f"http://h{api}/out%2Fa.tmp-1"),  # free, batched or not
            ],
        ),
        row("GET", f"{api}/input%2Fa.nc", "input/a.nc"),  # the source's metadata: B, the source's own
    ]
    tally = cost.gcs_operations(lines, output)
    assert tally["spill"] == {"A": 1, "B": 1, "written": 500}
    assert tally["run files"] == {"A": 1, "B": 0, "written": 0}
    assert tally["output"] == {"A": 1, "B": 0, "written": 0}
    assert tally["input"] == {"A": 0, "B": 1, "written": 0}
    assert cost.intermediate_objects(lines, output) == {"out/_tmp/r/spill/unit-000001.spill"}


def test_fits_and_references_at_their_edges(cost):
    assert cost.fit([1, 2, 3], [12, 22, 32]) == pytest.approx({"slope": 10, "intercept": 2})
    assert cost.fit([2, 2, 2], [4, 6, 8]) == pytest.approx({"slope": 3, "intercept": 0})  # no spread: a rate
    # Few samples a unit among many shards: about one reference a sample; a single shard: one a unit.
    assert cost.references(1_000, 1_000_000, 10_000) == pytest.approx(10_000, rel=1e-3)
    assert cost.references(1_000, 1, 10_000) == 1_000
    # Many samples a unit among few shards: every shard of every unit.
    assert cost.references(10, 4, 10_000) == pytest.approx(40)
