"""What a patch of another library is (its target, the versions it was written for) and how one is put in, once."""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

from schemas.errors import UserError

logger = logging.getLogger(__name__)

#: A patch that only makes a build faster: outside its versions, or with its target gone, the build runs without it.
SPEED = "speed"
#: A patch a build needs to be right: with its target gone, a build that needs it is refused in one line.
CORRECTNESS = "correctness"


@dataclass(frozen=True)
class Patch:
    """One change to another library's internals, put in by ``put_in`` (compat.install or its own caller).

    Attributes:
        name: how docs, logs and ``disable`` name it.
        library: the distribution patched, as pip names it ("python" for CPython itself).
        written_for: the versions it was written for (a PEP 440 specifier: setup.py's range).
        tested: the version the tests run it on (constraints.txt's pin).
        purpose: SPEED or CORRECTNESS.
        target: the patched attribute, as a user would look it up (``module.Class.attribute``).
        present: whether the target is as this patch knows it (cheap: an attribute, a default).
        apply: makes the change; called once per process.
    """

    name: str
    library: str
    written_for: str
    tested: str
    purpose: str
    target: str
    present: Callable[[], bool]
    apply: Callable[[], None]


#: Patches left out on purpose in this process (a benchmark's or a test's "without it" run).
_DISABLED: set[str] = set()
_DONE: dict[str, bool] = {}
_LOCK = threading.RLock()  # DoFns' setup() calls install() from several threads at once


def disable(*names: str) -> None:
    """Leave the patches ``names`` out in this process from now on (what they already changed stays)."""
    _DISABLED.update(names)


@cache
def installed_version(library: str) -> str | None:
    """The installed version of ``library`` (a distribution name, or "python"), None if it is not installed."""
    if library == "python":
        return ".".join(map(str, sys.version_info[:3]))
    from importlib import metadata

    try:
        return metadata.version(library)
    except metadata.PackageNotFoundError:
        return None


def in_range(version: str | None, specifier: str) -> bool:
    """Whether ``version`` is in ``specifier`` (pre-releases of it too: a nightly Beam is still that Beam)."""
    if version is None:
        return False
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version

    try:
        return SpecifierSet(specifier).contains(Version(version), prereleases=True)
    except InvalidVersion:
        return False


def refusal(patch: Patch) -> str:
    """The one line a build that needs ``patch`` ends with when its target is gone."""
    version = installed_version(patch.library)
    return (
        f"{patch.library} {version}: {patch.target} is not as this tool's {patch.name} patch knows it; "
        f"install the tested version, pip install '{patch.library}=={patch.tested}' (in a checkout: "
        f'pip install -c constraints.txt -e ".[build]"), or one of {patch.library}{patch.written_for} that has it'
    )


def put_in(patch: Patch) -> bool:
    """Apply ``patch`` once in this process, where it fits; whether it is in.

    A speed patch outside its versions, or whose target is not as it knows it, is left out (a debug log line):
    the build runs as the library has it. A correctness patch whose target is gone raises UserError (refusal);
    outside its versions but with its target as it knows it, it is applied (a debug log line).

    Raises:
        UserError: a correctness patch's target is not as the patch knows it.
    """
    with _LOCK:
        done = _DONE.get(patch.name)
        if done is not None:
            return done
        if patch.name in _DISABLED:
            logger.debug("patch %s left out: disabled in this process", patch.name)
            return False  # (not remembered: enabled again later, it goes in)
        version = installed_version(patch.library)
        fits = in_range(version, patch.written_for)
        if not fits:
            logger.debug("patch %s: %s %s is outside %s", patch.name, patch.library, version, patch.written_for)
        present = patch.present()
        if patch.purpose == SPEED and not (fits and present):
            logger.debug("patch %s left out (%s %s; target as known: %s)", patch.name, patch.library, version, present)
            _DONE[patch.name] = False
            return False
        if not present:
            raise UserError(refusal(patch))
        patch.apply()
        _DONE[patch.name] = True
        return True
