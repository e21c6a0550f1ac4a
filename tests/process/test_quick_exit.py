"""exit_quickly: the interpreter's teardown skipped, what a program sees of an exit kept (handlers, streams, code)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from conftest import REPO

PROGRAM = """
import atexit, os, sys, threading, time, weakref
from pipelines.stopping import exit_quickly, remove_at_exit

folder = sys.argv[1]

def mark(name, text="ran"):
    with open(os.path.join(folder, name), "w") as stream:
        stream.write(text)

class TornDown:  # held by a module global: only the interpreter's teardown frees it
    def __del__(self, path=os.path.join(folder, "torn-down"), open=open):  # (the module's names may be gone)
        with open(path, "w") as stream:
            stream.write("freed")

kept = TornDown()
atexit.register(mark, "atexit")
class Owner: pass
owner = Owner()
weakref.finalize(owner, mark, "finalizer")
os.mkdir(os.path.join(folder, "beam-temp"))
remove_at_exit(os.path.join(folder, "beam-temp"))
if sys.argv[2] == "thread":  # a thread the interpreter's exit waits for
    threading.Thread(target=lambda: (time.sleep(0.3), mark("thread"))).start()
print("buffered", end="")  # (stdout is a pipe: block-buffered until the exit flushes it)
sys.stderr.write("said")
exit_quickly(3) if sys.argv[2] != "plain" else sys.exit(3)
"""


def run(tmp_path, how: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(PROGRAM), str(tmp_path), how],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )


def written(tmp_path) -> set[str]:
    return {path.name for path in tmp_path.iterdir()}


def test_a_quick_exit_runs_the_handlers_flushes_the_streams_and_keeps_the_code_but_skips_the_teardown(tmp_path):
    done = run(tmp_path, "quick")
    assert (done.returncode, done.stdout, done.stderr) == (3, "buffered", "said")
    # atexit handlers and weakref finalizers ran, the registered folder is gone; nothing was torn down
    assert written(tmp_path) == {"atexit", "finalizer"}


def test_the_interpreters_own_exit_tears_down_what_the_quick_exit_skips(tmp_path):
    """The control: the same program through sys.exit frees the module's objects (which is what takes time)."""
    done = run(tmp_path, "plain")
    assert (done.returncode, done.stdout) == (3, "buffered")
    assert written(tmp_path) == {"atexit", "finalizer", "torn-down", "beam-temp"}  # (Beam removes its own)


def test_a_thread_still_running_gets_the_interpreters_exit_which_waits_for_it(tmp_path):
    done = run(tmp_path, "thread")
    assert (done.returncode, done.stdout) == (3, "buffered")
    assert {"thread", "atexit", "finalizer"} <= written(tmp_path)
