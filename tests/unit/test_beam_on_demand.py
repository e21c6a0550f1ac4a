"""Beam's HTTP clients run on first use: never in a local build, once (threads waiting) when used, as imported."""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import REPO


def _run(code: str, *args: str, cwd=REPO) -> dict:
    """``code`` in a fresh interpreter (Beam not imported yet); its last line of output, as JSON."""
    done = subprocess.run([sys.executable, "-c", code, *args], cwd=cwd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


_BEAM = """
import json, sys
if sys.argv[1] == "without-gcp":  # Beam as installed without its [gcp] extra: these clients run at its import
    for name in ("apitools", "google.cloud", "oauth2client", "google_auth_httplib2"):
        sys.modules[name] = None  # `import` raises ImportError, which Beam's package takes as "not installed"
from pipelines.beam_on_demand import import_beam
import_beam()
import_beam()  # Beam already imported: nothing more
import httplib2, requests  # imported again: still not run
idle = {m: m in sys.modules for m in ("httplib2", "requests", "pyparsing", "urllib3")}
deferred = type(sys.modules["httplib2"]).__name__
import apache_beam as beam
from apache_beam.testing.util import assert_that, equal_to
with beam.Pipeline(runner="FnApiRunner") as p:
    assert_that(p | beam.Create([1, 2, 3]) | beam.Map(lambda x: x * 2), equal_to([2, 4, 6]))
after_beam = {m: m in sys.modules for m in ("pyparsing", "urllib3")}
from requests.adapters import HTTPAdapter  # used: run then
used = [httplib2.Http.__name__, requests.Session.__name__, HTTPAdapter.__name__, type(httplib2).__name__]
print(json.dumps({"idle": idle, "deferred": deferred, "after_beam": after_beam, "used": used,
                  "pyparsing": "pyparsing" in sys.modules}))
"""


def test_beam_imports_its_http_clients_without_running_them_until_they_are_used():
    result = _run(_BEAM, "without-gcp")
    # in sys.modules (as imported), their own imports not made
    assert result["idle"] == {"httplib2": True, "requests": True, "pyparsing": False, "urllib3": False}
    assert result["deferred"] == "_RunsOnFirstUse"
    assert result["after_beam"] == {"pyparsing": False, "urllib3": False}  # a pipeline ran without them
    assert result["used"] == ["Http", "Session", "HTTPAdapter", "module"]  # then a plain module
    assert result["pyparsing"]


def test_with_beams_gcp_clients_installed_the_clients_they_use_run_at_once_and_beam_works():
    result = _run(_BEAM, "with-gcp")  # (the [gcp] extra, as in the test install: Beam's GCS client uses both)
    assert result["used"] == ["Http", "Session", "HTTPAdapter", "module"]
    assert result["pyparsing"]


_RACE = """
import json, sys, threading
sys.path.insert(0, sys.argv[1])
from pipelines.beam_on_demand import OnFirstUseFinder
finder = OnFirstUseFinder(("slowly_made",))
sys.meta_path.insert(0, finder)
import slowly_made
sys.meta_path.remove(finder)
start = threading.Barrier(8)
seen, errors = [], []
def read():
    start.wait()
    try:
        seen.append(slowly_made.LAST)
    except Exception as error:
        errors.append(repr(error))
threads = [threading.Thread(target=read) for _ in range(8)]
for t in threads: t.start()
for t in threads: t.join()
print(json.dumps({"seen": seen, "errors": errors, "runs": open(sys.argv[2]).read()}))
"""

# Its body takes a while and defines LAST last: a thread that read the half-run module would miss it.
_SLOW_MODULE = """
import sys, time
with open({runs!r}, "a") as runs:
    runs.write("run;")
FIRST = 1
time.sleep(0.3)
LAST = 2
"""


def test_threads_reading_a_deferred_module_at_once_wait_for_its_single_run(tmp_path):
    runs = tmp_path / "runs.txt"
    runs.write_text("")
    (tmp_path / "slowly_made.py").write_text(_SLOW_MODULE.format(runs=str(runs)))
    result = _run(_RACE, str(tmp_path), str(runs))
    assert result["errors"] == []
    assert result["seen"] == [2] * 8
    assert result["runs"] == "run;"


_FAILING = """
import json, sys
sys.path.insert(0, sys.argv[1])
from pipelines.beam_on_demand import OnFirstUseFinder
finder = OnFirstUseFinder(("breaks_on_use", "not_there"))
sys.meta_path.insert(0, finder)
import breaks_on_use
try:
    import not_there
except ImportError as error:
    missing = type(error).__name__
sys.meta_path.remove(finder)
errors = []
for _ in range(2):
    try:
        breaks_on_use.ANYTHING
    except Exception as error:
        errors.append(repr(error))
left = "breaks_on_use" in sys.modules
try:
    import breaks_on_use  # imported as usual now: its error again, as an import's
except Exception as error:
    errors.append(repr(error))
print(json.dumps({"missing": missing, "errors": errors, "left": left}))
"""


def test_a_deferred_module_that_fails_raises_its_error_where_it_is_used_and_is_not_left_half_made(tmp_path):
    (tmp_path / "breaks_on_use.py").write_text("raise RuntimeError('broken on purpose')\n")
    result = _run(_FAILING, str(tmp_path))
    assert result["missing"] == "ModuleNotFoundError"  # a module that is not there is not deferred
    # the first use raises the module's error and takes it out of sys.modules, as a failed import does;
    # the old object is then a plain half-made module, and importing it again raises the error again
    assert result["errors"] == [
        "RuntimeError('broken on purpose')",
        "AttributeError(\"module 'breaks_on_use' has no attribute 'ANYTHING'\")",
        "RuntimeError('broken on purpose')",
    ]
    assert result["left"] is False
