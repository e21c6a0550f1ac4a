"""The Beam graph of a build and running it: plan, refuse or clear the output, run, read back the schema."""

from __future__ import annotations

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions

from schemas.dataset import load_schema
from schemas.schema import Schema
from transforms.config import BuildConfig
from transforms.cut import CutSamples
from transforms.encode import EncodeAndBucket
from transforms.finalize import Finalize
from transforms.output import bucket_dir, prepare_output
from transforms.plan import BuildPlan, make_plan
from transforms.shards import WriteShards
from transforms.stats import ComputeStats

_LOCAL_RUNNERS = {None, "DirectRunner", "FnApiRunner", "BundleBasedDirectRunner"}


def is_local_runner(options: PipelineOptions) -> bool:
    return options.view_as(StandardOptions).runner in _LOCAL_RUNNERS


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


def build_pipeline(pipeline: beam.Pipeline, plan: BuildPlan, local: bool):
    """Wire the stages (DESIGN.md, data flow); returns the PCollection of the committed schema."""
    blocks = (
        pipeline
        | "EnumerateUnits" >> beam.Create(list(plan.units))
        | "SpreadUnits" >> beam.Reshuffle()
        | "CutSamples" >> CutSamples(plan)
    )
    shards = (
        blocks
        | "EncodeAndBucket" >> EncodeAndBucket(plan, bucket_dir(plan.output, plan.run_id) if local else None)
        | "WriteShards" >> WriteShards(plan)
    )
    moments = blocks | "ComputeStats" >> ComputeStats([v.name for v in plan.variables])
    return shards | "Finalize" >> Finalize(plan, moments)


def run_build(config: BuildConfig, beam_args: list[str], overwrite: bool = False) -> tuple[BuildPlan, Schema]:
    """Plan, refuse or clear the output, run the pipeline; returns the plan and the written schema."""
    plan = make_plan(config)
    prepare_output(plan.output, overwrite)
    options = PipelineOptions(beam_args)
    with beam.Pipeline(runner=make_runner(options), options=options) as pipeline:
        build_pipeline(pipeline, plan, is_local_runner(options))
    return plan, load_schema(plan.output)
