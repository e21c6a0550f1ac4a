"""The lock that keeps builds apart: where only its user can write, never through a link, met whatever $TMPDIR says."""

from __future__ import annotations

import fcntl
import hashlib
import os
import stat
import tempfile
from pathlib import Path

import pytest

from pipelines import output_lock as output_lock_module
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
    with output_lock(str(output)):
        folder = Path(lock_folder())
        assert {stat.S_IMODE(p.stat().st_mode) for p in folder.iterdir()} == {0o600}
    assert victim.read_text() == "export PATH=~/bin:$PATH\n"
    assert folder.parent == tmp and stat.S_IMODE(folder.lstat().st_mode) == 0o700


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
    with output_lock("gs://bucket/out"):
        (lock,) = Path(lock_folder()).iterdir()
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


def test_the_lock_file_goes_with_its_build_and_stale_ones_are_removed(tmp_path, temp_dir, victim):
    """Earlier versions left a lock file per output ever built (10,000 on one machine): none is left now."""
    temp_dir("tmp")
    folder = Path(lock_folder())
    with output_lock(str(tmp_path / "first")):
        (held,) = folder.iterdir()
        with pytest.raises(UserError, match="another build is writing"):
            _take(str(tmp_path / "first"))
    assert not held.exists()
    stale = [folder / f"{i:024x}.lock" for i in range(3)]
    for path in stale:
        path.write_text("")
    (folder / "notes.txt").write_text("not a lock")
    (folder / f"{7:024x}.lock").symlink_to(victim)  # a link is neither followed nor removed
    other = folder / f"{9:024x}.lock"
    other.write_text("")
    with open(other) as running:  # held by a build that runs (another open file: flock is per open file)
        fcntl.flock(running, fcntl.LOCK_EX)
        _take(str(tmp_path / "second"))
        assert sorted(p.name for p in folder.iterdir()) == sorted(["notes.txt", f"{7:024x}.lock", other.name])
    assert victim.read_text() == "export PATH=~/bin:$PATH\n"


def test_a_lock_removed_by_its_holder_after_it_was_opened_is_taken_again(tmp_path, temp_dir, monkeypatch):
    """The race the removal opens: a build opens the file, the holder removes it and lets go, the build locks it."""
    temp_dir("tmp")
    output = str(tmp_path / "out")
    opened = []
    lock_user_file = output_lock_module._lock_user_file

    def opened_before_the_holder_let_go(*args):
        fd = lock_user_file(*args)
        if not opened:  # the first one: the holder removes it now (this build already locked it: no holder left)
            os.unlink(os.path.join(lock_folder(), os.listdir(lock_folder())[0]))
        opened.append(os.fstat(fd).st_ino)
        return fd

    monkeypatch.setattr(output_lock_module, "_lock_user_file", opened_before_the_holder_let_go)
    with output_lock(output):
        (lock,) = Path(lock_folder()).iterdir()
        assert len(opened) == 2 and lock.stat().st_ino == opened[1]
        with pytest.raises(UserError, match="another build is writing"):
            _take(output)


def test_a_remote_run_meets_the_lock_of_other_builds_from_inside_its_submission_folder(temp_dir):
    """A remote run's temp directory is its own folder while it stages its files: its lock used to be made in it,
    where no other build (a local run writing to the same gs:// output, another launcher) ever met it."""
    from apache_beam.options.pipeline_options import PipelineOptions

    from pipelines.runners import submission_temp_dir

    temp = temp_dir("tmp")
    output = "gs://xtf-test/shared-out"
    # A local run writing to the output holds the lock; a Dask run into it starts.
    with output_lock(output), submission_temp_dir(PipelineOptions(["--runner=DaskRunner"])):
        assert Path(tempfile.gettempdir()).parent == temp  # (the run's own folder, as Beam stages there)
        assert Path(lock_folder()).parent == temp
        with pytest.raises(UserError, match=r"^output: another build is writing gs://xtf-test/shared-out"):
            _take(output)
    assert sorted(p.name for p in temp.iterdir()) == [f"xarray-tfrecords-locks-{os.geteuid()}"]
