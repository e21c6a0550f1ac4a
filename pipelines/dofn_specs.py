"""Beam's look for state and timers in a DoFn, done once per DoFn object rather than each time Beam asks.

Beam looks a DoFn over (every method's signature) whenever it asks whether the DoFn is stateful:
about 230 times while our graph is built and run, a tenth of a local run's start-up (measured).
What it finds depends only on the DoFn's methods, which do not change once the DoFn is made.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

_INSTALLED = False


def once_per_object(look: Callable) -> Callable:
    """``look``, answering again from a memo for an object still alive (by identity; held weakly)."""
    memo: dict[int, tuple[weakref.ref, object]] = {}

    def remembered(obj):
        held = memo.get(id(obj))
        if held is not None and held[0]() is obj:
            return held[1]
        found = look(obj)
        try:
            alive = weakref.ref(obj)
        except TypeError:  # no weak references to it: asked again, it is looked over again
            return found
        key = id(obj)
        memo[key] = (alive, found)
        weakref.finalize(obj, memo.pop, key, None)  # gone with the object, before its id can be reused
        return found

    return remembered


def look_once_per_dofn() -> None:
    """Make Beam's ``userstate.get_dofn_specs`` answer once per live DoFn object; idempotent.

    Installed when a build runs (never at import: importing the packages patches nothing).
    """
    global _INSTALLED
    if _INSTALLED:
        return
    from apache_beam.transforms import userstate

    userstate.get_dofn_specs = once_per_object(userstate.get_dofn_specs)
    _INSTALLED = True
