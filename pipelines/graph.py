"""The Beam graph of a build and running it: plan, refuse or clear the output, run, read back the schema."""

from __future__ import annotations

import contextlib
import logging
import os
from typing import TextIO

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions

from pipelines.progress import ProgressLine
from pipelines.runners import check_remote_setup, is_dry_run, is_local_runner, make_runner, with_local_defaults
from schemas.dataset import load_schema
from schemas.errors import UserError
from schemas.schema import Schema
from transforms.config import BuildConfig
from transforms.cut import CutSamples
from transforms.encode import EncodeAndBucket
from transforms.finalize import Finalize
from transforms.gcs_emulator import use_anonymous_credentials_for_emulator
from transforms.in_place import WriteInPlace
from transforms.layout import ShardLayout, plan_layout, preallocate, why_not_in_place
from transforms.output import bucket_dir, prepare_output, remove_temporary_files
from transforms.plan import BuildPlan, make_plan
from transforms.shards import WriteShards
from transforms.stats import ComputeStats

logger = logging.getLogger(__name__)


def progress_dir(plan: BuildPlan) -> str:
    """Where a local run's progress markers go (inside its temporary bucket directory)."""
    return os.path.join(bucket_dir(plan.output, plan.run_id), "progress")


def build_pipeline(pipeline: beam.Pipeline, plan: BuildPlan, local: bool, layout: ShardLayout | None = None):
    """Wire the stages (DESIGN.md, data flow); returns the PCollection of the committed schema.

    With a ``layout``, units write their records in place (transforms.layout). Otherwise, on
    local runners, bucket files carry the records to the shard writers; on distributed runners
    the bucket bytes go through the runner's shuffle (DESIGN.md, decision 3).
    """
    buckets = bucket_dir(plan.output, plan.run_id) if local else None
    progress = progress_dir(plan) if local else None
    blocks = (
        pipeline
        | "EnumerateUnits" >> beam.Create(list(plan.units))
        | "SpreadUnits" >> beam.Reshuffle()
        | "CutSamples" >> CutSamples(plan)
    )
    if layout is not None:
        shards = blocks | "WriteInPlace" >> WriteInPlace(plan, layout, progress)
    else:
        shards = (
            blocks
            | "EncodeAndBucket" >> EncodeAndBucket(plan, buckets, progress)
            | "WriteShards" >> WriteShards(plan, progress)
        )
    summaries = blocks | "ComputeStats" >> ComputeStats([s.name for s in plan.splits], plan.config.stats.per)
    return shards | "Finalize" >> Finalize(plan, summaries, buckets)


def run_build(
    config: BuildConfig, beam_args: list[str], overwrite: bool = False, progress: TextIO | None = None
) -> tuple[BuildPlan, Schema | None]:
    """Plan, refuse or clear the output, run the pipeline; returns the plan and the written schema.

    A dry run (``--dry_run=True``, DataflowRunner) builds and validates the job graph, changes
    nothing and returns no schema. ``progress``: a stream to draw the live line on (local runs).
    """
    options = PipelineOptions(with_local_defaults(beam_args))
    use_anonymous_credentials_for_emulator()
    check_remote_setup(options, config)
    pipeline = _validated_pipeline(options)
    FileSystems.set_options(options)
    plan = make_plan(config)
    dry_run = is_dry_run(options)
    local = is_local_runner(options)
    layout = None
    if not dry_run:
        prepare_output(plan.output, overwrite)
        reason = why_not_in_place(plan, local)
        if reason is None:
            layout = plan_layout(plan, os.path.join(bucket_dir(plan.output, plan.run_id), "layout"))
            preallocate(plan, layout)
        else:
            logger.info("records go through bucket files or the runner's shuffle: %s", reason)
    try:
        with contextlib.ExitStack() as stack:
            if progress is not None and local:
                input_bytes = sum(f.nbytes for f in plan.files)
                line = ProgressLine(progress_dir(plan), len(plan.units), plan.num_shards, input_bytes, progress)
                stack.enter_context(line)
            with pipeline:
                build_pipeline(pipeline, plan, local, layout)
    except BaseException:
        if not dry_run:
            remove_temporary_files(plan)
        raise
    return plan, None if dry_run else load_schema(plan.output)


def _validated_pipeline(options: PipelineOptions) -> beam.Pipeline:
    """The pipeline object; Beam validates the options here, before any planning or submission."""
    try:
        return beam.Pipeline(runner=make_runner(options), options=options)
    except ValueError as error:
        problems = [line.strip() for line in str(error).splitlines()[1:] if line.strip()]
        if not problems:
            raise
        raise UserError(f"Beam options: {'; '.join(problems)}") from None
