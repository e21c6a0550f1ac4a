"""The code is ruff-clean and formatted, and the packages import in the declared direction."""

from __future__ import annotations

import ast
import graphlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO

LAYERS = ["schemas", "planning", "transforms", "pipelines"]  # each may import only those before it
#: planning's wings, each importing only those before it; "" is the plan itself (planning/*.py).
WINGS = ["run", "formats", "inputs", "config", "reads", ""]
#: Every package of the checkout, each free of import cycles (a module importing itself round a loop, lazily too).
PACKAGES = [*LAYERS, "benchmarks"]


@pytest.mark.parametrize("command", [["check", "."], ["format", "--check", "."]])
def test_ruff(command):
    result = subprocess.run([sys.executable, "-m", "ruff", *command], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("layer", LAYERS)
def test_dependencies_point_one_way(layer):
    allowed = set(LAYERS[: LAYERS.index(layer) + 1])
    for path in (REPO / layer).rglob("*.py"):
        tree = ast.parse(path.read_text())
        assert ast.get_docstring(tree), f"{path.relative_to(REPO)} has no module docstring"
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                top = name.split(".")[0]
                assert top not in set(LAYERS) - allowed, f"{path.relative_to(REPO)} imports {name}"
    if layer in ("schemas", "planning"):
        for path in (REPO / layer).rglob("*.py"):
            assert not re.search(r"^\s*(import|from) apache_beam", path.read_text(), re.M), path.relative_to(REPO)


def _module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def planning_imports(root: Path) -> dict[str, set[str]]:
    """Each module under ``root`` (a package's tree) -> the modules of that tree it imports, wherever the import
    stands (inside a function or behind TYPE_CHECKING too)."""
    modules = {_module_name(path, root): path for path in sorted(root.rglob("*.py"))}
    graph = {}
    for name, path in modules.items():
        graph[name] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level:
                raise AssertionError(f"{name} imports relatively: write the full <package>.<module> path")
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                # `from planning.formats import sources` imports the module planning.formats.sources.
                targets = [f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in modules]
                targets = targets or [node.module]
            else:
                continue
            graph[name] |= {target for target in targets if target in modules and target != name}
    return graph


def wing_of(module: str) -> str:
    """The wing a planning module lives in: its subpackage, or "" for the plan (planning/*.py)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in WINGS) else ""


def wing_violations(graph: dict[str, set[str]]) -> list[str]:
    """Imports that point up or sideways out of a wing: each wing may import only its own and those before it."""
    assert all(wing_of(module) in WINGS for module in graph), "a planning subpackage is missing from WINGS"
    return sorted(
        f"{module} ({wing_of(module) or 'plan'}) imports {target} ({wing_of(target) or 'plan'})"
        for module, targets in graph.items()
        for target in targets
        if WINGS.index(wing_of(target)) > WINGS.index(wing_of(module))
    )


def import_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    try:
        tuple(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as error:
        return error.args[1]
    return None


def test_planning_wings_import_only_those_below():
    """formats know no archive and no plan; the plan is the only wing that imports reads."""
    assert wing_violations(planning_imports(REPO / "planning")) == []


@pytest.mark.parametrize("package", PACKAGES)
def test_no_package_has_an_import_cycle(package):
    """What a limit on modules per folder stood for: modules split by job, importing downwards, never in a loop
    (imports inside functions and behind TYPE_CHECKING count: a lazy import still ties the two modules)."""
    assert import_cycle(planning_imports(REPO / package)) is None


def test_the_wing_rules_catch_an_upward_import_and_a_cycle_behind_type_checking(tmp_path):
    planning = tmp_path / "planning"
    (planning / "formats").mkdir(parents=True)
    (planning / "formats" / "__init__.py").write_text('"""Bytes."""\n')
    (planning / "formats" / "reader.py").write_text(
        "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from planning.features import Plan\n"
    )
    (planning / "features.py").write_text("from planning.formats import reader\n")
    graph = planning_imports(planning)
    assert graph["planning.features"] == {"planning.formats.reader"}
    assert wing_violations(graph) == ["planning.formats.reader (formats) imports planning.features (plan)"]
    assert set(import_cycle(graph)) == {"planning.features", "planning.formats.reader"}
    (planning / "formats" / "relative.py").write_text("from . import reader\n")
    with pytest.raises(AssertionError, match="relatively"):
        planning_imports(planning)


def _defines_ptransform(tree: ast.Module) -> bool:
    return any(
        isinstance(node, ast.ClassDef) and any(ast.unparse(base) == "beam.PTransform" for base in node.bases)
        for node in tree.body
    )


#: transforms' modules that are no stage: the file helpers the stages and the driver share.
TRANSFORMS_HELPERS = {"files.py", "bulk_files.py"}


def test_every_module_in_transforms_is_a_beam_stage():
    """A stage's internals live in a subpackage beside it (transforms/buckets/)."""
    modules = [
        path for path in (REPO / "transforms").glob("*.py") if path.name not in {"__init__.py", *TRANSFORMS_HELPERS}
    ]
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
        "    for path in sorted(pathlib.Path(package).rglob('*.py')):\n"
        "        importlib.import_module('.'.join(path.with_suffix('').parts).removesuffix('.__init__'))\n"
        "assert dict(beam.coders.registry._coders) == coders, 'a coder was registered at import'\n"
        "after = getattr(auth, '_Credentials', None) and auth._Credentials._credentials_init\n"
        "assert before == after, 'credentials were patched at import'\n"
    )
    env = {**os.environ, "STORAGE_EMULATOR_HOST": "http://127.0.0.1:9"}
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr[-2000:]


#: What starts a process, by the name a module uses it by (a module's, or one of its attributes).
PROCESS_MODULES = {"subprocess", "multiprocessing"}
PROCESS_NAMES = {"sys.executable", "os.fork", "os.forkpty", "os.system", "os.posix_spawn", "os.popen"}
PROCESS_NAMES |= {"concurrent.futures.ProcessPoolExecutor", "concurrent.futures.process"}


def _process_starts(source: str) -> list[str]:
    """Where ``source`` imports or names something that starts a process: "line: name" each."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            names = [f"{node.value.id}.{node.attr}"]
        else:
            continue
        found += [f"{node.lineno}: {n}" for n in names if n.split(".")[0] in PROCESS_MODULES or n in PROCESS_NAMES]
    return found


def test_unit_tests_name_nothing_that_starts_a_process():
    """tests/unit holds pure functions in this process; what starts one goes in tests/process. (As they run, a unit
    test that starts one anyway, through a fixture or a library, fails: tests/process_guard.py.)"""
    found = [
        f"{path.relative_to(REPO)}:{where}"
        for path in sorted((REPO / "tests" / "unit").glob("*.py"))
        for where in _process_starts(path.read_text())
    ]
    assert not found, found


def test_the_process_checks_catch_a_subprocess_a_pool_and_a_fork():
    source = "import subprocess\nfrom concurrent.futures import ProcessPoolExecutor\nimport os\nos.fork()\nos.getpid()"
    assert _process_starts(source) == ["1: subprocess", "2: concurrent.futures.ProcessPoolExecutor", "4: os.fork"]
    import multiprocessing

    from process_guard import no_process_started

    test = "tests/unit/test_pure.py::test_f"
    with no_process_started(test):
        os.getpid()  # nothing started: nothing said
    said = r"test_f started a process \(subprocess.Popen \[.*move it to tests/process"
    with pytest.raises(AssertionError, match=said), no_process_started(test):
        subprocess.run([sys.executable, "-c", "pass"], check=True)
    child = multiprocessing.get_context("fork").Process(target=os.getpid)
    with pytest.raises(AssertionError, match=r"process \(multiprocessing Fork"), no_process_started(test):
        child.start()
    child.join()
