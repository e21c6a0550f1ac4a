"""Telling remote URLs (gs://, s3://, any fsspec protocol) from local paths; refusing local paths that are no files."""

import os
import stat

from schemas.errors import UserError


def is_remote(path: str) -> bool:
    """True for URLs such as gs://bucket/path; False for local paths and file:// URLs."""
    return "://" in path and not path.startswith("file://")


#: What a path that is neither a file nor a directory is, for the message that refuses it.
SPECIAL_FILES = (
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


def special_kind(mode: int) -> str | None:
    """What a stat's mode is when it is neither a regular file nor a directory ("a FIFO", ...); else None."""
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    return next((name for test, name in SPECIAL_FILES if test(mode)), "a special file")


def check_regular_file(url: str, fix: str = "build the output again") -> None:
    """Refuse a local path that exists but is not a regular file, from its stat alone, before it is opened:
    opening a FIFO blocks until something writes to it, i.e. for ever, and a device reads without end.

    A missing path passes (opening it raises the reader's own FileNotFoundError message); remote URLs pass.
    """
    if is_remote(url):
        return
    try:
        mode = os.stat(url.removeprefix("file://")).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return
    if not stat.S_ISREG(mode):
        kind = special_kind(mode) or "a directory"
        raise UserError(f"{url}: not a regular file ({kind}); {fix}")
