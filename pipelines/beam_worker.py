"""Beam's SDK worker of a local run's worker processes, started without Beam's import-time notice (see cli)."""

import logging
import runpy
import sys

from pipelines.cli import BEAMS_BIGQUERY_NOTICE
from transforms import compat


def main(module: str) -> None:
    """Run Beam's worker ``module`` as ``python -m`` would, after importing Beam with its notice dropped.

    A root logger without a handler would make Beam's notice configure logging (and print it); the stand-in
    handler and the filter live only while Beam is imported, so the worker then sets its logging up as it would.
    """
    root, stand_in = logging.getLogger(), logging.NullHandler()
    root.addHandler(stand_in)
    root.addFilter(BEAMS_BIGQUERY_NOTICE)
    try:
        import apache_beam  # noqa: F401
    finally:
        root.removeFilter(BEAMS_BIGQUERY_NOTICE)
        root.removeHandler(stand_in)
    compat.install()  # as the in-process workers run (their bundles' ends not waiting for a slow sampler)
    sys.argv = [module, *sys.argv[2:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1])
