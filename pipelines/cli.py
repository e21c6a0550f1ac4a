"""What both commands share: turning a failure into one line and an exit code, and the dropped-samples line."""

from __future__ import annotations

import re
import sys
import traceback
from collections.abc import Mapping

from schemas.errors import UserError

EXIT_FAILED = 1  # something went wrong that the message describes (or a check failed)
EXIT_USER_ERROR = 2  # bad input or configuration: the message names it and the fix
EXIT_INTERRUPTED = 130


def user_error_message(error: BaseException) -> str | None:
    """The one-line message of a UserError raised anywhere, including inside a Beam worker."""
    message = None
    seen = set()
    cause: BaseException | None = error
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, UserError):
            message = str(cause)
            break
        cause = cause.__cause__ or cause.__context__
    if message is None:
        # Worker processes send their exceptions back as text; ours follows the type name.
        marker = f"{UserError.__name__}: "
        text = str(error)
        if marker not in text:
            return None
        message = text.split(marker, 1)[1].splitlines()[0]
    return re.sub(r" \[while running '[^']*'\]$", "", message.strip())


def report_failure(error: BaseException, verbose: bool, subject: str = "") -> int:
    """Print a failure as one ``error:`` line (after the traceback with ``verbose``); returns the exit code.

    ``subject`` (e.g. the output path) prefixes a failure that is not a UserError.
    """
    if verbose:
        traceback.print_exc()
    message = user_error_message(error)
    if message is not None:
        print(f"error: {message}", file=sys.stderr)
        return EXIT_USER_ERROR
    first_line = str(error).splitlines()[0] if str(error) else ""
    hint = "" if verbose else " (--verbose shows where)"
    prefix = f"{subject}: " if subject else ""
    print(f"error: {prefix}{type(error).__name__}: {first_line}{hint}", file=sys.stderr)
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
