"""Shared fixtures: the sample files (or a stand-in), small synthetic archives, a GCS emulator, quiet TensorFlow."""

from __future__ import annotations

import contextlib
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

REPO = Path(__file__).resolve().parents[1]
VENDORED_DATA = REPO / "tests" / "data"  # NCAR/geocat-datafiles samples (Apache-2.0): see tests/data/README.md
SHARED_DATA = Path(os.environ.get("XTF_SHARED_DATA", REPO.parent / "shared" / "data"))
ERAINT = "eraint_uvz.nc"  # no licence: never committed; from SHARED_DATA when there, else a stand-in


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


def _wait_for(port: int, process: subprocess.Popen, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, "the storage emulator exited"
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return
        time.sleep(0.05)
    raise TimeoutError("the storage emulator did not start")


@pytest.fixture(scope="module")
def gcs(tmp_path_factory):
    """A GCS emulator on 127.0.0.1 with an empty bucket; the environment points gcsfs and Beam at it."""
    import fsspec

    port = _free_port()
    emulator = Path(__file__).parent / "gcs_emulator.py"  # with a longer listen queue and GCS's moveTo
    command = [sys.executable, str(emulator), "start", "--host=127.0.0.1", f"--port={port}"]
    process = subprocess.Popen(
        [*command, "--in-memory", f"--default-bucket={BUCKET}", "--quiet"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    saved = {k: os.environ.get(k) for k in ("STORAGE_EMULATOR_HOST", "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT")}
    try:
        _wait_for(port, process)
        os.environ["STORAGE_EMULATOR_HOST"] = f"http://127.0.0.1:{port}"
        os.environ["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] = "false"  # else gcsfs probes the bucket over gRPC for 60 s
        fsspec.config.conf.pop("gs", None)
        yield fsspec.filesystem("gs", skip_instance_cache=True)
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.fixture(scope="session")
def _staged(tmp_path_factory) -> dict:
    """What Beam's stager made once this session: the sdists it built, the `pip freeze` it wrote."""
    return {"folder": tmp_path_factory.mktemp("staged"), "sdists": {}, "freeze": None}


@pytest.fixture
def staged_once(_staged, monkeypatch):
    """Dataflow dry runs in this test reuse the session's staging of this checkout (its sdist, `pip freeze`).

    Each dry run otherwise builds the sdist and runs `pip freeze` again, in subprocesses: about
    7 s of a 10 s dry run. The first one here runs them for real; later runs get copies.
    """
    import shutil

    from apache_beam.runners.portability import stager

    build, freeze = stager.Stager._build_setup_package, stager.Stager._create_stage_submission_env_dependencies

    def build_once(setup_file, temp_dir, build_setup_args=None):
        key = (setup_file, tuple(build_setup_args or ()))
        if key not in _staged["sdists"]:
            folder = _staged["folder"] / str(len(_staged["sdists"]))
            folder.mkdir()
            _staged["sdists"][key] = build(setup_file, str(folder), build_setup_args)
        return shutil.copy(_staged["sdists"][key], temp_dir)

    def freeze_once(temp_dir):
        name = stager.SUBMISSION_ENV_DEPENDENCIES_FILE
        if _staged["freeze"] is None:
            artifacts = freeze(temp_dir)
            if not artifacts:
                return artifacts  # it logged why; the next run tries again
            _staged["freeze"] = (Path(temp_dir) / name).read_text()
            return artifacts
        (Path(temp_dir) / name).write_text(_staged["freeze"])
        return [stager.Stager._create_file_stage_to_artifact(str(Path(temp_dir) / name), name)]

    monkeypatch.setattr(stager.Stager, "_build_setup_package", staticmethod(build_once))
    monkeypatch.setattr(stager.Stager, "_create_stage_submission_env_dependencies", staticmethod(freeze_once))
