"""One build at a time into an output: locks held for the whole run, released by the system when the process ends.

Both locks are ``flock``s, so a crashed or killed build holds nothing and never leaves a stale lock:

- the output directory itself (local outputs): every build into it meets there, whoever runs it
  and whatever its temp directory ($TMPDIR differs per job under SLURM and PBS);
- a file named after the output in a folder only this user can write,
  ``<temp dir>/xarray-tfrecords-locks-<uid>`` (created 0700; refused unless it is a directory, not
  a link, owned by this user and writable by no one else), opened without following links. It
  says which process holds it, for the refusal, and it is the only lock a gs:// output has. The
  build that holds it removes it as it lets go (a lock taken on a file that was removed meanwhile
  is taken again on the new one), so the folder holds only the locks of builds that run.

Builds into one gs:// output by other users, with other temp directories or on other machines
meet at no lock: each checks before it commits that the output's manifest still names its run
(transforms.finalize), so a build never reports an output that another one replaced.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import os
import re
import socket
import stat
import tempfile
import time
from collections.abc import Iterator

from schemas.errors import UserError
from schemas.urls import is_remote

logger = logging.getLogger(__name__)
#: flock's answers on a filesystem that has no flock (NFS without locking, Lustre without -o flock).
_NO_FLOCK = frozenset({errno.EBADF, errno.EINVAL, errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP})


def _canonical(output: str) -> str:
    if is_remote(output):
        # The same gs:// URL on a storage emulator is another storage (tests run side by side).
        return f"{os.environ.get('STORAGE_EMULATOR_HOST', '')} {output.rstrip('/')}"
    return os.path.realpath(os.path.expanduser(output))


#: The name of a remote run's private temp folder starts so (pipelines.runners.submission_temp_dir). It stands in
#: for the temp directory while the run stages its files, and it is the run's own: a lock in it meets no other build.
SUBMISSION_PREFIX = "xarray-tfrecords-submit-"


def lock_folder() -> str:
    """This user's folder of lock files (in the temp directory, so $TMPDIR moves it; beside a run's submission
    folder, never in it)."""
    temp = tempfile.gettempdir()
    if os.path.basename(temp).startswith(SUBMISSION_PREFIX):
        temp = os.path.dirname(temp)
    return os.path.join(temp, f"xarray-tfrecords-locks-{os.geteuid()}")


def open_private_folder(folder: str, subject: str = "output lock") -> int:
    """A descriptor of ``folder``, created if missing; a UserError unless only this user can write in it."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(folder, 0o700)
    fix = "remove it if it is yours, or set TMPDIR to a directory only you can write"
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as error:
        if error.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise
        raise UserError(f"{subject}: {folder} is not a directory but a link or a file; {fix}") from None
    info = os.fstat(fd)
    problem = None
    if info.st_uid != os.geteuid():
        problem = f"belongs to another user (uid {info.st_uid})"
    elif info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        problem = f"may be written by other users (mode {stat.S_IMODE(info.st_mode):o})"
    if problem:
        os.close(fd)
        raise UserError(f"{subject}: {folder} {problem}; {fix}")
    return fd


_LOCK_NAME = re.compile(r"[0-9a-f]{24}\.lock")


def _lock_name(output: str) -> str:
    return hashlib.sha256(_canonical(output).encode()).hexdigest()[:24] + ".lock"


def _open_user_lock(output: str) -> int:
    """The open lock file of ``output`` in this user's lock folder."""
    folder = lock_folder()
    name = _lock_name(output)
    folder_fd = open_private_folder(folder)
    try:
        # O_NONBLOCK: opening a FIFO planted there must not hang the build.
        flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
        try:
            fd = os.open(name, flags, 0o600, dir_fd=folder_fd)
        except OSError as error:
            if error.errno != errno.ELOOP:
                raise
            raise UserError(f"output lock: {folder}/{name} is a link; remove it") from None
    finally:
        os.close(folder_fd)
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
        os.close(fd)
        raise UserError(f"output lock: {folder}/{name} is not a file of yours; remove it")
    return fd


def _holder(fd: int) -> str:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        holder = json.loads(os.read(fd, 4096) or b"{}")
        started = time.strftime("%H:%M:%S", time.localtime(holder["started"]))
        return f" (process {int(holder['pid'])} on {str(holder['host'])[:64]}, started {started})"
    except (ValueError, KeyError, TypeError, OSError, OverflowError):
        return ""


def _busy(output: str, holder: str = "") -> UserError:
    return UserError(f"output: another build is writing {output}{holder}; wait for it to end, or choose another output")


def _lock_user_file(output: str, required: bool) -> int | None:
    """The lock file of ``output``, open and locked; without ``required``, None if the folder fails its checks."""
    try:
        try:
            fd = _open_user_lock(output)
        except OSError as error:  # e.g. a temp directory this user cannot write
            reason = error.strerror or str(error)
            raise UserError(
                f"output lock: cannot make a lock in {lock_folder()}: {reason.lower()}; "
                "set TMPDIR to a directory of yours"
            ) from None
    except UserError as error:
        if required:
            raise
        logger.warning("%s (the lock on the output directory still holds)", error)
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _holder(fd)
        os.close(fd)
        raise _busy(output, holder) from None
    except BaseException:
        os.close(fd)
        raise
    holder = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time(), "output": output}
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(holder).encode(), 0)
    return fd


def _is_at(fd: int, path: str, dir_fd: int | None = None) -> bool:
    """Whether ``fd`` is still the file at ``path`` (the build that held it may have removed it meanwhile)."""
    opened = os.fstat(fd)
    try:
        current = os.stat(path, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return (opened.st_dev, opened.st_ino) == (current.st_dev, current.st_ino)


def _take_user_lock(output: str, required: bool) -> tuple[int, str] | None:
    """Lock ``output`` in this user's lock folder: the lock's descriptor and path; without ``required``, None where
    the folder fails its checks."""
    path = os.path.join(lock_folder(), _lock_name(output))
    for _ in range(10):
        fd = _lock_user_file(output, required)
        if fd is None:
            return None
        if _is_at(fd, path):
            _remove_stale_locks(os.path.dirname(path))
            return fd, path
        os.close(fd)  # locked a file its holder removed as it let go: lock the one at the name now
    raise _busy(output)


def _remove_stale_locks(folder: str) -> None:
    """Remove the lock files in this user's private ``folder`` that no build holds (earlier versions left one per
    output ever built)."""
    try:
        folder_fd = open_private_folder(folder)
    except (UserError, OSError):
        return
    try:
        for entry in os.scandir(folder_fd):
            if not _LOCK_NAME.fullmatch(entry.name) or not entry.is_file(follow_symlinks=False):
                continue
            with contextlib.suppress(OSError):  # BlockingIOError: a build holds it
                fd = os.open(entry.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=folder_fd)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    if _is_at(fd, entry.name, folder_fd):
                        os.unlink(entry.name, dir_fd=folder_fd)
                finally:
                    os.close(fd)
    finally:
        os.close(folder_fd)


def _release_user_lock(fd: int, path: str) -> None:
    """Remove the lock file while it is still locked (whoever locks it next sees it gone), then let go."""
    try:
        if _is_at(fd, path):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
    finally:
        os.close(fd)


def _make_directories(path: str) -> list[str]:
    """Create ``path`` and its missing parents; returns those it created, deepest first."""
    missing = []
    parent = os.path.abspath(path)
    while not os.path.lexists(parent):
        missing.append(parent)
        parent = os.path.dirname(parent)
    if os.path.lexists(path) and not os.path.isdir(path):
        raise UserError(f"output: {path} is an existing file; choose a directory path for the output")
    if missing and not os.path.isdir(parent):
        raise UserError(f"output: {path}: {parent} is a file, not a folder; choose an output path inside a folder")
    os.makedirs(path, exist_ok=True)  # (its other errors, a read-only disk, ...: one line each, as any OSError)
    return missing


def _take_directory_lock(output: str) -> int | None:
    """Lock the output directory itself; None where its filesystem has no flock."""
    for _ in range(10):
        fd = os.open(output, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise _busy(output) from None
        except OSError as error:
            os.close(fd)
            if error.errno not in _NO_FLOCK:
                raise
            logger.info("%s: no flock on this filesystem (%s); only this user's builds are kept apart", output, error)
            return None
        except BaseException:
            os.close(fd)
            raise
        opened, current = os.fstat(fd), os.stat(output)
        if (opened.st_dev, opened.st_ino) == (current.st_dev, current.st_ino):
            return fd
        os.close(fd)  # the directory was replaced between the open and the lock: lock the new one
    raise UserError(f"output: {output} keeps being replaced; wait for whatever replaces it to end")


@contextlib.contextmanager
def output_lock(output: str) -> Iterator[None]:
    """Hold the locks on ``output`` until the block ends; refuse in one line if another build holds one."""
    remote = is_remote(output)
    held: list[int] = []
    created: list[str] = []
    user_lock = None
    try:
        user_lock = _take_user_lock(output, required=remote)
        if not remote:
            created = _make_directories(output)
            directory_fd = _take_directory_lock(output)
            if directory_fd is not None:
                held.append(directory_fd)
        yield
    finally:
        # Before the locks go: a build that wrote nothing leaves no empty directory behind.
        for directory in created:
            with contextlib.suppress(OSError):
                os.rmdir(directory)
        for fd in held:
            os.close(fd)  # releases the lock
        if user_lock is not None:
            _release_user_lock(*user_lock)
