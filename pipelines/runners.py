"""Choosing the Beam runner, its flags and this tool's defaults for it; closing what a run leaves open."""

from __future__ import annotations

import argparse
import contextlib
import difflib
import io
import logging
import os
import re
import signal
import tempfile
import weakref
from pathlib import Path

from apache_beam import Pipeline
from apache_beam.options.pipeline_options import (
    DirectOptions,
    PipelineOptions,
    SetupOptions,
    StandardOptions,
    WorkerOptions,
)

from pipelines.output_lock import SUBMISSION_PREFIX
from pipelines.stopping import fail_run, remove_at_exit, remove_now
from schemas.errors import UserError
from transforms.compat import local_runner_class
from transforms.compat.beam import BEAM_WORKER_MODULE
from transforms.compat.options import RunOptions  # noqa: F401  (the options a run is made with, as its callers know them)
from transforms.units import DEFAULT_RANGES

logger = logging.getLogger(__name__)

_LOCAL_RUNNERS = {None, "DirectRunner", "FnApiRunner", "BundleBasedDirectRunner"}
#: Beam knows the Dask runner only by its module path; ``--runner=DaskRunner`` is accepted too.
DASK_RUNNER = "apache_beam.runners.dask.dask_runner.DaskRunner"
_SHORT_NAMES = {"DaskRunner": DASK_RUNNER}
DATAFLOW_RUNNER = "DataflowRunner"

#: Where this package's setup.py sits in a checkout (an editable or development install).
PACKAGE_ROOT = Path(__file__).resolve().parents[1]


def _with_full_runner_names(beam_args: list[str]) -> list[str]:
    """``--runner=DaskRunner`` (or ``--runner DaskRunner``) as the module path Beam can load."""
    out = []
    for i, arg in enumerate(beam_args):
        name, _, value = arg.partition("=")
        if name == "--runner" and value in _SHORT_NAMES:
            arg = f"--runner={_SHORT_NAMES[value]}"
        elif i > 0 and beam_args[i - 1] == "--runner" and arg in _SHORT_NAMES:
            arg = _SHORT_NAMES[arg]
        out.append(arg)
    return out


def runner_name(options: PipelineOptions) -> str | None:
    runner = options.view_as(StandardOptions).runner
    return runner if isinstance(runner, str) or runner is None else type(runner).__name__


def is_local_runner(options: PipelineOptions) -> bool:
    return runner_name(options) in _LOCAL_RUNNERS


def is_dask_runner(options: PipelineOptions) -> bool:
    return runner_name(options) in (DASK_RUNNER, *_SHORT_NAMES)


def is_dry_run(options: PipelineOptions) -> bool:
    return bool(options.get_all_options().get("dry_run"))


def load_runner_options(beam_args: list[str]) -> None:
    """Import the Dask runner when it is chosen, so that Beam knows its flags (--dask_client_address, ...).

    Only then: importing dask.distributed takes a while, and --help or a local run need none of it.
    """
    if not is_dask_runner(PipelineOptions(beam_args)):
        return
    try:
        import apache_beam.runners.dask.dask_runner  # noqa: F401  (registers DaskOptions)
    except (ImportError, AttributeError) as error:  # Beam's module fails with AttributeError without it
        raise UserError(
            f"--runner=DaskRunner needs dask.distributed ({error}); "
            'install what a build runs (pip install -e ".[build]")'
        ) from None


def check_known_flags(beam_args: list[str], own_parser: argparse.ArgumentParser) -> None:
    """Refuse a flag that neither this tool nor Beam knows: Beam would drop it with a log line only.

    Beam's own option parser (handed over by ``get_all_options``) decides what is Beam's.
    """
    beam_args = _with_full_runner_names(beam_args)
    load_runner_options(beam_args)
    parsers: list[argparse.ArgumentParser] = [own_parser]
    # argparse reports a bad value (--direct_num_workers=x) by printing Beam's whole usage and
    # exiting: keep its last line only.
    with contextlib.redirect_stderr(io.StringIO()) as said:
        try:
            PipelineOptions(beam_args).get_all_options(add_extra_args_fn=parsers.append)
            _, unknown = parsers[1].parse_known_args(beam_args)
        except SystemExit:
            problem = said.getvalue().strip().splitlines()[-1].split("error: ", 1)[-1]
            raise UserError(f"Beam options: {problem}") from None
    if not unknown:
        return
    flag = unknown[0].split("=", 1)[0]
    # argparse lists its option strings only in this mapping (Beam's suggestions read it too).
    known = [option for parser in parsers for option in parser._option_string_actions]
    close = difflib.get_close_matches(flag, known, n=1)
    hint = f"did you mean {close[0]}?" if close else "see --help, and Beam's pipeline options"
    raise UserError(f"unknown argument {unknown[0]!r}: neither this tool's nor a Beam pipeline option; {hint}")


#: Threads of a local run when the user chooses none: units overlap their file reads, numpy work
#: and writes (netCDF access itself is serialised per process). Measured on 2 cores: 2 threads
#: beat 1 by about a fifth, and a third thread only adds contention.
MAX_LOCAL_THREADS = 4


def _chosen(beam_args: list[str], *flags: str) -> bool:
    return any(arg.split("=", 1)[0] in flags for arg in beam_args)


def local_threads_chosen(beam_args: list[str]) -> bool:
    """Whether the user chose the local runner's threads or mode (else the defaults do, then fit_local_threads)."""
    return _chosen(beam_args, "--direct_num_workers", "--direct_running_mode")


def fit_local_threads(options: PipelineOptions, tasks: int) -> None:
    """A local run's default threads, no more than it has tasks to run at once (units to cut, shards to sort).

    Each thread of the multi-threaded runner is an SDK worker with its own gRPC channels, started
    whether or not work reaches it: a build of one unit (the demo) took 1.45 s on one thread and
    1.57 s on two (medians of 5 alternated runs, 2 cores). Call only where the user chose no
    threads (local_threads_chosen), with the options the pipeline runs with (``pipeline.options``:
    Beam copies those it is given).
    """
    direct = options.view_as(DirectOptions)
    if direct.direct_running_mode == "multi_threading" and direct.direct_num_workers:
        direct.direct_num_workers = max(1, min(direct.direct_num_workers, tasks))


def ships_code(options: PipelineOptions) -> bool:
    """Whether the options give Dataflow's workers this package: a setup file, a container or packages."""
    setup = options.view_as(SetupOptions)
    worker = options.view_as(WorkerOptions)
    return bool(
        setup.setup_file
        or setup.extra_packages
        or setup.requirements_file
        or worker.sdk_container_image
        or worker.worker_harness_container_image
    )


def is_this_setup_file(path: Path) -> bool:
    """Whether ``path`` is this project's setup.py (of this checkout or another)."""
    try:
        return path.is_file() and 'name="xarray-tfrecords"' in path.read_text(errors="replace")
    except OSError:
        return False


def checkout_setup_file() -> Path | None:
    """This package's setup.py beside the installed packages (an editable install of a checkout), if there."""
    setup = PACKAGE_ROOT / "setup.py"
    return setup if is_this_setup_file(setup) else None


#: What Beam workers run besides this package's own requirements (setup.py's "worker" extra), beside setup.py.
WORKER_REQUIREMENTS = "worker-requirements.txt"


def worker_requirements(options: PipelineOptions) -> Path | None:
    """The worker set to send with this package's ``--setup_file``, when nothing else gives the workers theirs.

    Beam builds an sdist of the setup file's folder and workers pip-install it without extras, so
    they would get the readers' requirements only. A container image has the worker set installed
    (the Dockerfile); a ``--requirements_file`` of the user's own is theirs to fill (preflight checks it).
    """
    setup = options.view_as(SetupOptions)
    worker = options.view_as(WorkerOptions)
    if not setup.setup_file or setup.requirements_file:
        return None
    if worker.sdk_container_image or worker.worker_harness_container_image:
        return None
    setup_file = Path(setup.setup_file)
    requirements = setup_file.parent / WORKER_REQUIREMENTS
    if setup_file.name != "setup.py" or not is_this_setup_file(setup_file) or not requirements.is_file():
        return None
    return requirements


def with_runner_defaults(beam_args: list[str]) -> list[str]:
    """Beam arguments with this tool's defaults for the chosen runner; the user's own choices win.

    - local: one thread per core, up to 4.
    - Dask: one partition per element of the graph's first stage, a range of units (``unit_ranges``).
      Beam's default puts up to 128 elements in one partition, so all would run on one worker.
    - Dataflow, when nothing ships this package to the workers: ``--setup_file`` of this
      checkout, if the package is installed from one (check_remote_setup refuses otherwise).
    - Any runner that stages this package's ``--setup_file`` (Dataflow, portable runners): the
      worker set beside it as ``--requirements_file``, which workers pip-install from PyPI
      (``--requirements_cache=skip``: as they installed setup.py's requirements, rather than this
      machine downloading the wheels and uploading them with every job).
    """
    beam_args = _with_full_runner_names(beam_args)
    options = PipelineOptions(beam_args)
    if is_local_runner(options):
        if local_threads_chosen(beam_args):
            return beam_args
        threads = max(1, min(os.cpu_count() or 1, MAX_LOCAL_THREADS))
        return [*beam_args, f"--direct_num_workers={threads}", "--direct_running_mode=multi_threading"]
    if is_dask_runner(options) and not _chosen(beam_args, "--dask_npartitions", "--dask_partition_size"):
        return [*beam_args, "--dask_partition_size=1"]
    if runner_name(options) == DATAFLOW_RUNNER and not ships_code(options):
        setup = checkout_setup_file()
        if setup is not None:
            beam_args = [*beam_args, f"--setup_file={setup}"]
            options = PipelineOptions(beam_args)
    requirements = None if is_dask_runner(options) else worker_requirements(options)  # Dask stages nothing
    if requirements is not None:
        beam_args = [*beam_args, f"--requirements_file={requirements}"]
        if not _chosen(beam_args, "--requirements_cache"):
            beam_args.append("--requirements_cache=skip")
    return beam_args


#: Dask partitions per thread of the cluster: two, so that a slow partition leaves its thread's other work to
#: the rest; more add Dask tasks (each global combine shuffles over every partition), which cost more here
#: (2 single-threaded workers, 12 files: 2 a thread 0.91x the local runner's time, one a unit 1.95x).
DASK_PARTITIONS_PER_THREAD = 2


def unit_ranges(options: PipelineOptions, units: int) -> int:
    """Ranges of unit numbers the job graph starts from (transforms.units.EnumerateUnits).

    On Dask each range is one partition: Beam's DaskRunner keeps the partitions of the graph's
    first stage to the end (its Reshuffle does nothing) and runs every stage as one task per
    partition, so a partition per unit made about 200 scheduler tasks a unit, each with its
    overhead. Two partitions per thread of the cluster instead; ``--dask_npartitions`` chooses
    another count (``--dask_partition_size=N``, Beam's, would put N of these ranges in each).
    Elsewhere the runner spreads the units over its workers after the Reshuffle: a few hundred ranges.
    """
    if not is_dask_runner(options):
        return DEFAULT_RANGES
    chosen = options.get_all_options().get("npartitions")
    if chosen:
        return max(1, min(units, chosen))
    return max(1, min(units, DASK_PARTITIONS_PER_THREAD * dask_threads(options)))


#: Threads of the Dask clusters this process asked (by scheduler address or file), as the preflight check saw them:
#: each connection to the scheduler costs a round of handshakes, and a build would otherwise make three.
_DASK_THREADS: dict[tuple[str | None, str | None], int] = {}


def remember_dask_threads(address: str | None, scheduler_file: str | None, threads: int) -> None:
    """The threads a cluster's workers have, seen while connected for another reason (none yet: not kept)."""
    if threads:
        _DASK_THREADS[(address, scheduler_file)] = threads


def dask_threads(options: PipelineOptions) -> int:
    """Threads of the Dask cluster's workers, all told (at least 1; none yet: as many as this machine's cores)."""
    from apache_beam.runners.dask.dask_runner import DaskOptions

    dask = options.view_as(DaskOptions)
    if not (dask.address or dask.scheduler_file):
        return os.cpu_count() or 1  # Beam starts a LocalCluster of this machine's cores
    seen = _DASK_THREADS.pop((dask.address, dask.scheduler_file), None)  # (a later build asks again)
    if seen:
        return seen
    from distributed import Client

    timeout = {"timeout": dask.timeout} if dask.timeout is not None else {}
    with Client(address=dask.address, scheduler_file=dask.scheduler_file, set_as_default=False, **timeout) as client:
        threads = sum(client.nthreads().values())
    return threads or os.cpu_count() or 1


def make_runner(options: PipelineOptions):
    """The runner to use: for local runs the FnApiRunner, chosen directly.

    Beam's DirectRunner first tries to download the Prism runner, which waits on the network
    (and fails offline) before falling back to the FnApiRunner; choosing it directly makes a
    local run start at once. It honours --direct_num_workers and --direct_running_mode.
    """
    if is_local_runner(options):
        return _local_runner_class()()
    return options.view_as(StandardOptions).runner


def new_pipeline(options: PipelineOptions) -> Pipeline:
    """The pipeline object; Beam validates the options here, before any planning or submission.

    Beam makes it a folder in the system's temp directory that only its ``run`` removes: a run
    refused, failed, stopped or dry ends without one, so the folder goes when the object does (or at exit).
    """
    try:
        pipeline = Pipeline(runner=make_runner(options), options=options)
    except ValueError as error:
        problems = [line.strip() for line in str(error).splitlines()[1:] if line.strip()]
        if not problems:
            raise
        raise UserError(f"Beam options: {'; '.join(problems)}") from None
    remove_at_exit(pipeline.local_tempdir)  # (a stopped build ends with os._exit: no finalizer runs)
    weakref.finalize(pipeline, remove_now, pipeline.local_tempdir)
    return pipeline


#: What Beam runs as each worker process of ``--direct_running_mode=multi_processing`` (``sh -c COMMAND``) ...
_BEAMS_WORKER = b"-m " + BEAM_WORKER_MODULE
#: ... run through pipelines.beam_worker (its command line still names Beam's module: pipelines.stopping finds it).
_QUIET_WORKER = b"-m pipelines.beam_worker " + BEAM_WORKER_MODULE


def worker_death(error: BaseException) -> str:
    """What a build says of a worker process that died, from the error Beam raises for it (its exit code in it)."""
    found = re.search(r"return code (-?\d+)", str(error))
    code = int(found[1]) if found else None
    if code is not None and code < 0 and -code in signal.valid_signals():
        how = f"killed by {signal.Signals(-code).name}"
        if -code == signal.SIGKILL:
            how += ", as the out-of-memory killer ends a process"
    elif code is not None:
        how = f"exit code {code}"
    else:
        how = " ".join(str(error).split()) or type(error).__name__
    return f"a worker process of the local runner died ({how})"


#: What to do about a worker process that died: most often, memory ran out.
WORKER_DEATH_FIX = (
    "if memory ran out, run fewer at once (--direct_num_workers=N) "
    "or use threads (--direct_running_mode=multi_threading)"
)


def _quiet_worker(command: bytes) -> bytes:
    """Beam's worker command line, run through pipelines.beam_worker with Ctrl-C and SIGTERM left to this process.

    A terminal's Ctrl-C reaches its whole foreground process group, and so did Beam's workers: each printed its own
    KeyboardInterrupt traceback. Started with SIGINT and SIGTERM ignored (inherited across exec; Python then
    installs no KeyboardInterrupt handler), they keep quiet, and this process stops them instead
    (pipelines.stopping). ``exec`` leaves no shell between. pipelines.beam_worker keeps Beam's import-time notice
    of a [build] install off the terminal.
    """
    if os.name != "posix":
        return command
    return b"trap '' INT TERM; exec " + command.replace(_BEAMS_WORKER, _QUIET_WORKER)


def _worker_died(error: BaseException) -> str:
    """A worker process died: the build ends with one line (pipelines.stopping.fail_run, which ends the build
    itself if the runner does not unwind in time); the error its pending instructions fail with."""
    reason = worker_death(error)
    logger.debug("%s: %s", reason, error)
    fail_run(reason, WORKER_DEATH_FIX)  # first: the line the build ends with, however it unwinds
    return f"{reason}; {WORKER_DEATH_FIX}"


def _local_runner_class():
    """Beam's FnApiRunner with this tool's worker processes (_quiet_worker), each watched: one that dies ends the
    build (_worker_died); its in-process workers send only whole elements (transforms.compat.beam)."""
    return local_runner_class(_quiet_worker, _worker_died)


@contextlib.contextmanager
def submission_temp_dir(options: PipelineOptions):
    """For a remote runner, the system temp directory is a private folder removed when the run ends.

    Beam stages a remote job's dependencies (this package's sdist, the pickled session) in a
    folder of the temp directory that it never removes (apache_beam.transforms.environments'
    ``python_sdk_dependencies``): a launcher would leave one behind per job. Local runs stage nothing.
    """
    if is_local_runner(options):
        yield
        return
    folder = tempfile.mkdtemp(prefix=SUBMISSION_PREFIX)  # (where the output lock is not: pipelines.output_lock)
    remove_at_exit(folder)  # also when a stop ends the process itself (os._exit), mid-check or mid-job
    previous = tempfile.tempdir
    tempfile.tempdir = folder
    try:
        yield
    finally:
        tempfile.tempdir = previous
        remove_now(folder)


def runner_context(options: PipelineOptions) -> contextlib.AbstractContextManager:
    """Settings a run needs while its graph is built and run.

    Dask: each GroupByKey becomes a dask.bag groupby, which asks dask for its default shuffle
    method; finding it imports dask.dataframe (0.7 s on the driver, measured) only to answer
    "p2p", which bags do not support and replace with "tasks". Saying "tasks" up front skips that.
    """
    if not is_dask_runner(options):
        return contextlib.nullcontext()
    import dask

    return dask.config.set({"dataframe.shuffle.method": "tasks"})


def close_run(result) -> None:
    """Close what a run leaves open: the Dask runner's client (its result's), after success or failure.

    Beam's DaskRunner opens a client per run and never closes it; the client's tasks still
    running on the cluster are released with it.
    """
    client = getattr(result, "client", None)
    if client is None:
        return
    try:
        client.close()
    except Exception as error:  # closing must not hide why a run failed
        logger.warning("could not close the Dask client: %s", error)
