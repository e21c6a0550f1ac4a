"""Beam's look for state and timers in a DoFn, done once per DoFn object rather than each time Beam asks.

Beam looks a DoFn over (every method's signature) whenever it asks whether the DoFn is stateful:
about 230 times while our graph is built and run, a tenth of a local run's start-up (measured).
What it finds depends only on the DoFn's methods, which do not change once the DoFn is made.
"""

from __future__ import annotations

import weakref

_INSTALLED = False


def look_once_per_dofn() -> None:
    """Make Beam's ``userstate.get_dofn_specs`` answer from a memo per live DoFn object; idempotent.

    Installed when a build runs (never at import: importing the packages patches nothing).
    """
    global _INSTALLED
    if _INSTALLED:
        return
    from apache_beam.transforms import userstate

    original = userstate.get_dofn_specs
    memo: dict[int, tuple[weakref.ref, tuple]] = {}

    def get_dofn_specs(dofn):
        held = memo.get(id(dofn))
        if held is not None and held[0]() is dofn:
            return held[1]
        specs = original(dofn)
        try:
            seen = weakref.ref(dofn)
        except TypeError:  # no weak references to it: asked again, it is looked over again
            return specs
        key = id(dofn)
        memo[key] = (seen, specs)
        weakref.finalize(dofn, memo.pop, key, None)  # gone with the DoFn, before its id can be reused
        return specs

    userstate.get_dofn_specs = get_dofn_specs
    _INSTALLED = True
