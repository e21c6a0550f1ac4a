"""The lock that keeps builds apart: where only its user can write, never through a link, met whatever $TMPDIR says."""

from __future__ import annotations

import hashlib
import os
import stat
import tempfile
from pathlib import Path

import pytest

from pipelines.output_lock import lock_folder, output_lock
from schemas.errors import UserError


def _take(output: str) -> None:
    """Take the lock and let it go, as a build that ends at once."""
    with output_lock(output):
        pass


@pytest.fixture
def temp_dir(tmp_path, monkeypatch):
    """Point the temp directory elsewhere, as $TMPDIR does (SLURM and PBS set one per job)."""

    def point(name: str) -> Path:
        directory = tmp_path / name
        directory.mkdir(exist_ok=True)
        monkeypatch.setattr(tempfile, "tempdir", str(directory))
        return directory

    return point


@pytest.fixture
def victim(tmp_path) -> Path:
    """A file of someone else's that a planted link points at."""
    path = tmp_path / "victim" / ".bashrc"
    path.parent.mkdir()
    path.write_text("export PATH=~/bin:$PATH\n")
    return path


def test_a_link_planted_in_a_shared_lock_folder_is_never_written_through(tmp_path, temp_dir, victim):
    """Another local user plants the lock's predictable name in a folder everyone may write (as the old one was)."""
    tmp = temp_dir("tmp")
    output = tmp_path / "out"
    digest = hashlib.sha256(os.path.realpath(output).encode()).hexdigest()[:24]
    shared = tmp / "xarray-tfrecords-locks"
    shared.mkdir()
    shared.chmod(0o1777)
    (shared / f"{digest}.lock").symlink_to(victim)
    _take(str(output))
    assert victim.read_text() == "export PATH=~/bin:$PATH\n"
    folder = Path(lock_folder())
    assert folder.parent == tmp and stat.S_IMODE(folder.lstat().st_mode) == 0o700
    assert {stat.S_IMODE(p.stat().st_mode) for p in folder.iterdir()} == {0o600}


@pytest.mark.parametrize("planted", ["open to all", "a link", "another user's"])
def test_a_lock_folder_others_can_write_is_refused(tmp_path, temp_dir, victim, planted, caplog):
    temp_dir("tmp")
    folder = Path(lock_folder())
    if planted == "a link":
        folder.symlink_to(victim.parent, target_is_directory=True)
    else:
        folder.mkdir(mode=0o700)
        if planted == "open to all":
            folder.chmod(0o777)
        else:
            os.chown(folder, 4321, 4321) if os.geteuid() == 0 else pytest.skip("needs root to give a folder away")
    before = sorted(victim.parent.iterdir())
    # A gs:// output has no other lock: refused in one line that names the folder and a fix that works.
    with pytest.raises(UserError, match=f"^output lock: {folder} .*; remove it if it is yours, or set TMPDIR"):
        _take("gs://bucket/out")
    # A local output is still locked by its directory: the build goes on, with a warning.
    output = str(tmp_path / "out")
    with output_lock(output), pytest.raises(UserError, match="another build is writing"):
        _take(output)
    assert str(folder) in caplog.text
    assert sorted(victim.parent.iterdir()) == before and victim.read_text().startswith("export")


def test_a_link_in_the_users_own_lock_folder_is_not_followed(tmp_path, temp_dir, victim):
    temp_dir("tmp")
    _take("gs://bucket/out")
    (lock,) = Path(lock_folder()).iterdir()
    lock.unlink()
    lock.symlink_to(victim)
    with pytest.raises(UserError, match=f"^output lock: {lock} is a link; remove it$"):
        _take("gs://bucket/out")
    assert victim.read_text() == "export PATH=~/bin:$PATH\n"


def test_builds_with_different_temp_dirs_meet_at_the_output(tmp_path, temp_dir):
    output = str(tmp_path / "out")
    temp_dir("job-1")
    with output_lock(output):
        with pytest.raises(UserError, match=f"another build is writing {output} \\(process {os.getpid()} on "):
            _take(output)  # the same user and temp dir: the holder is named
        temp_dir("job-2")
        with pytest.raises(UserError, match=f"^output: another build is writing {output}; wait for it to end"):
            _take(output)
    _take(output)  # released with the first


def test_the_lock_leaves_no_directory_it_made_for_a_build_that_wrote_nothing(tmp_path, temp_dir):
    temp_dir("tmp")
    with output_lock(str(tmp_path / "new" / "out")):
        assert (tmp_path / "new" / "out").is_dir()
    assert not (tmp_path / "new").exists()
    (tmp_path / "file").write_text("x")
    with pytest.raises(UserError, match="is an existing file; choose a directory path"):
        _take(str(tmp_path / "file"))


def test_a_temp_dir_where_no_lock_can_be_made_is_one_line(tmp_path, monkeypatch, caplog):
    (tmp_path / "a-file").write_text("x")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "a-file"))  # as a $TMPDIR set wrong
    with pytest.raises(UserError, match=r"^output lock: cannot make a lock in .*a-file/.*; set TMPDIR to a directory"):
        _take("gs://bucket/out")
    _take(str(tmp_path / "out"))  # a local output has its directory's lock
    assert "cannot make a lock" in caplog.text
