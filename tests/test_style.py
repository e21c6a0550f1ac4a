"""The code is ruff-clean and formatted, and the packages import in the declared direction."""

from __future__ import annotations

import ast
import re
import subprocess
import sys

import pytest

from conftest import REPO

LAYERS = ["schemas", "transforms", "pipelines"]  # each may import only those before it


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
    if layer == "schemas":
        for path in (REPO / layer).glob("*.py"):
            assert not re.search(r"^\s*(import|from) apache_beam", path.read_text(), re.M), path.name


def test_dockerfile_uses_the_pinned_beam_version():
    setup = (REPO / "setup.py").read_text()
    pinned = re.search(r'BEAM_VERSION = "([^"]+)"', setup).group(1)
    image = re.search(r"^FROM apache/beam_python3\.11_sdk:(\S+)$", (REPO / "Dockerfile").read_text(), re.M).group(1)
    assert image == pinned
