"""The command lines start without the cyclic collector and freeze what their imports made, once they are done."""

from __future__ import annotations

import gc
import subprocess
import sys

from pipelines.cli import started_up


def test_imports_are_frozen_only_where_the_command_line_turned_the_collector_off():
    assert gc.isenabled()
    frozen = gc.get_freeze_count()
    started_up()  # a library call (tests, notebooks): the collector was on, nothing is frozen
    assert gc.isenabled() and gc.get_freeze_count() == frozen
    gc.disable()
    try:
        started_up()
        assert gc.isenabled() and gc.get_freeze_count() > frozen
    finally:
        gc.enable()
        gc.unfreeze()


def test_a_build_from_the_command_line_runs_with_the_collector_back_on(tmp_path):
    """`python -m pipelines.build` turns it off at start: a dry run still plans with it on, its imports frozen."""
    probe = (
        "import gc, runpy, sys; from pipelines import graph; run = graph.run_build\n"
        "def watched(*a, **k):\n"
        "    print('collector', gc.isenabled(), gc.get_freeze_count() > 100_000, file=sys.stderr)\n"
        "    return run(*a, **k)\n"
        "graph.run_build = watched\n"
        "sys.argv = ['build', '--output', sys.argv[1], '--dry_run=True', '--quiet']\n"
        "runpy.run_module('pipelines.build', run_name='__main__')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe, str(tmp_path / "out")], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert "collector True True" in done.stderr, done.stderr
