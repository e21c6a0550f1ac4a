"""Shared fixtures: the sample files (or a stand-in), small synthetic archives, a GCS emulator, quiet TensorFlow."""

from __future__ import annotations

import contextlib
import gc
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import settings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

# Property tests take their number of examples from the profile (a test that wants more asks for a
# multiple of it). No deadline: a shared machine's pauses are not the code's. CI (CI=true) draws
# fewer examples, the same ones every run, so that a failure there is reproducible.
settings.register_profile("dev", deadline=None, max_examples=60)
settings.register_profile("ci", deadline=None, max_examples=20, derandomize=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") == "true" else "dev"))
sys.path.insert(0, str(Path(__file__).parent))
from process_guard import no_process_started  # noqa: E402  (tests/ on the path first)

REPO = Path(__file__).resolve().parents[1]
# benchmarks/ is no installed package; their smoke tests import it wherever pytest is started from (after the
# installed packages: the same checkout's modules, where the install is editable).
sys.path.append(str(REPO))
VENDORED_DATA = REPO / "tests" / "data"  # geocat-datafiles and cfgrib samples (Apache-2.0): tests/data/README.md
SHARED_DATA = Path(os.environ.get("XTF_SHARED_DATA", REPO.parent / "shared" / "data"))
ERAINT = "eraint_uvz.nc"  # no licence: never committed; from SHARED_DATA when there, else a stand-in


#: The modules that take longest (seconds of a worker, measured), started first: xdist hands a whole
#: module to a worker (--dist loadscope), so one of these started last would run on alone at the end.
#: Modules not named keep the order they were collected in, after these.
SLOWEST_MODULES = [
    "tests/benchmark_smoke/test_run_benchmark.py",
    "tests/e2e/test_atomicity.py",
    "tests/e2e/test_preprocess.py",
    "tests/benchmark_smoke/test_scale_benchmark.py",
    "tests/e2e/test_cloud.py",
    "tests/e2e/test_dask.py",
    "tests/e2e/test_build_cli.py",
    "tests/benchmark_smoke/test_scale_graph_dask_benchmark.py",
    "tests/transform/test_shard_writer.py",
    "tests/e2e/test_docs.py",
    "tests/e2e/test_append.py",
    "tests/e2e/test_bad_input.py",
    "tests/e2e/test_zarr.py",
    "tests/e2e/test_portable.py",
    "tests/e2e/test_stopping.py",
    "tests/e2e/test_reproducible.py",
    "tests/test_style.py",
]


def pytest_collection_finish(session):
    """What collecting imported (TensorFlow, Beam, xarray: ~500,000 objects) lives as long as the worker: frozen.

    The cyclic collector would otherwise walk it at every full collection, a quarter of a small
    build's time in a process that holds TensorFlow (measured); the command line does the same after
    its imports (pipelines.cli.started_up).
    """
    gc.freeze()


#: The marker each folder's tests carry (`pytest -m unit`, `-m "not e2e"`): what kind of test it is.
FOLDER_MARKERS = {
    "unit": "unit",
    "process": "process",
    "transform": "transform",
    "e2e": "e2e",
    "benchmark_smoke": "benchmark",
}


def pytest_collection_modifyitems(items):
    """Each test marked by its folder's kind, the slowest modules also `slow`; the slowest modules first
    (SLOWEST_MODULES), each module's tests in their own order."""
    rank = {name: i for i, name in enumerate(SLOWEST_MODULES)}
    for item in items:
        module = item.nodeid.split("::", 1)[0]
        folder = module.split("/")[1] if module.count("/") >= 2 else None
        if folder in FOLDER_MARKERS:
            item.add_marker(FOLDER_MARKERS[folder])
        if module in rank:
            item.add_marker("slow")
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    with _watched(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    with _watched(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item):
    with _watched(item):
        return (yield)


def _watched(item):
    """A unit test's phase fails if it started a process (its fixtures' included): it belongs in tests/process."""
    if item.get_closest_marker("unit"):
        return no_process_started(item.nodeid)
    return contextlib.nullcontext()


def real_eraint() -> Path | None:
    """The real ERA-Interim file in SHARED_DATA (../shared/data or $XTF_SHARED_DATA), if it is there."""
    path = SHARED_DATA / ERAINT
    return path if path.exists() else None


@pytest.fixture(autouse=True)
def no_stop_left_behind():
    """A test that cancels writes (a failed or stopped build's clean-up, called directly) leaves no stop to the next."""
    yield
    from planning.run.cancellation import reset

    reset()


@pytest.fixture(scope="session")
def sample_file(tmp_path_factory):
    """`sample_file(name)`: the path of a sample file, wherever this checkout has it.

    The NCAR files come from tests/data (vendored), else SHARED_DATA; `eraint_uvz.nc` comes from
    SHARED_DATA when present, else from a stand-in with the same layout and quirks, generated once
    per session (pipelines.demo.write_eraint_standin).
    """
    standin: list[Path] = []

    def resolve(name: str) -> Path:
        if name == ERAINT:
            if real := real_eraint():
                return real
            if not standin:
                from pipelines.demo import write_eraint_standin

                standin.append(write_eraint_standin(tmp_path_factory.mktemp("standin") / ERAINT))
            return standin[0]
        for folder in (VENDORED_DATA, SHARED_DATA):
            if (folder / name).exists():
                return folder / name
        pytest.fail(f"sample file {name} is in neither {VENDORED_DATA} nor {SHARED_DATA}")

    return resolve


@pytest.fixture(scope="session")
def small_archive(tmp_path_factory) -> Path:
    """A synthetic ERA5-like archive: 3 files x 4 steps, 3 levels, 20 x 24 grid."""
    from pipelines.demo import ArchiveShape, write_archive

    directory = tmp_path_factory.mktemp("archive")
    write_archive(directory, ArchiveShape(num_files=3, steps_per_file=4, levels=3, lat=20, lon=24), seed=1)
    return directory


BUCKET = "xtf-test"  # the storage emulator's bucket (fixture gcs)


def _free_port() -> int:
    with contextlib.closing(socket.socket()) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _listening(process: subprocess.Popen, port: int, timeout: float = 30) -> bool:
    """Whether ``process`` listens on ``port`` (False: it exited, e.g. the port was taken meanwhile)."""
    import psutil

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            return False
        # Its own socket, not merely an answer on the port: another worker's emulator may answer there.
        with contextlib.suppress(psutil.Error):
            sockets = psutil.Process(process.pid).net_connections("tcp")
            if any(s.status == psutil.CONN_LISTEN and s.laddr.port == port for s in sockets):
                return True
        time.sleep(0.05)
    raise TimeoutError("the storage emulator did not start")


def _stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _start_emulator(bucket: str = BUCKET) -> tuple[subprocess.Popen, int]:
    """gcp-storage-emulator in memory on a free port: (its process, the port)."""
    emulator = Path(__file__).parent / "gcs_emulator.py"  # with a longer listen queue and GCS's moveTo
    for _ in range(5):  # a port free when chosen may be taken before the emulator binds it (parallel workers)
        port = _free_port()
        command = [sys.executable, str(emulator), "start", "--host=127.0.0.1", f"--port={port}", "--in-memory"]
        quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
        process = subprocess.Popen([*command, f"--default-bucket={bucket}", "--quiet"], **quiet)
        if _listening(process, port):
            return process, port
        _stop(process)
    raise RuntimeError("the storage emulator exited on each of 5 ports")


@pytest.fixture(scope="module")
def gcs(tmp_path_factory):
    """A GCS emulator on 127.0.0.1 with an empty bucket; the environment points gcsfs and Beam at it."""
    import fsspec

    process, port = _start_emulator()
    saved = {k: os.environ.get(k) for k in ("STORAGE_EMULATOR_HOST", "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT")}
    try:
        os.environ["STORAGE_EMULATOR_HOST"] = f"http://127.0.0.1:{port}"
        os.environ["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] = "false"  # else gcsfs probes the bucket over gRPC for 60 s
        fsspec.config.conf.pop("gs", None)
        yield fsspec.filesystem("gs", skip_instance_cache=True)
    finally:
        _stop(process)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _shared_across_workers(tmp_path_factory, name: str) -> Path:
    """A folder every pytest-xdist worker of this session sees (without xdist: this process's own)."""
    base = tmp_path_factory.getbasetemp()
    # Under xdist each worker's basetemp is <session>/popen-gwN: their parent is this session's alone.
    folder = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / name
    folder.mkdir(exist_ok=True)
    return folder


@contextlib.contextmanager
def _locked(folder: Path):
    """Hold ``folder``'s lock: one worker at a time makes what the others then reuse."""
    import fcntl

    with open(folder / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


@pytest.fixture(scope="session")
def _staged(tmp_path_factory) -> Path:
    """Where Beam's stager's products of this session are kept: the sdists it built, the `pip freeze` it wrote.

    Shared by the session's workers: two sdist builds of this checkout at once would also write
    its egg-info at once.
    """
    return _shared_across_workers(tmp_path_factory, "staged")


@pytest.fixture
def staged_once(_staged, monkeypatch):
    """Dataflow dry runs in this test reuse the session's staging of this checkout (its sdist, `pip freeze`).

    Each dry run otherwise builds the sdist and runs `pip freeze` again, in subprocesses: about
    7 s of a 10 s dry run. The first one of the session runs them for real; later runs get copies.
    """
    import hashlib
    import shutil

    from apache_beam.runners.portability import stager

    build, freeze = stager.Stager._build_setup_package, stager.Stager._create_stage_submission_env_dependencies

    def build_once(setup_file, temp_dir, build_setup_args=None):
        key = repr((setup_file, tuple(build_setup_args or ())))
        folder = _staged / hashlib.sha256(key.encode()).hexdigest()[:16]
        with _locked(_staged):
            if not folder.exists():
                building = _staged / "building"
                shutil.rmtree(building, ignore_errors=True)  # a build that failed half-way
                building.mkdir()
                build(setup_file, str(building), build_setup_args)
                building.rename(folder)  # complete, or not there
            (sdist,) = folder.glob("*.tar.gz")
        return shutil.copy(sdist, temp_dir)

    def freeze_once(temp_dir):
        name = stager.SUBMISSION_ENV_DEPENDENCIES_FILE
        frozen = _staged / name
        with _locked(_staged):
            if not frozen.exists():
                artifacts = freeze(temp_dir)
                if artifacts:  # else it logged why; the next run tries again
                    frozen.write_text((Path(temp_dir) / name).read_text())
                return artifacts
        (Path(temp_dir) / name).write_text(frozen.read_text())
        return [stager.Stager._create_file_stage_to_artifact(str(Path(temp_dir) / name), name)]

    monkeypatch.setattr(stager.Stager, "_build_setup_package", staticmethod(build_once))
    monkeypatch.setattr(stager.Stager, "_create_stage_submission_env_dependencies", staticmethod(freeze_once))
