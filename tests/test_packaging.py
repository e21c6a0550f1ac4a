"""What the package ships: the code, not the test data (workers get the sdist with --setup_file)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
import zipfile

from conftest import REPO, VENDORED_DATA


def test_sdist_and_wheel_ship_no_test_data(tmp_path):
    assert sorted(p.name for p in VENDORED_DATA.glob("*.nc")), "tests/data has no sample files"
    source = tmp_path / "src"  # a copy: building in the checkout would leave build/ and egg-info behind
    source.mkdir()
    for name in ("setup.py", "pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    for folder in ("pipelines", "transforms", "planning", "schemas", "tests"):
        shutil.copytree(REPO / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__"))
    command = [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(tmp_path / "dist"), str(source)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (sdist,) = (tmp_path / "dist").glob("*.tar.gz")
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    with tarfile.open(sdist) as tar:
        names = tar.getnames()
    with zipfile.ZipFile(wheel) as whl:
        names += whl.namelist()
    assert any(n.endswith("schemas/parser_template.py") for n in names)  # package data still ships
    shipped = [n for n in names if n.endswith(".nc") or "tests/data" in n or "geocat" in n.lower()]
    assert not shipped, shipped
