"""Start-up rows time a user's second run: the project's modules compiled to bytecode first, as Python caches them."""

from __future__ import annotations

import compileall
import importlib.util
import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("pipelines", "planning", "schemas", "transforms")


def cache_project_bytecode() -> dict:
    """Compile the project's packages into their ``__pycache__``; say whether the installed packages hold bytecode.

    An interpreter writes these files at its first import, unless ``PYTHONDONTWRITEBYTECODE`` is set
    (it is on some CI machines and containers): then every run compiles the project's ~20,000 lines
    again (about 0.3 s), which no user's second run pays. ``pip install`` compiles what it installs;
    ``uv pip install`` only with ``--compile-bytecode``: without, every start-up also compiles Beam.
    """
    compiled = all(compileall.compile_dir(REPO / name, quiet=1) for name in PACKAGES)
    beam = importlib.util.find_spec("apache_beam")
    installed = beam is not None and beam.origin is not None and (Path(beam.origin).parent / "__pycache__").is_dir()
    return {
        "project_compiled": compiled,
        "installed_compiled": installed,
        "dont_write_bytecode": bool(os.environ.get("PYTHONDONTWRITEBYTECODE")),
    }


def note(state: dict) -> str:
    """One line under the header: what bytecode every fresh interpreter of the run found."""
    line = "bytecode: the project's modules compiled before the runs (a user's second run)"
    if state.get("dont_write_bytecode"):
        line += "; PYTHONDONTWRITEBYTECODE is set here, so no run caches anything itself"
    if not state.get("installed_compiled"):
        line += "; WARNING: the installed packages hold no bytecode (uv pip without --compile-bytecode?):"
        line += " every row above includes compiling Beam"
    return line
