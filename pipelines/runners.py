"""Choosing the Beam runner, and checking a remote runner's setup before anything is submitted."""

from __future__ import annotations

import argparse
import contextlib
import difflib
import io
import os

from apache_beam.options.pipeline_options import GoogleCloudOptions, PipelineOptions, StandardOptions
from apache_beam.runners.runner import create_runner

from planning.config import BuildConfig
from schemas.errors import UserError
from schemas.urls import is_remote

_LOCAL_RUNNERS = {None, "DirectRunner", "FnApiRunner", "BundleBasedDirectRunner"}


def check_known_flags(beam_args: list[str], own_parser: argparse.ArgumentParser) -> None:
    """Refuse a flag that neither this tool nor Beam knows: Beam would drop it with a log line only.

    Beam's own option parser (handed over by ``get_all_options``) decides what is Beam's.
    """
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


def runner_name(options: PipelineOptions) -> str | None:
    runner = options.view_as(StandardOptions).runner
    return runner if isinstance(runner, str) or runner is None else type(runner).__name__


def is_local_runner(options: PipelineOptions) -> bool:
    return runner_name(options) in _LOCAL_RUNNERS


def is_dry_run(options: PipelineOptions) -> bool:
    return bool(options.get_all_options().get("dry_run"))


#: Threads of a local run when the user chooses none: units overlap their file reads, numpy work
#: and writes (netCDF access itself is serialised per process). Measured on 2 cores: 2 threads
#: beat 1 by about a fifth, and a third thread only adds contention.
MAX_LOCAL_THREADS = 4


def with_local_defaults(beam_args: list[str]) -> list[str]:
    """Beam arguments with this tool's default local execution: one thread per core, up to 4."""
    chosen = any(a.startswith(("--direct_num_workers", "--direct_running_mode")) for a in beam_args)
    if chosen or not is_local_runner(PipelineOptions(beam_args)):
        return beam_args
    threads = max(1, min(os.cpu_count() or 1, MAX_LOCAL_THREADS))
    return [*beam_args, f"--direct_num_workers={threads}", "--direct_running_mode=multi_threading"]


def make_runner(options: PipelineOptions):
    """The runner to use: for local runs the FnApiRunner, chosen directly.

    Beam's DirectRunner first tries to download the Prism runner, which waits on the network
    (and fails offline) before falling back to the FnApiRunner; choosing it directly makes a
    local run start at once. It honours --direct_num_workers and --direct_running_mode.
    """
    if is_local_runner(options):
        from apache_beam.runners.portability.fn_api_runner import fn_runner

        return fn_runner.FnApiRunner()
    return options.view_as(StandardOptions).runner


def check_remote_setup(options: PipelineOptions, config: BuildConfig) -> None:
    """Fail in one line, before submission, on a remote-runner setup that cannot work."""
    if is_local_runner(options):
        return
    runner = runner_name(options)
    try:
        create_runner(runner)
    except ValueError as error:  # an unknown name: Beam lists the ones it knows
        raise UserError(f"--runner={runner} is not a runner Beam knows. {str(error).split('. ', 1)[-1]}") from None
    if not is_remote(config.output.path):
        raise UserError(
            f"output: {config.output.path} is a local path, but {runner} runs on remote workers that cannot "
            "write there; use a gs:// output"
        )
    local_inputs = [p for p in config.input.paths if not is_remote(p)]
    if local_inputs:
        raise UserError(
            f"input: {local_inputs[0]} is a local path, but {runner} runs on remote workers that cannot read it; "
            "copy the files to gs:// and give that path"
        )
    if runner == "DataflowRunner":
        cloud = options.view_as(GoogleCloudOptions)
        if not cloud.temp_location:
            raise UserError("DataflowRunner needs --temp_location=gs://BUCKET/tmp (where Dataflow stages its files)")
        if not is_remote(cloud.temp_location):
            raise UserError(f"--temp_location={cloud.temp_location} is local; DataflowRunner needs a gs:// path")
        for flag, value in (("--project", cloud.project), ("--region", cloud.region)):
            if not value:
                raise UserError(f"DataflowRunner needs {flag} (e.g. --project=my-project --region=us-central1)")
