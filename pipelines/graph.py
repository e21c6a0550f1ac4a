"""The Beam graph of a build, and running it: plan, choose the write strategy, refuse or clear the output, run.

The whole graph is ``build_pipeline``; each stage is one composite PTransform in transforms/,
built from its spec (planning.specs).
"""

from __future__ import annotations

import contextlib
import logging
from typing import TextIO

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions

from pipelines.output import prepare_output, remove_temporary_files
from pipelines.progress import ProgressLine
from pipelines.runners import check_remote_setup, is_dry_run, is_local_runner, make_runner, with_local_defaults
from planning.config import BuildConfig
from planning.layout import plan_layout
from planning.names import INVENTORY_FILE, join, sources_path, work_dir
from planning.plan import BuildPlan, make_plan
from planning.probe_cache import load_probes, save_probes
from planning.sampling import Unit
from planning.specs import StageSpecs, compile_specs
from planning.write_strategy import WriteStrategy, choose_write_strategy
from schemas.dataset import load_schema
from schemas.errors import UserError
from schemas.schema import Schema
from transforms.cut import CutSamples
from transforms.finalize import Finalize
from transforms.in_place import preallocate
from transforms.shards import use_anonymous_credentials_for_emulator, write_atomically
from transforms.stats import ComputeStats
from transforms.write import WriteShards

logger = logging.getLogger(__name__)


def build_pipeline(pipeline: beam.Pipeline, units: list[Unit], specs: StageSpecs) -> beam.PCollection:
    """Wire the stages (DESIGN.md, data flow); returns the PCollection of the committed schema."""
    blocks = (
        pipeline
        | "EnumerateUnits" >> beam.Create(units)  # Unit
        | "SpreadUnits" >> beam.Reshuffle()  # Unit, spread over workers (a fusion break, not the shuffle)
        | "CutSamples" >> CutSamples(specs.cut)  # Block: one unit's samples and counts
    )
    shards = blocks | "WriteShards" >> WriteShards(specs.write)  # ShardResult, one per shard written
    summaries = blocks | "ComputeStats" >> ComputeStats(specs.stats)  # {split: SplitSummary}, one element
    return shards | "Finalize" >> Finalize(specs.finalize, summaries)  # Schema, one element, once committed


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
    dry_run = is_dry_run(options)
    inventory = join(config.output.path, INVENTORY_FILE)
    plan = make_plan(config, cached_probes=load_probes(inventory, config.input.concat_dim))
    local = is_local_runner(options)
    strategy, reason = choose_write_strategy(plan, shared_filesystem=local)
    logger.info("records are written by %s: %s", strategy.value, reason)
    work = work_dir(plan.output, plan.run_id) if local else None
    sources = sources_path(plan.output, plan.run_id)
    if dry_run:
        with pipeline:
            build_pipeline(pipeline, list(plan.units), compile_specs(plan, strategy, work, None, sources))
        return plan, None
    prepare_output(plan.output, overwrite)
    save_probes(inventory, plan.concat_dim, plan.probes)
    try:
        layout = plan_layout(plan, join(work, "layout")) if strategy is WriteStrategy.IN_PLACE else None
        specs = compile_specs(plan, strategy, work, layout, sources)
        write_atomically(sources, [plan.sources.to_bytes()])
        if layout is not None:
            preallocate(specs.write)
        with contextlib.ExitStack() as stack:
            if progress is not None and specs.write.progress_dir is not None:
                total = plan.sources.total_bytes
                stack.enter_context(
                    ProgressLine(specs.write.progress_dir, len(plan.units), plan.num_shards, total, progress)
                )
            with pipeline:
                build_pipeline(pipeline, list(plan.units), specs)
    except BaseException:
        remove_temporary_files(plan.output, plan.run_id, work)
        raise
    return plan, load_schema(plan.output)


def _validated_pipeline(options: PipelineOptions) -> beam.Pipeline:
    """The pipeline object; Beam validates the options here, before any planning or submission."""
    try:
        return beam.Pipeline(runner=make_runner(options), options=options)
    except ValueError as error:
        problems = [line.strip() for line in str(error).splitlines()[1:] if line.strip()]
        if not problems:
            raise
        raise UserError(f"Beam options: {'; '.join(problems)}") from None
