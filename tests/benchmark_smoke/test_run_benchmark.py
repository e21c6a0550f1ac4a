"""The side-by-side benchmark (``benchmarks.run``) runs end to end on tiny data: every row printed, the JSON readable.

No timing is asserted: the machines that run the tests are shared and noisy.
"""

from __future__ import annotations

import json

import pytest

from conftest import REPO
from helpers import run_benchmark

pytest.importorskip("xbatcher", reason="the benchmark's naive peer uses xbatcher (test extras)")

ROWS = [
    "floor (numpy, 1 process)",
    "I/O limit (read, write, sync)",
    "pipeline (default runner)",
    "pipeline, 2 workers",
    "naive peer (xbatcher + tf.train)",
    "pipeline start-up (default runner",
    "pipeline start-up (2 workers",
    "python -m pipelines.build --help",
    "the demo build, python -m pipelines.build (median of",
    "patches (1x)",
    "point series (32 steps of t)",
    "same, 32 per record",
    "series per record (output.examples_per_record: 32)",
    "== shard writer",
    "~0.5 KB samples, 32 per record",
    "== targets ==",
]


def test_quick_benchmark_prints_every_row_and_writes_json(tmp_path):
    result_file, page = tmp_path / "results.json", tmp_path / "performance.md"
    page.write_text("# Performance\n\n<!-- benchmark:start -->\nan older table\n<!-- benchmark:end -->\n\nafter\n")
    printed = run_benchmark(
        "benchmarks.run", "--quick", "--workdir", str(tmp_path), "--json", str(result_file), "--markdown", str(page)
    )
    for row in ROWS:
        assert row in printed, f"no row {row!r} in:\n{printed}"
    results = json.loads(result_file.read_text())
    assert results["failed"] == []
    competitors = results["scales"]["1"]["competitors"]
    assert set(competitors) == {"floor", "io-limit", "pipeline", "pipeline-2w", "naive"}
    assert all(row["samples"] > 0 and row["peak_rss"] > 0 for row in competitors.values())
    # The I/O limit moved the inputs' bytes, every one; the demo build ran (its wall is a target).
    assert competitors["io-limit"]["details"]["bytes"] == results["scales"]["1"]["dataset"]["input_bytes"]
    assert results["demo"]["ok"] and len(results["demo"]["runs"]) == 1  # one with --quick
    assert "demo build wall" in {t["name"] for t in results["targets"]}
    # The floor uses the pipeline's encoder, keys and framing: its shards must equal the pipeline's.
    assert results["scales"]["1"]["identical_to_pipeline"] == {"floor": True, "pipeline-2w": True}
    assert {t["status"] for t in results["targets"]} <= {"PASS", "FAIL"}
    (packed,) = results["shard_writer"]["cases"].values()  # --quick: the packed case alone
    assert packed["stream"]["identical"] is True
    # --markdown: the docs' table replaced by this run's report, with the command that made it and no day or load.
    written = page.read_text()
    assert "an older table" not in written and written.endswith("<!-- benchmark:end -->\n\nafter\n")
    assert "Written by `python -m benchmarks.run --quick" in written and "== targets ==" in written
    assert results["started"] not in written and "load" not in written.split("<!-- benchmark:start -->")[1]
    assert str(tmp_path) not in written.replace(str(page), "")  # no folder of the machine that ran it (--workdir)


def test_run_includes_the_many_files_benchmark_only_when_asked(tmp_path, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(REPO))  # benchmarks/ is not an installed package
    from benchmarks import run, scale

    monkeypatch.setattr(scale, "PARTS", ("units",))  # the cheapest part: two planning runs
    monkeypatch.setenv("XTF_BENCH_SMOKE", "1")  # forked warm, as run_benchmark's (benchmarks.measure.smoke)
    result_file = tmp_path / "results.json"
    assert run.main(["--only", "scale", "--quick", "--workdir", str(tmp_path), "--json", str(result_file)]) == 0
    printed = capsys.readouterr().out
    assert "_plan_units 4 / 2 files" in printed and "== targets ==" in printed
    results = json.loads(result_file.read_text())
    assert results["scales"] == {} and results["failed"] == []
    assert [t["name"] for t in results["targets"]] == ["_plan_units 4 / 2 files"]
    assert "scale" not in run.DEFAULT_COMPETITORS


def test_the_io_limit_writes_the_inputs_bytes_over_the_shards_in_turn(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(REPO))  # benchmarks/ is not an installed package
    from benchmarks.io_limit import copy_and_sync

    inputs = []
    for i, size in enumerate((0, 5, 3 * 2**20 + 7)):
        inputs.append(tmp_path / f"in-{i}.nc")
        inputs[-1].write_bytes(bytes([i + 1]) * size)
    result = copy_and_sync(inputs, tmp_path / "out", shards=2)
    assert result["bytes"] == sum(p.stat().st_size for p in inputs)
    written = sorted((tmp_path / "out").iterdir())
    assert [p.read_bytes() for p in written] == [inputs[0].read_bytes() + inputs[2].read_bytes(), b"\2" * 5]
    assert set(result["seconds"]) == {"read", "write", "sync"}


def test_the_runs_time_the_projects_modules_as_cached_bytecode(monkeypatch):
    """A fresh interpreter finds the project compiled (a user's second run), and the header says how it ran."""
    monkeypatch.syspath_prepend(str(REPO))  # benchmarks/ is not an installed package
    import importlib.util

    from benchmarks import bytecode

    compiled = REPO / "pipelines" / importlib.util.cache_from_source("build.py")
    compiled.unlink(missing_ok=True)
    state = bytecode.cache_project_bytecode()
    assert state["project_compiled"] and compiled.is_file()
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    assert bytecode.cache_project_bytecode()["dont_write_bytecode"] is True
    assert "PYTHONDONTWRITEBYTECODE is set" in bytecode.note(state | {"dont_write_bytecode": True})
    assert "WARNING" in bytecode.note(state | {"installed_compiled": False})
    assert "WARNING" not in bytecode.note(state | {"installed_compiled": True})


def test_every_timed_run_starts_without_the_competitors_earlier_output(tmp_path, monkeypatch):
    """A rerun of the benchmark found the pipeline's last output and timed its removal (--overwrite) in the
    pipeline's row alone; each run starts from no output now, the inputs warm."""
    monkeypatch.syspath_prepend(str(REPO))
    from benchmarks.run import Bench

    output, archive = tmp_path / "out" / "pipeline", tmp_path / "archive"
    (output / "old").mkdir(parents=True)
    (output / "old" / "data-00000-of-00001.tfrecord").write_bytes(b"x" * 1000)
    archive.mkdir()
    (archive / "a.nc").write_bytes(b"inputs")
    seen = tmp_path / "seen"
    check = f"import os; open({str(seen)!r}, 'a').write(str(os.path.exists({str(output)!r})))"
    bench = Bench(tmp_path, quick=True, repeat=2, naive_files=1, timeout=60, selected=frozenset())
    assert bench.run(["-c", check + f"; os.makedirs({str(output)!r})"], archive, output).ok
    assert seen.read_text() == "FalseFalse"  # the first found the old output gone, the second the first's
    assert archive.joinpath("a.nc").read_bytes() == b"inputs"  # the inputs are read, never removed


def test_repeats_run_in_rounds_and_ratios_are_the_median_of_the_rounds(tmp_path, monkeypatch):
    """--repeat N: every competitor once a round (a slow spell falls on all of a round), the fastest run kept,
    the pipeline's ratios the median of its rounds'; a failed run is kept and not run again."""
    monkeypatch.syspath_prepend(str(REPO))
    from benchmarks import datasets, report, run, targets

    archive = tmp_path / "archive"
    archive.mkdir()
    (archive / "a.nc").write_bytes(b"x")
    monkeypatch.setattr(datasets, "ensure_archive", lambda workdir, spec: archive)
    scripted = {"floor": [4.0, 2.0, 3.0], "io-limit": [1.0, 2.0, 1.5], "pipeline": [1.5, 2.2, 1.8], "naive": [9.0]}
    calls = []

    def fake(name):
        def runner(bench, spec, archive, *args):
            assert bench.repeat == 1  # one run a call: the rounds are run_scale's
            calls.append(name)
            wall = scripted[name][sum(c == name for c in calls) - 1]
            return {"label": name, "ok": name != "naive", "wall": wall, "peak_rss": 1, "samples": 1}

        return runner

    for name, attribute in (("floor", "run_floor"), ("io-limit", "run_io_limit"), ("naive", "run_naive")):
        monkeypatch.setattr(run, attribute, fake(name))
    monkeypatch.setattr(run, "run_pipeline", lambda bench, spec, archive, name: fake(name)(bench, spec, archive))
    selected = frozenset({"floor", "io-limit", "pipeline", "naive"})
    bench = run.Bench(tmp_path, quick=True, repeat=3, naive_files=1, timeout=60, selected=selected)
    section = run.run_scale(bench, 1)

    assert calls == ["floor", "io-limit", "pipeline", "naive"] + ["floor", "io-limit", "pipeline"] * 2
    rows = section["competitors"]
    assert {name: (row["wall"], row["walls"]) for name, row in rows.items()} == {
        "floor": (2.0, [4.0, 2.0, 3.0]),
        "io-limit": (1.0, [1.0, 2.0, 1.5]),
        "pipeline": (1.5, [1.5, 2.2, 1.8]),
        "naive": (9.0, [9.0]),
    }
    assert not rows["naive"]["ok"]
    # by round 1.5, 1.1, 1.2: median 1.2, where the fastest over the fastest (1.5 / 1.0) pairs two spells
    assert targets.wall_ratio(rows["pipeline"], rows["io-limit"]) == pytest.approx(1.2)
    assert targets.wall_ratio(rows["pipeline"], rows["floor"]) == pytest.approx(0.6)  # 0.375, 1.1, 0.6
    notes = "\n".join(report._round_notes(rows))
    assert "pipeline / io-limit by round: 1.50, 1.10, 1.20 (median 1.20" in notes
    assert "pipeline / floor by round: 0.38, 1.10, 0.60 (median 0.60" in notes
    # ... and beside it, the fastest over the fastest: the two ways of reading noisy rounds, side by side
    assert "(median 1.20: the targets' ratio; fastest / fastest 1.50)" in notes
    assert "(median 0.60: the targets' ratio; fastest / fastest 0.75)" in notes
    single = {name: dict(row, walls=row["walls"][:1]) for name, row in rows.items()}
    assert targets.wall_ratio(single["pipeline"], single["io-limit"]) == 1.5  # one round: wall over wall
    assert report._round_notes(single) == []


def test_a_competitors_cpu_time_is_its_whole_trees_and_printed_beside_its_row(tmp_path, monkeypatch):
    """The CPU a run measures is every process of its tree that was waited for: a child spinning 0.3 s of its own
    CPU in a grandchild is counted; a sleeping one is not."""
    import sys

    monkeypatch.syspath_prepend(str(REPO))
    from benchmarks import report
    from benchmarks.measure import run_measured

    spin = "import time\nwhile time.process_time() < 0.3: pass"  # at least 0.3 s of its own CPU, whatever the machine
    in_grandchild = f"import subprocess, sys; subprocess.run([sys.executable, '-S', '-c', {spin!r}], check=True)"
    # (-S: not a `python -m/-c` command, which smoke runs fork warm from a server whose CPU is not the run's)
    busy = run_measured([sys.executable, "-S", "-c", in_grandchild], str(tmp_path))
    idle = run_measured([sys.executable, "-S", "-c", "import time; time.sleep(0.3)"], str(tmp_path))
    assert busy.ok and idle.ok
    assert sum(busy.cpu) >= 0.3 > sum(idle.cpu)
    rows = {
        "io-limit": {"label": "I/O limit", "ok": True, "cpu": [0.04, 3.01]},
        "pipeline": {"label": "pipeline", "ok": True, "cpu": list(busy.cpu)},
        "naive": {"label": "naive", "ok": False, "cpu": [1.0, 1.0]},  # failed: its CPU means nothing
    }
    [note] = report._cpu_notes(rows)
    assert note.startswith("  CPU s, user + system: I/O limit 0.0 + 3.0; pipeline ") and "naive" not in note
    assert report._cpu_notes({"pipeline": dict(rows["pipeline"], cpu=[0.0, 0.0])}) == []  # forked warm: uncounted
