"""The console script ``xarray-tfrecords``: ``build``, ``inspect`` and ``reassemble``, as ``python -m pipelines.*``."""

from __future__ import annotations

import importlib
import sys

from pipelines.cli_reference import COMMANDS, CONSOLE_COMMANDS

USAGE = "usage: xarray-tfrecords {build,inspect,reassemble} [ARGS ...]  (each command's --help says more)"


def main(argv: list[str] | None = None) -> int:
    """Run one command with the rest of the command line.

    Args:
        argv: the command line without the program name (default: ``sys.argv[1:]``), its first word the
            command: ``build``, ``inspect`` or ``reassemble``.

    Returns:
        The command's exit status; 2 for a missing or unknown command, with the usage on stderr.
    """
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE, file=sys.stderr if not argv else sys.stdout)
        return 2 if not argv else 0
    command, rest = argv[0], argv[1:]
    if command not in CONSOLE_COMMANDS:
        print(f"error: {command!r} is not a command; {USAGE}", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[command][0])
    return module.main(rest)


if __name__ == "__main__":
    sys.exit(main())
