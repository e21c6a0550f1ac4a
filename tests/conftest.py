"""Shared fixtures: the real sample files, small synthetic archives, and quiet TensorFlow."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, str(Path(__file__).parent))

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("XTF_SHARED_DATA", REPO.parent / "shared" / "data"))
ERAINT = "eraint_uvz.nc"  # no licence: never committed; from SHARED_DATA when there, else a stand-in


def real_eraint() -> Path | None:
    """The real ERA-Interim file in SHARED_DATA (../shared/data or $XTF_SHARED_DATA), if it is there."""
    path = SHARED_DATA / ERAINT
    return path if path.exists() else None


def shared_file(name: str) -> Path:
    path = SHARED_DATA / name
    if not path.exists():
        pytest.fail(f"sample data {path} is missing: the tests expect ../shared/data beside the checkout")
    return path


@pytest.fixture(scope="session")
def small_archive(tmp_path_factory) -> Path:
    """A synthetic ERA5-like archive: 3 files x 4 steps, 3 levels, 20 x 24 grid."""
    from pipelines.demo import ArchiveShape, write_archive

    directory = tmp_path_factory.mktemp("archive")
    write_archive(directory, ArchiveShape(num_files=3, steps_per_file=4, levels=3, lat=20, lon=24), seed=1)
    return directory
