"""What the package ships (the code, not the test data) and what it asks for (ranges that admit the tested set)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from conftest import REPO, VENDORED_DATA


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """A copy of the checkout: building in the checkout would leave build/ and egg-info behind."""
    source = tmp_path_factory.mktemp("src")
    for name in ("setup.py", "pyproject.toml", "README.md", "worker-requirements.txt"):
        shutil.copy(REPO / name, source / name)
    packages = {name.split(".")[0] for name in _listed_packages()}
    for folder in (*packages, "tests"):
        shutil.copytree(REPO / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__"))
    return source


def _listed_packages() -> list[str]:
    return re.findall(r'"([\w.]+)"', re.search(r"packages=\[([^\]]*)\]", (REPO / "setup.py").read_text()).group(1))


def test_setup_lists_every_package_of_the_checkout():
    """A package setup.py leaves out is missing from the sdist Dataflow's workers install (and from the wheel)."""
    tops = ("pipelines", "transforms", "planning", "schemas")  # (some of them namespaces: no __init__.py)
    found = {
        ".".join(path.parent.relative_to(REPO).parts) for top in tops for path in (REPO / top).rglob("__init__.py")
    }
    assert set(_listed_packages()) == found | set(tops)


@pytest.fixture(scope="module")
def dists(tmp_path_factory, source):
    """The sdist and the wheel, built offline from a copy of the checkout (workers get the sdist with --setup_file)."""
    tmp_path = tmp_path_factory.mktemp("dists")
    command = [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(tmp_path / "dist"), str(source)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (sdist,) = (tmp_path / "dist").glob("*.tar.gz")
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    return sdist, wheel


def test_sdist_and_wheel_ship_no_test_data(dists):
    sdist, wheel = dists
    assert sorted(p.name for p in VENDORED_DATA.glob("*.nc")), "tests/data has no sample files"
    with tarfile.open(sdist) as tar:
        names = tar.getnames()
    with zipfile.ZipFile(wheel) as whl:
        names += whl.namelist()
    assert any(n.endswith("schemas/parser_template.py") for n in names)  # package data still ships
    shipped = [n for n in names if n.endswith((".nc", ".grib")) or "tests/data" in n or "geocat" in n.lower()]
    assert not shipped, shipped


def _tested_set() -> dict[str, list[Requirement]]:
    """constraints.txt: each package's exact pins (one per Python where they differ)."""
    pins: dict[str, list[Requirement]] = {}
    for line in (REPO / "constraints.txt").read_text().splitlines():
        if line.split("#")[0].strip():
            requirement = Requirement(line)
            pins.setdefault(canonicalize_name(requirement.name), []).append(requirement)
    return pins


def _requires_dist(metadata: str) -> list[Requirement]:
    return [Requirement(line.split(":", 1)[1]) for line in metadata.splitlines() if line.startswith("Requires-Dist:")]


def _wheel_requirements(wheel) -> list[Requirement]:
    with zipfile.ZipFile(wheel) as whl:
        return _requires_dist(whl.read(next(n for n in whl.namelist() if n.endswith(".dist-info/METADATA"))).decode())


def _names(requirements, extra: str | None = None) -> set[str]:
    """The names asked for by the base install (``extra=None``) or by one extra (which adds to the base)."""
    environment = {"extra": extra or ""}
    chosen = [
        r for r in requirements if (r.marker is None if extra is None else r.marker and r.marker.evaluate(environment))
    ]
    return {canonicalize_name(r.name) for r in chosen}


def test_the_ranges_asked_for_admit_the_tested_set(dists):
    """Ranges, not pins, in the package (it joins users' environments), and each admits what CI installs."""
    _, wheel = dists
    asked = _wheel_requirements(wheel)
    pins = _tested_set()
    assert len(asked) > 20
    for requirement in asked:
        name = canonicalize_name(requirement.name)
        if name == "torch":
            continue  # optional, installed by hand (a CPU build); CI takes the one on this machine's disk
        assert name in pins, f"{requirement.name} is not in constraints.txt"
        for pin in pins[name]:
            (exact,) = pin.specifier
            assert exact.operator == "==", pin
            assert requirement.specifier.contains(exact.version, prereleases=True), f"{requirement} excludes {pin}"
    base = [r for r in asked if r.marker is None]
    assert not [r for r in base if any(s.operator == "==" for s in r.specifier)], "install_requires pins exactly"


def test_the_dockerfile_installs_the_tested_set():
    """The worker image: Beam's SDK image of the tested Beam version and Python, the package with constraints.txt."""
    dockerfile = (REPO / "Dockerfile").read_text()
    (beam,) = _tested_set()["apache-beam"]
    image = re.search(r"^FROM apache/beam_python(3\.\d+)_sdk:(\S+)$", dockerfile, re.M)
    assert image and image.group(2) == next(iter(beam.specifier)).version
    assert image.group(1) == "3.11"  # the Python CI runs the whole suite on
    # The worker set (setup.py's "worker" extra), with the tested versions; nothing a worker never runs.
    assert re.search(r"^ARG EXTRAS=worker$", dockerfile, re.M), dockerfile  # EXTRAS=dask for Dask's workers
    assert re.search(r'^RUN pip install [^&]*-c constraints\.txt "\.\[\$\{EXTRAS\}\]"', dockerfile, re.M), dockerfile
    assert re.search(r"^COPY .*constraints\.txt", dockerfile, re.M)


#: What the readers never need (the base install), and what workers never run (the worker set).
BUILD_ONLY = {"apache-beam", "xarray", "netcdf4", "h5py", "h5netcdf", "zarr", "pandas", "pydantic"}
LAUNCHER_ONLY = {"dask", "distributed", "matplotlib", "build", "setuptools"}


def _beam_extras(requirements, extra: str) -> set[str]:
    """The extras of Beam itself that ``extra`` asks for."""
    asked = [r for r in requirements if r.marker and r.marker.evaluate({"extra": extra}) and r.name == "apache-beam"]
    return set().union(*(r.extras for r in asked))


def test_each_install_asks_for_what_its_users_run(source, dists):
    """Readers install without Beam or xarray; workers without the launcher's packages; [build] and [test] with all."""
    sdist, wheel = dists
    asked = _wheel_requirements(wheel)
    with tarfile.open(sdist) as tar:  # what Dataflow's workers pip-install (--setup_file), without extras
        pkg_info = tar.extractfile(next(m for m in tar.getmembers() if m.name.endswith("/PKG-INFO"))).read().decode()
    assert _names(_requires_dist(pkg_info)) == _names(asked) == {"numpy", "fsspec", "google-crc32c"}
    worker = _names(asked, "worker")
    assert worker >= BUILD_ONLY and not worker & LAUNCHER_ONLY, worker
    # A local build's Beam comes without its GCP extras; [gcp] adds them and gcsfs (gs://, Dataflow), as workers have.
    assert _names(asked, "gcp") == {"apache-beam", "gcsfs"} and _beam_extras(asked, "gcp") == {"gcp"}
    assert _names(asked, "build") | {"gcsfs"} == worker | LAUNCHER_ONLY and _beam_extras(asked, "build") == set()
    assert _beam_extras(asked, "worker") == _beam_extras(asked, "dask") == _beam_extras(asked, "test") == {"gcp"}
    assert _names(asked, "dask") == worker | {"dask", "distributed"}
    assert _names(asked, "build") | _names(asked, "gcp") | {"tensorflow-cpu", "pytest"} <= _names(asked, "test")
    assert _names(asked, "gcs") == {"gcsfs"} and _names(asked, "tf") == {"tensorflow-cpu"}
    assert _names(asked, "reassemble") == {"xarray", "cftime", "zarr", "netcdf4"} <= worker
    # worker-requirements.txt, sent with --setup_file (--requirements_file), is the worker extra line for line.
    listed = [
        line for line in (source / "worker-requirements.txt").read_text().splitlines() if line.split("#")[0].strip()
    ]
    in_extra = sorted(
        str(Requirement(str(r).split(";")[0])) for r in asked if r.marker and r.marker.evaluate({"extra": "worker"})
    )
    assert sorted(str(Requirement(line)) for line in listed) == in_extra


def test_dataflow_workers_get_the_package_and_the_worker_set(source, dists, tmp_path, monkeypatch):
    """What Beam stages for Dataflow's workers from the build's flags, offline: no wheel is downloaded."""
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.runners.portability.stager import Stager

    from pipelines import runners

    monkeypatch.setattr(runners, "PACKAGE_ROOT", source)  # installed from this copy of the checkout
    flags = ["--runner=DataflowRunner", "--project=p", "--region=us-central1", "--temp_location=gs://b/tmp"]
    options = PipelineOptions(runners.with_runner_defaults(flags))
    # Beam builds the sdist of the setup file's folder (python -m build --sdist): the one built above.
    # Its build command given (even none), Beam takes the sdist it finds in its temporary folder.
    shutil.copy(dists[0], tmp_path)
    resources = Stager.create_job_resources(
        options, str(tmp_path), build_setup_args=[], log_submission_env_dependencies=False
    )
    staged = {name: path for path, name, _ in Stager.extract_staging_tuple_iter(resources)}
    assert set(staged) == {"requirements.txt", "workflow.tar.gz"}, staged
    assert Path(staged["requirements.txt"]).read_text() == (source / "worker-requirements.txt").read_text()
    with tarfile.open(staged["workflow.tar.gz"]) as tar:  # pip-installed as is: the readers' requirements
        pkg_info = tar.extractfile(next(m for m in tar.getmembers() if m.name.endswith("/PKG-INFO"))).read().decode()
    assert "apache-beam" not in _names(_requires_dist(pkg_info))


#: As if the build's packages (and TensorFlow, PyTorch) were not installed: importing them raises ImportError.
_BLOCKED = ["apache_beam", "xarray", "pandas", "dask", "distributed", "matplotlib", "netCDF4", "h5py", "zarr", "yaml"]
_READ_WITHOUT_THE_BUILD = """
import sys
for name in {blocked!r} + ["tensorflow", "torch", "pydantic"]:
    sys.modules[name] = None
sys.path.insert(0, "tests")
from pathlib import Path
from synthetic_output import FEATURES, make_columns, write_output
import schemas, schemas.torch_dataset
from schemas import Reader, load_schema, load_stats
from schemas.parser_codegen import render_parser
from schemas.verify import verify_output

out = Path({out!r})
schema = write_output(out, make_columns(FEATURES, 12), [5, 7])
(out / "parser.py").write_text(render_parser(schema, str(out)))
assert sum(1 for _ in Reader(str(out), split="data")) == 12 == load_schema(str(out)).num_examples("data")
print(load_stats(str(out)) is not None, verify_output(str(out)).records)
try:
    schemas.reassemble(str(out))
except schemas.UserError as error:  # one line, naming the extra to install
    assert str(error).endswith("pip install 'xarray-tfrecords[reassemble]'") and "\\n" not in str(error), error
else:
    raise AssertionError("reassembled without xarray")
"""


def test_the_readers_run_without_the_build(tmp_path):
    """The base install: reading, checking and verifying an output with no Beam, xarray, TensorFlow or PyTorch."""
    code = _READ_WITHOUT_THE_BUILD.format(blocked=_BLOCKED, out=str(tmp_path / "out"))
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["True", "12"]


def test_a_build_without_the_build_extra_says_what_to_install(tmp_path):
    code = f"import sys\nfor name in {_BLOCKED!r}: sys.modules[name] = None\n"
    code += "from pipelines.build import main\nsys.exit(main(['--quiet']))"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, env=env)
    assert result.returncode == 1, result.stderr[-3000:]
    fix = 'install the [build] extra (pip install -e ".[build]")'
    assert result.stderr == f"error: apache_beam is not installed here; {fix}\n"
    assert not list(tmp_path.iterdir())  # no demo data written before it failed


#: As if only [build] were installed (no [gcp] extra): gcsfs, and the Google Cloud clients Beam's GCP support imports
#: (without apitools Beam logs a notice as it is imported). A sitecustomize module blocks them in every process the
#: build starts, Beam's worker processes too.
_WITHOUT_GCP = """
import sys
for name in ["gcsfs", "apitools", "google.cloud.storage"]:
    sys.modules[name] = None
"""


#: Builds in one process (each pays for importing Beam): the demo with worker processes, then four needing [gcp].
_BUILDS_WITHOUT_GCP = """
import json, sys
from pipelines.build import main
flag_sets = json.loads(sys.argv[1])
print(json.dumps([main(["--quiet", *flags]) for flags in flag_sets]))
"""


def test_a_build_without_the_gcp_extra_builds_locally_quietly_and_refuses_gs_paths_in_one_line(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(_WITHOUT_GCP)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(REPO)])}
    probe = subprocess.run([sys.executable, "-c", "import apache_beam"], capture_output=True, text=True, env=env)
    assert "apitools not found" in probe.stderr  # Beam's notice, which a build keeps off the terminal

    refused = {
        "gs://bucket/out": ["--output", "gs://bucket/out"],
        "gs://bucket/era5/*.nc": ["--input", "gs://bucket/era5/*.nc", "--output", "out"],
        "gs://bucket/era5.zarr": ["--input", "gs://bucket/era5.zarr", "--output", "out"],  # a Zarr store
        "--runner=DataflowRunner": ["--output", "out", "--runner=DataflowRunner", "--project=p", "--region=r1"],
    }
    demo = ["--direct_running_mode=multi_processing", "--direct_num_workers=2"]
    command = [sys.executable, "-c", _BUILDS_WITHOUT_GCP, json.dumps([demo, *refused.values()])]
    result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout.splitlines()[-1]) == [0, 2, 2, 2, 2], result.stdout
    assert result.stdout.startswith("No --config given") and (tmp_path / "demo" / "patches" / "schema.json").exists()
    # Nothing else on stderr: no notice from Beam's import, in this process or in its worker processes.
    fix = 'install the [gcp] extra (pip install -e ".[gcp]")'
    assert result.stderr.splitlines() == [
        f"error: {named}: Google Cloud (gs:// paths, Dataflow) is not installed here; {fix}" for named in refused
    ]
    assert not (tmp_path / "out").exists()
