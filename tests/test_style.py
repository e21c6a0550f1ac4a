"""The code is ruff-clean and formatted, and the packages import in the declared direction."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys

import pytest

from conftest import REPO

LAYERS = ["schemas", "planning", "transforms", "pipelines"]  # each may import only those before it


@pytest.mark.parametrize("command", [["check", "."], ["format", "--check", "."]])
def test_ruff(command):
    result = subprocess.run([sys.executable, "-m", "ruff", *command], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("layer", LAYERS)
def test_dependencies_point_one_way(layer):
    allowed = set(LAYERS[: LAYERS.index(layer) + 1])
    for path in (REPO / layer).glob("*.py"):
        tree = ast.parse(path.read_text())
        assert ast.get_docstring(tree), f"{path.name} has no module docstring"
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                top = name.split(".")[0]
                assert top not in set(LAYERS) - allowed, f"{path.name} imports {name}"
    if layer in ("schemas", "planning"):
        for path in (REPO / layer).glob("*.py"):
            assert not re.search(r"^\s*(import|from) apache_beam", path.read_text(), re.M), path.name


def _defines_ptransform(tree: ast.Module) -> bool:
    return any(
        isinstance(node, ast.ClassDef) and any(ast.unparse(base) == "beam.PTransform" for base in node.bases)
        for node in tree.body
    )


def test_every_module_in_transforms_is_a_beam_stage():
    modules = [path for path in (REPO / "transforms").glob("*.py") if path.name != "__init__.py"]
    assert modules
    for path in modules:
        assert _defines_ptransform(ast.parse(path.read_text())), f"transforms/{path.name} defines no PTransform"


def test_importing_the_packages_changes_nothing_process_wide():
    """No coder registered and no library patched at import: that happens when a graph is built or run."""
    code = (
        "import importlib, pathlib, apache_beam as beam, xarray as xr\n"
        "from apache_beam.internal.gcp import auth\n"
        "coders = dict(beam.coders.registry._coders)\n"
        "before = getattr(auth, '_Credentials', None) and auth._Credentials._credentials_init\n"
        "for package in ('schemas', 'planning', 'transforms', 'pipelines'):\n"
        "    for path in sorted(pathlib.Path(package).glob('*.py')):\n"
        "        importlib.import_module(f'{package}.{path.stem}')\n"
        "assert dict(beam.coders.registry._coders) == coders, 'a coder was registered at import'\n"
        "after = getattr(auth, '_Credentials', None) and auth._Credentials._credentials_init\n"
        "assert before == after, 'credentials were patched at import'\n"
    )
    env = {**os.environ, "STORAGE_EMULATOR_HOST": "http://127.0.0.1:9"}
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
