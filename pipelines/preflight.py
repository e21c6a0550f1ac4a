"""Checking a remote runner's setup before anything is submitted: paths, options, the Dask scheduler."""

from __future__ import annotations

import logging

from apache_beam.options.pipeline_options import GoogleCloudOptions, PipelineOptions
from apache_beam.runners.runner import create_runner

from pipelines.runners import DATAFLOW_RUNNER, is_dask_runner, is_local_runner, runner_name
from planning.config import BuildConfig
from schemas.errors import UserError
from schemas.urls import is_remote

logger = logging.getLogger(__name__)


def check_remote_setup(options: PipelineOptions, config: BuildConfig, shared_filesystem: bool = False) -> None:
    """Fail in one line, before planning or submission, on a remote-runner setup that cannot work.

    ``shared_filesystem``: the workers see this machine's filesystem (a cluster on a shared
    parallel filesystem), so local paths are allowed.
    """
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
    if not is_remote(cloud.temp_location):
        raise UserError(f"--temp_location={cloud.temp_location} is local; DataflowRunner needs a gs:// path")
    for flag, value in (("--project", cloud.project), ("--region", cloud.region)):
        if not value:
            raise UserError(f"DataflowRunner needs {flag} (e.g. --project=my-project --region=us-central1)")


def _reason(error: BaseException) -> str:
    return str(error).splitlines()[0] if str(error) else type(error).__name__


def _check_dask_scheduler(options: PipelineOptions) -> None:
    """The scheduler answers (else the build would fail after planning, with the output already cleared)."""
    from apache_beam.runners.dask.dask_runner import DaskOptions
    from distributed import Client

    dask = options.view_as(DaskOptions)
    if not (dask.address or dask.scheduler_file):
        raise UserError(
            "DaskRunner needs the cluster's scheduler: --dask_client_address=tcp://HOST:PORT "
            "(or --dask_scheduler_file=FILE); see the README, Running on a Dask cluster"
        )
    where = dask.address or dask.scheduler_file
    timeout = {"timeout": dask.timeout} if dask.timeout is not None else {}
    try:
        with Client(address=dask.address, scheduler_file=dask.scheduler_file, **timeout) as client:
            workers = len(client.scheduler_info().get("workers", {}))
    except (OSError, ValueError) as error:
        raise UserError(
            f"DaskRunner: no Dask scheduler answers at {where} ({_reason(error)}); start the cluster first, "
            "or fix --dask_client_address"
        ) from None
    if workers == 0:
        logger.warning("the Dask cluster at %s has no workers yet: the build waits until some join", where)
