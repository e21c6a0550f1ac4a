"""Shared fixtures: the real sample files (or a stand-in), small synthetic archives, and quiet TensorFlow."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, str(Path(__file__).parent))

REPO = Path(__file__).resolve().parents[1]
VENDORED_DATA = REPO / "tests" / "data"  # NCAR/geocat-datafiles samples (Apache-2.0): see tests/data/README.md
SHARED_DATA = Path(os.environ.get("XTF_SHARED_DATA", REPO.parent / "shared" / "data"))
ERAINT = "eraint_uvz.nc"  # no licence: never committed; from SHARED_DATA when there, else a stand-in


def real_eraint() -> Path | None:
    """The real ERA-Interim file in SHARED_DATA (../shared/data or $XTF_SHARED_DATA), if it is there."""
    path = SHARED_DATA / ERAINT
    return path if path.exists() else None


@pytest.fixture(scope="session")
def sample_file(tmp_path_factory):
    """`sample_file(name)`: the path of a sample file, wherever this checkout has it.

    The NCAR files come from tests/data (vendored), else SHARED_DATA; `eraint_uvz.nc` comes from
    SHARED_DATA when present, else from a stand-in with the same layout and quirks, generated once
    per session (tests/standin.py).
    """
    standin: list[Path] = []

    def resolve(name: str) -> Path:
        if name == ERAINT:
            if real := real_eraint():
                return real
            if not standin:
                from standin import write_eraint_standin

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
