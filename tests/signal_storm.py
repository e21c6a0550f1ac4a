"""Many builds, each sent SIGTERM or Ctrl-C at a random moment: forked from one interpreter that imported everything.

Run by tests/e2e/test_atomicity.py (a fork costs milliseconds; a fresh interpreter seconds of
imports, which would spend the signals on the imports). Usage:

    python signal_storm.py CONFIG OUTPUT_DIR BUILDS SEED [BUILD FLAGS...]

First one build runs to the end, to time a build; then BUILDS builds, three at a time, each get
the signal after a random delay between 0 and 1.2 times that (some end before it). Prints a
JSON list, one entry per build: the signal, its delay, the exit code (None: still running
``TIME_LIMIT`` seconds after the signal, then killed), the seconds it took to end, what its
output holds and what it printed on stderr. Odd builds run with --verbose: Beam's threads and
the main thread then log all the time, the case that hung (issue 21, item 9); half the builds
probe their files in a pool of processes, as planning does from 500 files on.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import sys
import time
from pathlib import Path

import pipelines.graph  # noqa: F401  (imported once, before forking)
from pipelines.build import main
from pipelines.stopping import exit_now
from planning.inputs import local_probe

TIME_LIMIT = 30.0
PARALLEL = 3


def _start(config: str, output: Path, verbose: bool, pool: bool = False, extra: tuple[str, ...] = ()) -> int:
    pid = os.fork()
    if pid:
        os.setpgid(pid, pid)  # here too, so that a signal sent at once finds the group
        return pid
    code = 99
    try:
        os.setpgid(0, 0)  # its own group, as a terminal's foreground job: the signal reaches all of it
        os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
        os.dup2(os.open(f"{output}.err", os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 2)
        if pool:  # planning probes the files in a pool of processes, as it does from 500 files on
            local_probe.POOL_MIN_FILES, local_probe.FILES_PER_TASK = 1, 10
        flags = ["--verbose"] if verbose else ["--quiet"]
        code = main(["--config", config, "--output", str(output), *flags, *extra])
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException as error:  # the harness's own failure: reported through the code and stderr
        os.write(2, f"storm: {error!r}\n".encode())
    exit_now(code)  # as the command line ends a stopped build: its temporary folders removed


def _wait(pid: int, deadline: float) -> int | None:
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.005)
    return None


#: How long a build's process group may take to be gone after its main process ended: its pool's
#: workers it killed may wait a moment to be reaped (by init, once the build is gone) on a loaded
#: machine; a leaked process lives on.
GROUP_GRACE = 10.0


def _group_gone(pgid: int, within: float = GROUP_GRACE) -> bool:
    deadline = time.monotonic() + within
    while True:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


def _finish(build: dict, pid: int, code: int | None) -> dict:
    output = Path(build.pop("output"))
    build["code"] = code
    build["seconds"] = round(time.monotonic() - build.pop("signalled"), 2)
    build["left"] = not _group_gone(pid)
    build["files"] = sorted(str(p.relative_to(output)) for p in output.rglob("*")) if output.exists() else []
    err = Path(f"{output}.err")  # none when the signal came before the build had even made it
    build["stderr"] = err.read_text(errors="replace").splitlines()[-3:] if err.exists() else []
    return build


def storm(config: str, directory: Path, builds: int, seed: int, extra: tuple[str, ...] = ()) -> tuple[float, list]:
    # Builds start as a fresh interpreter would if Ctrl-C came first: killed (not a KeyboardInterrupt
    # in the harness's code), until they take the signals over.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    started = time.monotonic()
    first = _start(config, directory / "timed", verbose=False, extra=extra)
    assert _wait(first, time.monotonic() + 300) == 0, Path(f"{directory / 'timed'}.err").read_text()
    duration = time.monotonic() - started
    rng = random.Random(seed)
    plan = [(i, rng.choice([signal.SIGTERM, signal.SIGINT]), rng.uniform(0, 1.2 * duration)) for i in range(builds)]
    results: list[dict] = []
    running: dict[int, tuple[int, float, dict]] = {}  # pid: signal, when to send it, the build's record
    while plan or running:
        while plan and len(running) < PARALLEL:
            i, signum, delay = plan.pop(0)
            output = directory / f"out{i}"
            build = {"build": i, "signal": signal.Signals(signum).name, "delay": round(delay, 2), "output": output}
            pid = _start(config, output, verbose=i % 2 == 1, pool=i % 4 >= 2, extra=extra)
            running[pid] = (signum, time.monotonic() + delay, build)
        now = time.monotonic()
        for pid, (signum, at, build) in list(running.items()):
            if "signalled" not in build:
                if now >= at:
                    with contextlib.suppress(ProcessLookupError):  # it ended before: complete, or failed
                        os.killpg(pid, signum)
                    build["signalled"] = now
                continue
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                results.append(_finish(build, pid, os.waitstatus_to_exitcode(status)))
            elif now - build["signalled"] > TIME_LIMIT:  # hung: recorded as such, then killed
                os.killpg(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                results.append(_finish(build, pid, None))
            else:
                continue
            del running[pid]
        time.sleep(0.005)
    return duration, results


if __name__ == "__main__":
    config, directory, builds, seed = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    duration, results = storm(config, directory, builds, seed, tuple(sys.argv[5:]))
    print(json.dumps({"duration": round(duration, 2), "builds": results}))
