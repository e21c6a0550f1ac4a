"""Patches of other libraries' internals, in one place: ``install()`` puts them in when a build or a worker runs.

Importing this package patches nothing (nor imports Beam). Each patch names the versions it was written for
(setup.py's ranges) and checks that its target is as it knows it: a speed patch that does not fit is left out (a
debug log line) and the build runs as the library has it; a correctness patch whose target is gone refuses the
build in one line naming the library, its version and the versions to install. The list: docs/design.md.
"""

from __future__ import annotations

from transforms.compat.beam import local_runner_class, use_anonymous_credentials_for_emulator
from transforms.compat.patches import CORRECTNESS, SPEED, Patch, disable, put_in


def every_patch() -> list[Patch]:
    """Every patch: those install() puts in, then the local runner's (put in when local_runner_class makes it)."""
    from transforms.compat import beam, options, xarray_dask

    return [
        xarray_dask.DEFER_DASK,
        beam.DOFN_SPECS,
        beam.SAMPLE_OFTEN,
        options.OPTIONS_VIEWS,
        beam.EMULATOR_CREDENTIALS,
        beam.NO_TIMED_FLUSH,
        beam.WATCHED_WORKERS,
    ]


def install() -> None:
    """Put in the patches a build's process runs with; idempotent, thread-safe.

    Called by the build and the reassembly before they plan, and by Beam's worker processes of a local run.
    The DoFns that write files call use_anonymous_credentials_for_emulator in their setup() (a remote worker's
    first chance); the local runner's own patches go in with local_runner_class.
    """
    from transforms.compat import beam, options, xarray_dask

    put_in(xarray_dask.DEFER_DASK)
    put_in(beam.DOFN_SPECS)
    put_in(beam.SAMPLE_OFTEN)
    put_in(options.OPTIONS_VIEWS)
    use_anonymous_credentials_for_emulator()


__all__ = [
    "CORRECTNESS",
    "SPEED",
    "Patch",
    "disable",
    "every_patch",
    "install",
    "local_runner_class",
    "put_in",
    "use_anonymous_credentials_for_emulator",
]
