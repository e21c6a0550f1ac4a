"""Checking a remote runner's setup before anything is submitted: paths, code, buckets, region, scheduler."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import importlib.util
import logging
import os
import re
import uuid
from pathlib import Path

from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import (
    GoogleCloudOptions,
    PipelineOptions,
    SetupOptions,
    StandardOptions,
    WorkerOptions,
)
from apache_beam.runners.runner import create_runner

from pipelines.runners import (
    DATAFLOW_RUNNER,
    WORKER_REQUIREMENTS,
    is_dask_runner,
    is_local_runner,
    is_this_setup_file,
    remember_dask_threads,
    runner_name,
    ships_code,
)
from planning.config import BuildConfig
from planning.run.cancellation import Cancelled, is_stopped
from schemas.errors import UserError
from schemas.urls import is_remote

logger = logging.getLogger(__name__)

#: Dataflow regions, as documented in "Dataflow locations"
#: (https://cloud.google.com/dataflow/docs/resources/locations). A new region appears there
#: before this list learns of it, so a name shaped like a region but missing here is only a warning.
DATAFLOW_REGIONS = frozenset(
    {
        "africa-south1",
        "asia-east1",
        "asia-east2",
        "asia-northeast1",
        "asia-northeast2",
        "asia-northeast3",
        "asia-south1",
        "asia-south2",
        "asia-southeast1",
        "asia-southeast2",
        "australia-southeast1",
        "australia-southeast2",
        "europe-central2",
        "europe-north1",
        "europe-north2",
        "europe-southwest1",
        "europe-west1",
        "europe-west2",
        "europe-west3",
        "europe-west4",
        "europe-west6",
        "europe-west8",
        "europe-west9",
        "europe-west10",
        "europe-west12",
        "me-central1",
        "me-central2",
        "me-west1",
        "northamerica-northeast1",
        "northamerica-northeast2",
        "northamerica-south1",
        "southamerica-east1",
        "southamerica-west1",
        "us-central1",
        "us-east1",
        "us-east4",
        "us-east5",
        "us-south1",
        "us-west1",
        "us-west2",
        "us-west3",
        "us-west4",
    }
)
#: What every Google Cloud region name looks like: area-direction plus a number (us-central1).
REGION_PATTERN = re.compile(r"^[a-z]+-[a-z]+\d+$")


def check_remote_setup(options: PipelineOptions, config: BuildConfig, shared_filesystem: bool = False) -> None:
    """Fail in one line, before planning or submission, on a remote-runner setup that cannot work.

    ``shared_filesystem``: the workers see this machine's filesystem (a cluster on a shared
    parallel filesystem), so local paths are allowed.
    """
    if options.view_as(StandardOptions).no_wait_until_finish:
        # The launcher commits the output (its manifest) and removes the run's working files when the job ends.
        raise UserError(
            "--no_wait_until_finish: the build commits its output when the job ends, so the launcher waits for it; "
            "to keep your terminal, run the command in the background (nohup python -m pipelines.build ... &)"
        )
    check_gcp_support(options, config)
    if is_local_runner(options):
        return
    runner = runner_name(options)
    try:
        create_runner(runner)
    except ValueError as error:  # an unknown name: Beam lists the ones it knows
        raise UserError(f"--runner={runner} is not a runner Beam knows. {str(error).split('. ', 1)[-1]}") from None
    short = runner.rsplit(".", 1)[-1]
    if shared_filesystem and runner == DATAFLOW_RUNNER:
        raise UserError(
            "--shared_filesystem: Dataflow workers never see this machine's filesystem; "
            "drop the flag and use gs:// paths"
        )
    if not shared_filesystem:
        _check_paths_are_remote(config, short)
    if runner == DATAFLOW_RUNNER:
        _check_dataflow(options)
    if is_dask_runner(options):
        _check_dask_scheduler(options)
    else:
        _check_worker_requirements(options)
    if _can_reach_storage(options):
        _check_output_bucket(config.output.path)


def check_gcp_support(options: PipelineOptions, config: BuildConfig) -> None:
    """Refuse gs:// paths or the Dataflow runner in one line where the install leaves Google Cloud out ([build] alone).

    gcsfs reads gs:// inputs; Beam's GCS filesystem writes gs:// outputs, and Beam's GCP extras run Dataflow.
    """
    cloud = options.view_as(GoogleCloudOptions)
    paths = (config.output.path, *config.input.paths, cloud.temp_location, cloud.staging_location)
    where = next((p for p in paths if p and p.startswith("gs://")), None)
    if where is None and runner_name(options) == DATAFLOW_RUNNER:
        where = f"--runner={DATAFLOW_RUNNER}"
    if where is None or (importlib.util.find_spec("gcsfs") and _beam_reaches_gcs()):
        return
    raise UserError(
        f"{where}: Google Cloud (gs:// paths, Dataflow) is not installed here; "
        'install the [gcp] extra (pip install -e ".[gcp]")'
    )


def _beam_reaches_gcs() -> bool:
    try:
        FileSystems.get_filesystem("gs://bucket/")
    except ValueError:  # Beam registers its GCS filesystem only where its GCP extras are installed
        return False
    return True


def _check_paths_are_remote(config: BuildConfig, runner: str) -> None:
    alternative = "" if runner == DATAFLOW_RUNNER else ", or pass --shared_filesystem if every worker sees this path"
    if not is_remote(config.output.path):
        raise UserError(
            f"output: {config.output.path} is a local path, but {runner} runs on remote workers that cannot "
            f"write there; use a gs:// output{alternative}"
        )
    local_inputs = [p for p in config.input.paths if not is_remote(p)]
    if local_inputs:
        raise UserError(
            f"input: {local_inputs[0]} is a local path, but {runner} runs on remote workers that cannot read it; "
            f"copy the files to gs:// and give that path{alternative}"
        )


def _check_dataflow(options: PipelineOptions) -> None:
    cloud = options.view_as(GoogleCloudOptions)
    if not cloud.temp_location:
        raise UserError("DataflowRunner needs --temp_location=gs://BUCKET/tmp (where Dataflow stages its files)")
    for flag, value in (("--temp_location", cloud.temp_location), ("--staging_location", cloud.staging_location)):
        if value and not is_remote(value):
            raise UserError(f"{flag}={value} is local; DataflowRunner needs a gs:// path")
    for flag, value in (("--project", cloud.project), ("--region", cloud.region)):
        if not value:
            raise UserError(f"DataflowRunner needs {flag} (e.g. --project=my-project --region=us-central1)")
    check_region(cloud.region)
    if not ships_code(options):
        raise UserError(
            "DataflowRunner: nothing ships this package to the workers, and it is not installed from a checkout "
            "whose setup.py could be sent; pass --setup_file=PATH/TO/setup.py, or "
            "--sdk_container_image=IMAGE built from the Dockerfile"
        )
    if _can_reach_storage(options):
        for flag, value in (("--temp_location", cloud.temp_location), ("--staging_location", cloud.staging_location)):
            if value:
                _check_writable(flag, value)


#: A requirement line's project name (PEP 508), before its extras, versions or markers.
_REQUIREMENT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def _requirement_names(text: str) -> dict[str, str]:
    """{normalised name: name as written} of the requirements in a requirements file's text."""
    names = {}
    for line in text.splitlines():
        if match := _REQUIREMENT_NAME.match(line.split("#", 1)[0].strip()):
            names[re.sub(r"[-_.]+", "-", match[0]).lower()] = match[0]
    return names


def _check_worker_requirements(options: PipelineOptions) -> None:
    """A --requirements_file of the user's own, sent with this package's --setup_file, lists what workers run.

    Workers install the setup file's package without extras: without the worker set they would
    fail on their first import, minutes after submission. The Beam SDK is the worker image's own.
    """
    setup = options.view_as(SetupOptions)
    worker = options.view_as(WorkerOptions)
    if not (setup.setup_file and setup.requirements_file):
        return
    if worker.sdk_container_image or worker.worker_harness_container_image:
        return
    ours = Path(setup.setup_file).parent / WORKER_REQUIREMENTS
    if not is_this_setup_file(Path(setup.setup_file)) or not ours.is_file():
        return
    if Path(setup.requirements_file).resolve() == ours.resolve():
        return
    try:
        theirs = _requirement_names(Path(setup.requirements_file).read_text(errors="replace"))
    except OSError as error:
        raise UserError(f"--requirements_file={setup.requirements_file}: cannot read it ({_reason(error)})") from None
    needed = _requirement_names(ours.read_text())
    missing = [name for key, name in needed.items() if key not in theirs and key != "apache-beam"]
    if missing:
        raise UserError(
            f"--requirements_file={setup.requirements_file} lacks what the workers of --setup_file={setup.setup_file} "
            f"run ({', '.join(missing)}); add the lines of {ours} to it, or use --sdk_container_image=IMAGE "
            "built from the Dockerfile"
        )


def check_region(region: str) -> None:
    """Refuse a name that is no region at all; warn about a region-shaped name missing from the list."""
    if not REGION_PATTERN.match(region):
        raise UserError(
            f"--region={region} is not a Google Cloud region name (such as us-central1 or europe-west4); "
            "see https://cloud.google.com/dataflow/docs/resources/locations"
        )
    if region not in DATAFLOW_REGIONS:
        logger.warning(
            "--region=%s is not among the Dataflow regions this tool knows; if the job is refused, "
            "choose one of https://cloud.google.com/dataflow/docs/resources/locations",
            region,
        )


def _can_reach_storage(options: PipelineOptions) -> bool:
    """Whether bucket checks can run: not with --no_auth (no credentials), unless a storage emulator stands in."""
    if os.environ.get("STORAGE_EMULATOR_HOST"):
        return True
    if options.view_as(GoogleCloudOptions).no_auth:
        logger.info("--no_auth: bucket checks skipped (they need credentials)")
        return False
    return True


def _bucket(url: str) -> str:
    return url.split("://", 1)[1].split("/", 1)[0]


def _filesystem(url: str):
    import fsspec

    return fsspec.core.url_to_fs(url)[0]


def _reason(error: BaseException) -> str:
    return str(error).splitlines()[0] if str(error) else type(error).__name__


def _check_output_bucket(output: str) -> None:
    if not output.startswith("gs://"):
        return
    bucket = _bucket(output)
    try:
        exists = _filesystem(output).exists(bucket)
    except Exception as error:
        reason = _reason(error)
        raise UserError(f"output: cannot look up bucket gs://{bucket} ({reason}); check your credentials") from None
    if not exists:
        raise UserError(
            f"output: bucket gs://{bucket} of {output} does not exist; create it "
            f"(gcloud storage buckets create gs://{bucket}) or choose another"
        )


def _check_writable(flag: str, location: str) -> None:
    """Write and delete a tiny object under ``location``: what Dataflow does there first."""
    bucket = _bucket(location)
    fs = _filesystem(location)
    probe = f"{location.rstrip('/')}/.xarray-tfrecords-write-check-{uuid.uuid4().hex[:8]}"
    try:
        if not fs.exists(bucket):
            raise UserError(f"{flag}={location}: bucket gs://{bucket} does not exist; create it or choose another")
        fs.pipe(probe, b"ok")
        fs.rm(probe)
    except UserError:
        raise
    except Exception as error:
        raise UserError(
            f"{flag}={location}: cannot write there ({_reason(error)}); choose a bucket this account can write to"
        ) from None


def _check_dask_scheduler(options: PipelineOptions) -> None:
    """The scheduler answers and has workers, within --dask_connection_timeout (else the build would fail after
    planning, with the output already cleared, or wait for ever).

    Dask's own timeout bounds the connection only: its handshake waits for ever on an address that accepts
    connections and never answers (a port forwarded to nothing, a stopped scheduler's host), and a client of a
    cluster without workers waits for them without a word. So the whole check runs under one deadline.
    """
    from apache_beam.runners.dask.dask_runner import DaskOptions

    dask = options.view_as(DaskOptions)
    if not (dask.address or dask.scheduler_file):
        raise UserError(
            "DaskRunner needs the cluster's scheduler: --dask_client_address=tcp://HOST:PORT "
            "(or --dask_scheduler_file=FILE); see docs/guides/dask.md"
        )
    timeout = _dask_timeout(dask.timeout)
    if dask.scheduler_file and not os.path.isfile(os.path.expanduser(dask.scheduler_file)):
        raise UserError(
            f"--dask_scheduler_file={dask.scheduler_file} does not exist; start the scheduler with "
            f"--scheduler-file {dask.scheduler_file} first, or fix the path"
        )
    where = dask.address or dask.scheduler_file
    flag = "--dask_client_address" if dask.address else "--dask_scheduler_file"
    try:
        threads = _run_coroutine(_ask_dask_scheduler(dask.address, dask.scheduler_file, timeout))
    except _Stopped:
        raise Cancelled("the build was interrupted") from None
    except _NoDaskWorkers:
        worker = f"dask worker {dask.address}" if dask.address else f"dask worker --scheduler-file {where}"
        raise UserError(
            f"DaskRunner: the Dask cluster at {where} has no workers (none joined within {timeout:g} s); "
            f"start some ({worker}, or cluster.scale(N)), or give queued ones longer "
            "with --dask_connection_timeout=SECONDS"
        ) from None
    except (OSError, ValueError) as error:  # TimeoutError is an OSError
        reason = _reason(error) if str(error) else f"no answer within {timeout:g} s"
        raise UserError(
            f"DaskRunner: no Dask scheduler answers at {where} ({reason}); start the cluster first, "
            f"or fix {flag} (--dask_connection_timeout=SECONDS waits longer)"
        ) from None
    remember_dask_threads(dask.address, dask.scheduler_file, threads)


class _NoDaskWorkers(Exception):
    """The scheduler answered, and no worker joined it in time."""


def _dask_timeout(chosen) -> float:
    """Seconds the scheduler check may take: --dask_connection_timeout, or Dask's own connect timeout (30 s)."""
    if chosen is None:
        from dask.config import get
        from dask.utils import parse_timedelta

        return float(parse_timedelta(get("distributed.comm.timeouts.connect"), default="seconds"))
    if not isinstance(chosen, int) or chosen <= 0:  # Beam's parser turns a value that is no integer into a sentinel
        raise UserError("--dask_connection_timeout: give a whole number of seconds, at least 1 (e.g. 30)")
    return float(chosen)


def _run_coroutine(coroutine):
    """Run ``coroutine`` to its end: here, or in a thread of its own where this thread runs an event loop (Jupyter)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coroutine).result()


async def _ask_dask_scheduler(address: str | None, scheduler_file: str | None, timeout: float) -> int:
    """The threads of the cluster's workers, once at least one has joined; the whole exchange within ``timeout``."""
    from distributed import Client

    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    client = Client(
        address=address, scheduler_file=scheduler_file, asynchronous=True, timeout=timeout, set_as_default=False
    )
    try:
        await _unless_stopped(asyncio.wait_for(client, timeout))
        try:
            await _unless_stopped(client.wait_for_workers(1, timeout=max(deadline - loop.time(), 0.001)))
        except TimeoutError:  # (Dask's WorkerStartTimeoutError is one)
            raise _NoDaskWorkers from None
        remaining = max(deadline - loop.time(), 0.001)
        return sum((await _unless_stopped(asyncio.wait_for(client.nthreads(), remaining))).values())
    finally:
        with contextlib.suppress(Exception):  # closing must not hide the answer, nor wait on a silent scheduler
            await asyncio.wait_for(client.close(), CLOSE_WAIT)


#: Seconds between two looks for a stop (Ctrl-C, SIGTERM) while the scheduler check waits.
STOP_POLL = 0.1


class _Stopped(Exception):
    """A stop came while the scheduler check waited (raised as Cancelled outside the event loop)."""


async def _unless_stopped(awaitable):
    """``awaitable``'s result; a stop ends the wait at once, so that a stopped build unwinds and cleans up in its
    own time instead of its stop's grace."""
    task = asyncio.ensure_future(awaitable)
    try:
        while not task.done():
            await asyncio.wait({task}, timeout=STOP_POLL)
            if is_stopped() and not task.done():
                raise _Stopped
        return task.result()
    finally:
        task.cancel()


#: Seconds to wait for a Dask client of the scheduler check to close.
CLOSE_WAIT = 2.0
