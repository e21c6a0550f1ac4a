"""What both commands share: turning a failure into one line and an exit code, and the dropped-samples line."""

from __future__ import annotations

import errno
import gc
import importlib.util
import logging
import re
import sys
import traceback
from collections.abc import Mapping

from schemas.errors import UserError

EXIT_FAILED = 1  # something went wrong that the message describes (or a check failed)
EXIT_USER_ERROR = 2  # bad input or configuration: the message names it and the fix
EXIT_INTERRUPTED = 130  # Ctrl-C (128 + SIGINT), as shells report it
EXIT_TERMINATED = 143  # SIGTERM (128 + 15)


class _WithoutBeamsBigQueryNotice(logging.Filter):
    """Drops what Beam logs on the root logger as it is imported without its GCP extras (the [build] install): that
    BigQuery's client is missing, which no build uses (gs:// and Dataflow ask for the [gcp] extra in one line)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.name == "root" and str(record.msg).startswith("apitools not found"))


BEAMS_BIGQUERY_NOTICE = _WithoutBeamsBigQueryNotice()


def configure_logging(verbose: bool) -> None:
    """Warnings (everything with ``verbose``) on stderr, one line each; Beam's own only with ``verbose``.

    Before Beam is imported: a root logger with a handler keeps Beam's import-time notice from configuring logging.
    """
    level = logging.INFO if verbose else logging.WARNING
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger().addFilter(BEAMS_BIGQUERY_NOTICE)
    if not verbose:
        # Beam logs worker failures as walls of text; the failure comes back as an exception,
        # which is reported in one line.
        logging.getLogger("apache_beam").setLevel(logging.CRITICAL)


def user_error_message(error: BaseException) -> str | None:
    """The one-line message of a UserError raised anywhere, including inside a Beam worker."""
    message = next((str(cause) for cause in _chain(error) if isinstance(cause, UserError)), None)
    if message is None:
        # Worker processes send their exceptions back as text; ours follows the type name.
        marker = f"{UserError.__name__}: "
        text = str(error)
        if marker not in text:
            return None
        message = text.split(marker, 1)[1].splitlines()[0]
    return re.sub(r" \[while running '[^']*'\]$", "", message.strip())


#: What to do when the machine, not the input, fails a build.
_ENVIRONMENT_FIXES = {
    errno.ENOSPC: "free some space, or write the output elsewhere ({flag})",
    errno.EDQUOT: "a disk quota is full: free some space, or write the output elsewhere ({flag})",
    errno.EACCES: "make it writable, or write the output elsewhere ({flag})",
    errno.EPERM: "make it writable, or write the output elsewhere ({flag})",
    errno.EROFS: "the filesystem is read-only: write the output elsewhere ({flag})",
    errno.EMFILE: "too many open files: raise the limit (ulimit -n)",
}
#: A worker's exception comes back as the text of its traceback; its last line names it.
_EXCEPTION_LINE = re.compile(r"^(?P<type>[A-Za-z_][\w.]*): (?P<message>.*)$")
_OS_ERROR = re.compile(r"\[Errno (?P<errno>\d+)\] (?P<reason>[^:]+)(?:: '(?P<path>[^']*)')?")
#: Error lines are capped: a message may quote a value of any size.
MAX_LINE = 500


#: Modules an install without extras lacks (setup.py: the base install is the readers), and the extra with them.
_BUILD_MODULES = "apache_beam xarray netCDF4 h5netcdf h5py cftime zarr numcodecs pandas pydantic yaml regex"
_EXTRA_OF_MODULE = {
    **dict.fromkeys([*_BUILD_MODULES.split(), "matplotlib", "dask", "distributed"], "build"),
    "gcsfs": "gcp",
    "tensorflow": "tf",
    "torch": "torch",
    **dict.fromkeys(["cfgrib", "eccodes", "gribapi"], "grib"),
    **dict.fromkeys(["kerchunk", "fastparquet"], "virtual"),
    "icechunk": "icechunk",
}


def _missing_extra(error: BaseException) -> tuple[str, str] | None:
    """(module, extra) when the failure is a module that one of this package's extras installs."""
    for cause in _chain(error):
        if isinstance(cause, ModuleNotFoundError) and cause.name:
            module = cause.name.split(".")[0]
            # A missing part of an installed package (numcodecs.zfpy) is no extra's to give.
            if module in _EXTRA_OF_MODULE and importlib.util.find_spec(module) is None:
                return module, _EXTRA_OF_MODULE[module]
    return None


def _innermost(error: BaseException) -> tuple[str, str]:
    """The failing exception's type and message, found in a worker's traceback text when that is all there is."""
    for cause in _chain(error):
        if isinstance(cause, OSError) and cause.errno in _ENVIRONMENT_FIXES:
            return type(cause).__name__, str(cause)
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    if len(lines) > 1 and lines[0].startswith("Traceback"):
        last = re.sub(r" \[while running '[^']*'\]$", "", lines[-1])
        while (match := _EXCEPTION_LINE.match(last)) and _EXCEPTION_LINE.match(match["message"]):
            last = match["message"]  # RuntimeError: OSError: ... -> OSError: ...
        if match := _EXCEPTION_LINE.match(last):
            return match["type"], match["message"]
    return type(error).__name__, lines[0] if lines else ""


def _chain(error: BaseException):
    seen = set()
    cause: BaseException | None = error
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        yield cause
        cause = cause.__cause__ or cause.__context__


def _capped(line: str) -> str:
    return line if len(line) <= MAX_LINE else line[: MAX_LINE - 3] + "..."


def report_failure(
    error: BaseException, verbose: bool, subject: str = "", output: str = "", flag: str = "--output"
) -> int:
    """Print a failure as one ``error:`` line (after the traceback with ``verbose``); returns the exit code.

    ``subject`` (e.g. the output path) prefixes a failure that is not a UserError; ``output``
    names where a full disk or a read-only filesystem was met when the error does not say, and
    ``flag`` the option that writes elsewhere.
    """
    if verbose:
        traceback.print_exc()
    message = user_error_message(error)
    if message is not None:
        print(_capped(f"error: {message}"), file=sys.stderr)
        return EXIT_USER_ERROR
    if missing := _missing_extra(error):
        module, extra = missing
        prefix = f"{subject}: " if subject else ""
        fix = f'pip install -e ".[{extra}]"'
        print(f"error: {prefix}{module} is not installed here; install the [{extra}] extra ({fix})", file=sys.stderr)
        return EXIT_FAILED
    name, text = _innermost(error)
    if (match := _OS_ERROR.search(text)) and int(match["errno"]) in _ENVIRONMENT_FIXES:
        where = match["path"] or output or subject or "the output"
        fix = _ENVIRONMENT_FIXES[int(match["errno"])].format(flag=flag)
        print(_capped(f"error: {where}: {match['reason'].lower()}; {fix}"), file=sys.stderr)
        return EXIT_FAILED
    hint = "" if verbose else " (--verbose shows where)"
    prefix = f"{subject}: " if subject else ""
    print(_capped(f"error: {prefix}{name}: {text}") + hint, file=sys.stderr)
    return EXIT_FAILED


_DROPPED = {
    "samples_dropped_at_gaps": "crossing gaps",
    "samples_outside_splits": "outside or across splits",
    "samples_dropped_nan": "with NaN (nan_policy: drop)",
}


def dropped_line(counts: Mapping[str, int]) -> str | None:
    """'  dropped: 12 crossing gaps, ...' from a schema's counts, or None if nothing was dropped."""
    dropped = [(counts.get(key, 0), why) for key, why in _DROPPED.items()]
    if not any(n for n, _ in dropped):
        return None
    return "  dropped: " + ", ".join(f"{n:,} {why}" for n, why in dropped if n)


def started_up() -> None:
    """Start-up's imports are done: the collector, if the command line started without it, comes back.

    Importing Beam, xarray and their kind makes ~370,000 objects the cyclic collector tracks, most
    living as long as the process; it would walk them over and over while they are made (~20% of
    start-up's CPU, measured) and at every full collection after. Frozen, it never does; the few
    cycles of garbage made meanwhile (~2 MB) stay.
    """
    if not gc.isenabled():
        gc.freeze()
        gc.enable()
