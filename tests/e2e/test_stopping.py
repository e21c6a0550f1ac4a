"""Ctrl-C and SIGTERM stop a build without raising into the code they interrupt, within a bounded time.

Each test runs the command's ``main`` in a fresh interpreter with the build itself replaced by
a stand-in that puts the main thread where a signal used to do harm, or where it never
notices the stop; the random moments of real builds are in test_atomicity.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

#: The stand-in build: ``scenario`` says what the main thread is doing when the signal comes.
SCRIPT = """
import logging, os, sys, threading, time, types
from pathlib import Path

from pipelines import build
from planning.run.cancellation import check_stopped

scenario, signum, output = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
try:
    import pipelines.stopping as stopping
    stopping.GRACE, stopping.CLEANUP_LIMIT = 1.0, 1.0
except ImportError:  # the code before pipelines.stopping: the test must fail (hang) there, not here
    stopping = None


def run_build(config, beam_args, *rest):
    if scenario == "holding logging's lock":
        # As Beam's worker threads: each new logger takes logging's lock.
        worker = threading.Thread(target=lambda: [logging.getLogger(f"worker.{i}") for i in range(2000)])
        try:
            logging._acquireLock()
            worker.start()
            os.kill(os.getpid(), signum)  # the signal comes while the main thread holds the lock
            logging._releaseLock()
        finally:
            worker.join()  # as Beam's runner waits for its threads when it unwinds
        while True:  # working on, up to its next checkpoint
            check_stopped()
            time.sleep(0.01)
    if scenario == "never notices, submitting":
        # A remote run: its submission folder is the temp directory while it submits and waits for its job.
        del sys.modules["pipelines.runners"]  # (the real one, not the stand-in below)
        from apache_beam.options.pipeline_options import PipelineOptions
        from pipelines.runners import submission_temp_dir

        submitting = submission_temp_dir(PipelineOptions(["--runner=DaskRunner"]))
        submitting.__enter__()  # (held by this frame, which never returns: collected, it would leave at once)
    (output / "shard.tfrecord").write_bytes(b"half")
    never = threading.Event()
    remove = (lambda: never.wait()) if scenario == "clean-up hangs" else (output / "shard.tfrecord").unlink
    stopping.clean_up_on_stop(stopping.RunCleanup(remove))
    os.kill(os.getpid(), signum)
    never.wait()  # a wait that no checkpoint ends: the stop has to end the process itself


sys.modules["pipelines.graph"] = types.SimpleNamespace(run_build=run_build)
sys.modules["pipelines.runners"] = types.SimpleNamespace(
    check_known_flags=lambda *args: None, with_runner_defaults=lambda args: args, stop_local_workers=lambda until: None
)
config = types.SimpleNamespace(output=types.SimpleNamespace(path=str(output)))
sys.modules["planning.config"] = types.SimpleNamespace(load_config=lambda *args, **kwargs: config)
code = build.main(["--config", "c.yaml", "--quiet"])
sys.stderr.flush()
os._exit(code)
"""

STOPPED_LINE = "error: stopped by SIGTERM; the run's files were removed and the output is not complete"
STOPPED = {signal.SIGTERM: (143, "stopped by SIGTERM"), signal.SIGINT: (130, "interrupted")}


def _run(
    scenario: str, signum: int, output, limit: float = 60.0, env: dict | None = None
) -> tuple[subprocess.CompletedProcess, float]:
    # The limit counts the child's imports too: 20 s was once too short on a machine loaded by the suite's
    # other workers. A hang is for ever; only a failing run waits the whole limit.
    started = time.monotonic()
    try:
        run = subprocess.run(
            [sys.executable, "-c", SCRIPT, scenario, str(int(signum)), str(output)],
            capture_output=True,
            text=True,
            timeout=limit,
            env=env,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"{scenario}: still running {limit:.0f} s after the signal")
    return run, time.monotonic() - started


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "ctrl-c"])
def test_a_signal_while_the_main_thread_holds_a_lock_does_not_hang(tmp_path, signum):
    """The old handler raised where the signal found the main thread: holding logging's lock, which
    it then never released, while it waited for a thread that needed it (issue 21, item 9)."""
    run, _ = _run("holding logging's lock", signum, tmp_path)
    code, what = STOPPED[signum]
    assert run.returncode == code, run.stderr
    assert run.stderr.splitlines() == [f"error: {what}; the run's files were removed and the output is not complete"]


def test_a_main_thread_that_never_stops_is_ended_after_the_grace_with_the_run_cleaned_up(tmp_path):
    run, seconds = _run("never notices", signal.SIGTERM, tmp_path)
    assert run.returncode == 143, run.stderr
    assert run.stderr.splitlines() == [
        "error: stopped by SIGTERM; the run's files were removed and the output is not complete"
    ]
    assert not (tmp_path / "shard.tfrecord").exists()  # the stop removed what the run wrote
    assert seconds < 15  # the grace (1 s here), not for ever


def test_a_clean_up_that_hangs_is_cut_short(tmp_path):
    run, seconds = _run("clean-up hangs", signal.SIGINT, tmp_path)
    assert run.returncode == 130, run.stderr
    assert run.stderr.splitlines() == [
        "error: interrupted; cleaning up took too long: the output is not complete (--overwrite replaces it)"
    ]
    assert seconds < 15


def test_a_remote_run_ended_by_its_stop_leaves_nothing_in_the_temp_directory(tmp_path):
    """The stop ends the process itself (os._exit): its submission folder went only when the main thread unwound."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    run, _ = _run("never notices, submitting", signal.SIGTERM, tmp_path, env={**os.environ, "TMPDIR": str(temp)})
    assert run.returncode == 143, run.stderr
    assert run.stderr.splitlines() == [STOPPED_LINE]
    assert sorted(p.name for p in temp.iterdir()) == []
