"""What the package ships (the code, not the test data) and what it asks for (ranges that admit the tested set)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tarfile
import zipfile

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from conftest import REPO, VENDORED_DATA


@pytest.fixture(scope="module")
def dists(tmp_path_factory):
    """The sdist and the wheel, built offline from a copy of the checkout (workers get the sdist with --setup_file)."""
    tmp_path = tmp_path_factory.mktemp("dists")
    source = tmp_path / "src"  # a copy: building in the checkout would leave build/ and egg-info behind
    source.mkdir()
    for name in ("setup.py", "pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    packages = re.findall(r'"(\w+)"', re.search(r"packages=\[([^\]]*)\]", (REPO / "setup.py").read_text()).group(1))
    for folder in (*packages, "tests"):
        shutil.copytree(REPO / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__"))
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
    shipped = [n for n in names if n.endswith(".nc") or "tests/data" in n or "geocat" in n.lower()]
    assert not shipped, shipped


def _tested_set() -> dict[str, list[Requirement]]:
    """constraints.txt: each package's exact pins (one per Python where they differ)."""
    pins: dict[str, list[Requirement]] = {}
    for line in (REPO / "constraints.txt").read_text().splitlines():
        if line.split("#")[0].strip():
            requirement = Requirement(line)
            pins.setdefault(canonicalize_name(requirement.name), []).append(requirement)
    return pins


def test_the_ranges_asked_for_admit_the_tested_set(dists):
    """Ranges, not pins, in the package (it joins users' environments), and each admits what CI installs."""
    _, wheel = dists
    with zipfile.ZipFile(wheel) as whl:
        metadata = whl.read(next(n for n in whl.namelist() if n.endswith(".dist-info/METADATA"))).decode()
    asked = [Requirement(line.split(":", 1)[1]) for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
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
    assert re.search(r"pip install .*-c constraints\.txt", dockerfile)
    assert re.search(r"^COPY .*constraints\.txt", dockerfile, re.M)
