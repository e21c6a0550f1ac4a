"""Command line: build shuffled, sharded TFRecords from NetCDF files (``python -m pipelines.build``).

With no arguments it runs the built-in demo. Flags it does not know go to Beam's
PipelineOptions (``--runner``, ``--direct_num_workers``, ``--project``, ...).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib.util
import io
import logging
import os
import signal
import sys
import time
from typing import TYPE_CHECKING

from pipelines.cli import (
    EXIT_INTERRUPTED,
    EXIT_TERMINATED,
    configure_logging,
    dropped_line,
    report_failure,
    started_up,
)
from pipelines.stopping import StopOnSignal, exit_now, stopped_line
from planning.run.cancellation import reset as reset_cancellation
from schemas.errors import UserError
from schemas.schema import default_split
from schemas.shards import generation_totals

if TYPE_CHECKING:
    from planning.plan import BuildPlan
    from schemas.schema import Schema

logger = logging.getLogger(__name__)


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m pipelines.build",
        description=(
            "Turn NetCDF files into fully shuffled, sharded TFRecords of tf.train.Example, with "
            "schema.json, a generated tf.data parser.py and stats.json beside them. "
            "Without --config, runs the built-in demo. Unknown flags go to Beam (e.g. --runner)."
        ),
    )
    parser.add_argument("--config", help="YAML build config (see configs/ and docs/reference/config.md)")
    parser.add_argument("--input", nargs="+", metavar="GLOB", help="input files or globs (overrides input.paths)")
    parser.add_argument("--output", help="output directory (overrides output.path)")
    parser.add_argument("--seed", type=int, help="shuffle seed (overrides shuffle.seed)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing output")
    parser.add_argument(
        "--append",
        action="store_true",
        help=(
            "add the input's steps the output does not hold yet (new files after its last step) as a new "
            "generation: old shards untouched, statistics merged; --input names every file, old and new"
        ),
    )
    parser.add_argument(
        "--shared_filesystem",
        action="store_true",
        help=(
            "the workers of a remote runner (e.g. a Dask cluster on HPC) see this machine's files at the same "
            "paths: allows local input and output paths, in-place writes and the live progress line"
        ),
    )
    parser.add_argument("--quiet", action="store_true", help="no live progress line (the summary still prints)")
    parser.add_argument("--verbose", action="store_true", help="log progress details; show tracebacks on errors")
    return parser


def nonfinite_lines(stats: dict) -> list[str]:
    """'  <function> returned non-finite values: ...' per derived variable holding NaN or inf (from stats.json)."""
    derived = stats.get("preprocess") or {}
    lines = []
    for name, n in (derived.get("variables") or {}).items():
        if n.get("nan") or n.get("inf"):
            lines.append(
                f"  {derived.get('function')} returned non-finite values: {name!r} {n.get('inf', 0):,} inf and "
                f"{n.get('nan', 0):,} NaN of {n.get('values', 0):,} values cut, first in unit {n.get('first_unit')}"
            )
    return lines


def unmarked_fills(schema: Schema, stats: dict) -> list[str]:
    """Features with filled points that normalize=True cannot find: no mask, and the fill value among their values."""
    names = []
    for name, entry in stats.get("normalization", {}).items():
        members = schema.feature(name).source.get("channels", [name])
        counts = [
            split.get("variables", {}).get(member, {}).get("filled_count", 0)
            for split in stats.get("splits", {}).values()
            for member in members
        ]
        if not any(_total(c) for c in counts):
            continue
        found = entry.get("filled") or {}
        if "mask" not in found and not (found.get("where") is not None and _all(found["where"])):
            names.append(name)
    return names


def _total(value) -> float:
    return sum(_total(v) for v in value) if isinstance(value, list) else (value or 0)


def _all(value) -> bool:
    return all(_all(v) for v in value) if isinstance(value, list) else bool(value)


def store_reads_line(counters: dict[str, int], source: str = "the store") -> str | None:
    """What a build fetched of a Zarr store's (or NetCDF-4 files', ``source``) chunks against the stored bytes of
    the chunks it needed (None: unknown, or nothing chunked read)."""
    from planning.run.contracts import BYTES_READ, CHUNK_BYTES, CHUNKS_FETCHED  # here: --help loads no xarray

    fetched, needed = counters.get(CHUNKS_FETCHED, counters.get(BYTES_READ, 0)), counters.get(CHUNK_BYTES, 0)
    if not needed:
        return None
    return (
        f"  read {fetched / 1e6:,.1f} MB from {source} for {needed / 1e6:,.1f} MB of chunks needed "
        f"({fetched / needed:.2f}x; above 1x: chunks fetched again for windows that cross into them, static fields)"
    )


def _print_summary(plan: BuildPlan, schema: Schema, seconds: float, counters: dict[str, int] | None = None) -> None:
    shards = sum(len(split) for split in schema.splits.values())
    new = generation_totals(schema.splits, plan.generation)  # (by rule: no Shard object a shard)
    size = new["bytes"]
    if plan.generation:
        print(
            f"Appended generation {plan.generation}: {new['examples']:,} samples in {new['shards']} "
            f"shard(s), {size / 1e6:,.1f} MB, to {plan.output} in {seconds:.1f} s "
            f"({size / 1e6 / max(seconds, 1e-9):,.1f} MB/s); it now holds {schema.num_examples():,} samples in "
            f"{shards} shard(s) of {plan.generation + 1} generations."
        )
    else:
        print(
            f"Wrote {schema.num_examples():,} samples in {shards} shard(s), {size / 1e6:,.1f} MB, "
            f"to {plan.output} in {seconds:.1f} s ({size / 1e6 / max(seconds, 1e-9):,.1f} MB/s)."
        )
    if len(schema.splits) > 1:
        print("  " + ", ".join(f"{name}: {schema.num_examples(name):,}" for name in schema.splits))
    for name, described in schema.sample.get("splits", {}).items():
        if described.get("no_data_yet") and not schema.num_examples(name):
            print(f"  {name}: no data yet ({described['no_data_yet']}); an --append with its steps fills it")
    print(graph_line(plan))
    if plan.unstated_calendar:
        print(_calendar_line(plan.unstated_calendar))
    reads = store_reads_line(counters or {}, "the store" if plan.zarr_store is not None else "NetCDF-4 chunks")
    if reads:
        print(reads)
    counts = _own_counts(plan, schema)  # an append's summary says what it did, not what earlier generations did
    dropped = dropped_line(counts)
    if dropped:
        print(dropped.replace("dropped:", "dropped of the new steps' samples:") if plan.generation else dropped)
    with_nan = counts.get("samples_with_nan", 0)
    filled = with_nan and plan.nan_policy == "fill"
    stats = {}
    if filled or plan.preprocess is not None:  # read once, only when a line below needs it
        from schemas.metadata import load_stats

        stats = load_stats(plan.output)
    if filled:
        print(f"  filled NaN with {plan.fill_value} in {with_nan:,} samples")
        unmarked = unmarked_fills(schema, stats)
        if unmarked:
            print(
                f"  normalize=True cannot tell the filled points of {', '.join(unmarked)} from data (fill_value "
                f"{plan.fill_value} lies among their values): they normalise as data; "
                f"nan_mask: [{', '.join(unmarked)}] marks them"
            )
    elif with_nan and plan.nan_policy == "keep":
        print(f"  {with_nan:,} samples hold NaN (nan_policy: keep; drop or fill them if your model cannot)")
    if plan.preprocess is not None:
        for line in nonfinite_lines(stats):
            print(line)
    split = default_split(list(schema.splits))
    # find_spec looks TensorFlow up without importing it (that would take seconds).
    missing = "" if importlib.util.find_spec("tensorflow") else ' (not installed here: pip install -e ".[tf]")'
    print(f"Load it in TensorFlow{missing}:")
    # load_dataset reads the output's own schema.json: two outputs in one process cannot mix up
    # (importing each output's parser.py as the module "parser" would return the first one twice).
    print("    from schemas import load_dataset")
    if plan.shuffle_mode == "read":  # stored in unit order: a global order each epoch, through the indexes
        print(f"    ds = load_dataset({plan.output!r}, {split!r}, batch_size=32, epoch=0)  # epoch=1, 2, ... after")
    else:
        print(f"    ds = load_dataset({plan.output!r}, {split!r}, batch_size=32)")


def _own_counts(plan: BuildPlan, schema: Schema) -> dict[str, int]:
    """This build's counts: the output's for a first build; an append's own (schema.json sums every generation's),
    from generations.json, or where it cannot be read, those planning knew (gaps, outside the splits)."""
    if not plan.generation:
        return dict(schema.counts)
    import fsspec

    from planning.run.generations import DIGEST_KEY, GENERATIONS_FILE, loads

    path = f"{plan.output.rstrip('/')}/{GENERATIONS_FILE}"
    try:
        with fsspec.open(path, "r") as stream:
            text = stream.read()
        committed = int(schema.sources.get("generations", plan.generation + 1))
        entries = loads(text, path, committed, schema.sources.get(DIGEST_KEY))
        counts = entries[plan.generation].get("counts")
    except (OSError, UserError, IndexError, ValueError):
        counts = None
    return dict(counts) if isinstance(counts, dict) else dict(plan.schema.counts)


def _calendar_line(paths: tuple[str, ...]) -> str:
    """The calendar times were read in where the files state none: a model's noleap read as standard shifts dates."""
    files = f"{paths[0]} and {len(paths) - 1:,} other file(s) state" if len(paths) > 1 else f"{paths[0]} states"
    return (
        f"  times read in calendar 'standard' (CF's default), as {files} none; "
        "if they count in another (a model's noleap or 360_day), set input.calendar"
    )


def graph_line(plan: BuildPlan) -> str:
    """'  job graph: 0.05 MB (Dataflow's limit: 10 MB)': what the run submitted, which must not grow with the data."""
    from pipelines.graph import DATAFLOW_GRAPH_LIMIT

    size = plan.job_graph_bytes or 0
    return f"  job graph: {size / 1e6:,.2f} MB (Dataflow's limit: {DATAFLOW_GRAPH_LIMIT / 1e6:.0f} MB)"


def _print_dry_run(plan: BuildPlan) -> None:
    print(f"Dry run: the job graph for {plan.num_samples:,} samples was built and validated; nothing was run.")
    splits = ", ".join(f"{s.name}: {s.num_samples:,} samples in {s.num_shards} shard(s)" for s in plan.splits)
    inputs = f"{len(plan.sources):,} file(s), {plan.sources.total_bytes / 1e6:,.1f} MB"
    print(f"  plan: {splits}; {len(plan.units):,} work unit(s) from {inputs}; output {plan.output}")
    print(f"  graph: {plan.job_graph_outline}")
    print(graph_line(plan))
    if plan.unstated_calendar:
        print(_calendar_line(plan.unstated_calendar))


def main(argv: list[str] | None = None) -> int:
    """``python -m pipelines.build``: build an output from a config (without one: the built-in demo).

    Args:
        argv: the command line without the program name (default: ``sys.argv[1:]``); flags the build does not
            know go to Beam's PipelineOptions (``--runner``, ``--direct_num_workers``, ...).

    Returns:
        The exit status: 0 built (or nothing to append), 1 failed, 2 bad input or configuration (one line on
        stderr naming the file, variable or key and the fix), 130 or 143 stopped by Ctrl-C or SIGTERM.
    """
    parser = make_parser()
    args, beam_args = parser.parse_known_args(argv)
    configure_logging(args.verbose)
    started = time.monotonic()
    reset_cancellation()  # a build before this one in the process may have been stopped or have failed
    # SIGTERM (timeout, Docker, Kubernetes, batch schedulers) stops a build as Ctrl-C does.
    # Ctrl-C too, unless ignored from the start (a script's background job), as Python leaves it then.
    stopping = [signal.SIGTERM] + ([signal.SIGINT] if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN else [])
    stop = StopOnSignal(stopping, sys.stderr).start()  # in the main thread only: elsewhere, no signal comes
    output = args.output or ""
    try:
        # Imported here so that --help answers without loading Beam, xarray or numpy.
        from pipelines.graph import run_build
        from pipelines.runners import check_known_flags, with_runner_defaults
        from planning.config import load_config

        started_up()

        check_known_flags(beam_args, parser)
        chosen, beam_args = beam_args, with_runner_defaults(beam_args)
        added = [a for a in beam_args if a not in chosen]
        shipped = [
            f"{what} with {a}"
            for what, flag in (
                ("this checkout to the workers", "--setup_file="),
                ("what they run", "--requirements_file="),
            )
            for a in added
            if a.startswith(flag)
        ]
        if shipped:
            print(f"Shipping {', and '.join(shipped)} (or choose: --sdk_container_image=IMAGE).")

        overwrite = args.overwrite
        if args.append and overwrite:
            raise UserError("--append adds to the output, --overwrite replaces it: pass one of them")
        if args.config is None:
            from pipelines import demo

            if args.input is None:
                demo.ensure_demo_data()
            if args.output is None:
                overwrite = True  # the demo replaces its own earlier output (never foreign files)
            config = load_config(data=demo.DEMO_CONFIG, input=args.input, output=args.output, seed=args.seed)
            print(f"No --config given: running the demo on {config.input.paths[0]} (see configs/demo.yaml).")
        else:
            config = load_config(args.config, input=args.input, output=args.output, seed=args.seed)
        output = config.output.path
        # Beam's worker threads print every failure's traceback to stderr themselves; the failure
        # also comes back as the exception reported below in one line, so hold that text back.
        worker_output = io.StringIO()
        counters: dict[str, int] = {}
        progress = None if args.quiet else sys.stderr  # the terminal's stream, taken before the redirect
        with contextlib.redirect_stderr(sys.stderr if args.verbose else worker_output):
            plan, schema = run_build(config, chosen, overwrite, progress, args.shared_filesystem, counters, args.append)
        sys.stderr.write(worker_output.getvalue())
    except BaseException as error:
        from planning.run.generations import NothingToAppend

        if isinstance(error, NothingToAppend):
            sys.stderr.write(worker_output.getvalue())
            print(str(error))
            return 0
        if stop.ended():
            # Whatever the stop made fail on its way out (a cancelled write, a killed worker) is its doing.
            stop.end()
            print(stop.line(), file=sys.stderr)
            return stop.exit_code()
        if isinstance(error, KeyboardInterrupt):  # not through our handler: a program that calls main()
            print(stopped_line(signal.SIGINT), file=sys.stderr)
            return EXIT_INTERRUPTED
        if not isinstance(error, Exception):
            raise
        return report_failure(error, args.verbose, output=output)
    finally:
        stop.close()
    if schema is None:
        _print_dry_run(plan)
        return 0
    _print_summary(plan, schema, time.monotonic() - started, counters)
    return 0


def _flush_stdout() -> None:
    """Flush what the build printed; a reader that went away (``| head -1``) does not fail a finished build."""
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        # Nothing more can be printed; point stdout at /dev/null so the interpreter's last flush is quiet.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


if __name__ == "__main__":
    gc.disable()  # until start-up's imports are done (pipelines.cli.started_up)
    try:
        code = main()
    except BrokenPipeError:  # the summary met a closed pipe: the output itself is complete
        code = 0
    _flush_stdout()
    # Everything left is freed at exit anyway; without this, the interpreter's last collections
    # walk Beam's whole object graph first (about 0.6 s, measured on a 5 s run).
    gc.freeze()
    if code in (EXIT_INTERRUPTED, EXIT_TERMINATED):
        # The run's files are gone; Beam's worker threads would only compute what nobody writes.
        sys.stderr.flush()
        exit_now(code)
    sys.exit(code)
