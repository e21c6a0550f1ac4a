"""The Beam graph of a build, and running it: plan, choose the write strategy, refuse or clear the output, run.

The whole graph is ``build_pipeline``; each stage is one composite PTransform in transforms/,
built from its spec (planning.specs).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
from collections.abc import Sequence
from typing import TextIO

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.runner import PipelineResult

from pipelines.output import (
    committed_generations,
    prepare_append,
    prepare_output,
    record_complete,
    remove_run_files,
)
from pipelines.output_lock import open_private_folder, output_lock
from pipelines.preflight import check_remote_setup
from pipelines.progress import ProgressLine
from pipelines.remote_job import RemoteJob
from pipelines.runners import (
    DATAFLOW_RUNNER,
    RunOptions,
    close_run,
    fit_local_threads,
    is_dask_runner,
    is_dry_run,
    is_local_runner,
    load_runner_options,
    local_threads_chosen,
    new_pipeline,
    runner_context,
    runner_name,
    submission_temp_dir,
    unit_ranges,
    with_runner_defaults,
)
from pipelines.stopping import RunCleanup, clean_up_on_stop, watch_job, watched_job
from planning.config import BuildConfig, with_absolute_paths
from planning.inputs.probe_cache import load_probes, save_probes
from planning.plan import BuildPlan, make_plan
from planning.positions import check_time_features_unchanged
from planning.run.cancellation import allow_writes, cancel_writes, check_stopped
from planning.run.contracts import METRICS_NAMESPACE
from planning.run.manifest import Manifest
from planning.run.names import INVENTORY_FILE, join, run_dir, work_dir
from planning.sampling import Unit, Units
from planning.specs import StageSpecs, compile_specs, field_spec, finalize_spec, run_files, tendency_spec
from planning.write_strategy import WriteStrategy, choose_write_strategy, lay_out
from schemas.errors import UserError
from schemas.metadata import load_schema
from schemas.schema import Schema
from schemas.urls import is_remote
from transforms import compat
from transforms.cut import CutSamples
from transforms.field import ComputeFieldStats, field_summary
from transforms.files import write_atomically
from transforms.finalize import Finalize, check_owns_output, finalize_output
from transforms.in_place import check_disk_space, reserve_shards
from transforms.stats import ComputeStats, MergeSummaries, merge_by_name
from transforms.streamed import StreamBlocks
from transforms.tendency import ComputeTendency, tendency_summary
from transforms.unit_runs import WriteUnitRuns, shard_results, unit_summaries
from transforms.units import DEFAULT_RANGES, EnumerateUnits
from transforms.write import WriteShards

logger = logging.getLogger(__name__)


#: build_pipeline's stages, as a dry run reports them: each block's stages apart, or a unit's in one step.
OUTLINE = "EnumerateUnits -> SpreadUnits -> CutSamples -> (WriteShards, ComputeStats) -> Finalize"
STREAMED_OUTLINE = "EnumerateUnits -> SpreadUnits -> CutAndWrite (cut, write, summarise each unit; commit)"
UNIT_RUNS_OUTLINE = "EnumerateShards -> SpreadShards -> CutAndWriteRuns (a shard's units, in order) -> Finalize"

#: Dataflow refuses a job graph (the pipeline proto it is sent) larger than this.
DATAFLOW_GRAPH_LIMIT = 10_000_000


def build_pipeline(
    pipeline: beam.Pipeline,
    units: Units | Sequence[Unit],
    specs: StageSpecs,
    ranges: int = DEFAULT_RANGES,
    stream_blocks: bool = False,
) -> beam.PCollection:
    """Wire the stages (docs/design.md, the data flow); returns the PCollection of the committed schema.

    ``units``: the plan's (the graph holds ``ranges`` ranges of their numbers, and the units
    themselves only without ``specs.units_file``), or a list of units, which the graph holds.
    ``stream_blocks``: cut, write and summarise each unit in one step (transforms.streamed), for
    runners that hold a stage's whole output at once (Beam's DaskRunner); the same bytes.
    """
    tendency = None
    if specs.tendency is not None:  # stats.tendency: the source's pairs of steps, read by units of their own
        tendency = (
            pipeline
            | "EnumerateTendencyUnits" >> EnumerateUnits(specs.tendency.plan.units, specs.tendency.units_file, ranges)
            | "SpreadTendencyUnits" >> beam.Reshuffle()
            | "ComputeTendency" >> ComputeTendency(specs.tendency)
        )
    field = None
    if specs.field is not None:  # stats.over: field: the source's steps and cells, read by units of their own
        field = (
            pipeline
            | "EnumerateFieldUnits" >> EnumerateUnits(specs.field.plan.units, specs.field.units_file, ranges)
            | "SpreadFieldUnits" >> beam.Reshuffle()
            | "ComputeFieldStats" >> ComputeFieldStats(specs.field)
        )
    # The statistics read from the source by units of their own: {split: SplitSummary} elements.
    of_source = [branch for branch in (tendency, field) if branch is not None]
    if len(of_source) > 1:
        of_source = [tuple(of_source) | "JoinSourceStats" >> beam.Flatten()]
    if specs.write.strategy is WriteStrategy.UNIT_RUNS:  # shuffle.mode: read: a shard's units cut by its writer
        if not isinstance(units, Units):
            raise TypeError("shuffle.mode: read's shards are runs of the plan's Units, not of a list of units")
        parts = pipeline | "WriteUnitRuns" >> WriteUnitRuns(
            specs.cut, specs.write, specs.stats, units, specs.units_file, ranges
        )
        summaries = unit_summaries(parts) | "MergeSummaries" >> MergeSummaries(specs.stats.units)
        if of_source:
            summaries = (summaries, *of_source) | "JoinTendency" >> beam.Flatten()
        return (shard_results(parts), summaries) | "Finalize" >> Finalize(specs.finalize)
    if isinstance(units, Units):
        enumerate_units = EnumerateUnits(units, specs.units_file, ranges)
    else:
        enumerate_units = beam.Create(list(units), reshuffle=False)
    spread = (
        pipeline
        | "EnumerateUnits" >> enumerate_units  # Unit
        | "SpreadUnits" >> beam.Reshuffle()  # Unit, spread over workers (a fusion break, not the shuffle)
    )
    if stream_blocks:  # Schema, one element, once committed
        inputs = (spread, *of_source) if of_source else spread
        return inputs | "CutAndWrite" >> StreamBlocks(specs.cut, specs.write, specs.stats, specs.finalize)
    blocks = spread | "CutSamples" >> CutSamples(specs.cut)  # Block: one unit's samples and counts
    shards = blocks | "WriteShards" >> WriteShards(specs.write)  # ShardResult, one per shard written
    summaries = blocks | "ComputeStats" >> ComputeStats(specs.stats)  # {split: SplitSummary}, one element
    if of_source:
        summaries = (summaries, *of_source) | "JoinTendency" >> beam.Flatten()
    return (shards, summaries) | "Finalize" >> Finalize(specs.finalize)  # Schema, one element, once committed


def run_build(
    config: BuildConfig,
    beam_args: list[str],
    overwrite: bool = False,
    progress: TextIO | None = None,
    shared_filesystem: bool = False,
    counters: dict[str, int] | None = None,
    append: bool = False,
) -> tuple[BuildPlan, Schema | None]:
    """Plan, refuse or clear the output, run the pipeline; returns the plan and the written schema.

    A dry run (``--dry_run=True``) builds and validates the job graph, changes nothing and
    returns no schema, on any runner (Beam's runners other than Dataflow's have no dry run). ``progress``: a
    stream to draw the live line on (runs whose workers share the output's filesystem).
    ``shared_filesystem``: a remote runner's workers see this machine's files (a cluster on a
    shared parallel filesystem); local runs always do. ``counters``: filled with the run's Beam counters, by
    name, where the runner reports them. ``append``: add the input's steps the output does not hold as a new
    generation (planning.run.generations; NothingToAppend, before anything is written, when there are none).
    """
    fit_threads = not local_threads_chosen(beam_args)
    beam_args = with_runner_defaults(beam_args)
    with submission_temp_dir(PipelineOptions(beam_args)):
        return _run_build(config, beam_args, fit_threads, overwrite, progress, shared_filesystem, counters, append)


def _run_build(
    config: BuildConfig,
    beam_args: list[str],
    fit_threads: bool,
    overwrite: bool,
    progress: TextIO | None,
    shared_filesystem: bool,
    counters: dict[str, int] | None,
    append: bool,
) -> tuple[BuildPlan, Schema | None]:
    allow_writes()  # an earlier build in this process may have failed and refused its threads' writes
    watch_job(None)  # nor is an earlier build's job this one's
    check_stopped()  # stopped while Beam was being imported
    load_runner_options(beam_args)
    options = RunOptions(beam_args)
    compat.install()  # (a local run's workers are threads of this process: they run with its patches)
    check_remote_setup(options, config, shared_filesystem)
    pipeline = new_pipeline(options)
    FileSystems.set_options(options)
    dry_run = is_dry_run(options)
    local = is_local_runner(options)
    if shared_filesystem and not local:
        config = with_absolute_paths(config)  # the workers' working directory is not this one
    # One build at a time into an output (a dry run writes nothing, so it takes no lock).
    with contextlib.nullcontext() if dry_run else output_lock(config.output.path):
        inventory = join(config.output.path, INVENTORY_FILE)
        committed, held = None, None
        if append:
            as_json = config.model_dump(mode="json", by_alias=True)
            committed, held = committed_generations(config.output.path, as_json, restore=not dry_run)
        plan = make_plan(config, cached_probes=load_probes(inventory, config.input.concat_dim), held=held)
        if committed is not None:
            check_time_features_unchanged(committed.features, plan.schema.features)
        check_stopped()
        # A local output on a filesystem the workers share: bucket files, progress markers and
        # in-place writes need it. (A local run's work dir for a remote output is in local temp.)
        shared = local or (shared_filesystem and not is_remote(plan.output))
        work = work_dir(plan.output, plan.run_id) if shared else None
        if work is not None and is_remote(plan.output) and not dry_run:
            os.close(open_private_folder(os.path.dirname(work), "working folder"))
        if committed is not None and not plan.num_samples and not dry_run:
            return plan, _commit_without_samples(plan, committed)
        files = run_files(plan, run_dir(plan.output, plan.run_id))
        urls = {name: file for name, (file, _) in files.items()}
        ranges = unit_ranges(options, len(plan.units))
        # Dask's cut, write and summarise a unit in one step (transforms.streamed). Not local runs: its one combine
        # carries every unit's summaries, megabytes that Beam's multi-threaded local runner garbled ("Invalid
        # PaneInfoEncoding" in a 4x build). The cause, Beam's timed flush, is now turned off (pipelines.runners);
        # local runs on the streamed graph have not been measured since.
        streamed = is_dask_runner(options)
        outline = STREAMED_OUTLINE if streamed else OUTLINE
        write = choose_write_strategy(plan, work)
        if write.strategy is WriteStrategy.UNIT_RUNS:
            outline = UNIT_RUNS_OUTLINE
        write = dataclasses.replace(write, progress_shown=progress is not None)
        logger.info("records are written by %s: %s", write.strategy.value, write.reason)
        if dry_run:
            specs = compile_specs(plan, write, urls)
            # Only Dataflow's runner honours --dry_run; any other would run the graph, and build.
            with pipeline if runner_name(options) == DATAFLOW_RUNNER else contextlib.nullcontext():
                build_pipeline(pipeline, plan.units, specs, ranges, streamed)
                size = _checked_graph_size(pipeline, options)
                plan = dataclasses.replace(plan, job_graph_bytes=size, job_graph_outline=outline)
            return plan, None
        manifest = plan.manifest()
        check_stopped()  # a stop during planning: nothing written yet
        # A failed run removes what it wrote: a build, all of it; an append, its own shards only.
        mine, earlier = manifest, None
        if committed is not None:  # (a failed append puts the manifest before it back: it wrote nothing)
            manifest, earlier = prepare_append(plan.output, manifest, committed)
            mine = Manifest(frozenset(plan.shard_names), manifest.runs)
        else:
            prepare_output(plan.output, overwrite, manifest)
        save_probes(inventory, plan.concat_dim, plan.probes)
        # Removed once, by this thread unwinding or by a stop it does not answer in time (pipelines.stopping).
        cleanup = RunCleanup(functools.partial(_remove_run_files, plan.output, mine, work, earlier))
        clean_up_on_stop(cleanup)
        try:
            check_stopped()
            specs = compile_specs(plan, lay_out(plan, write), urls)
            if specs.write.layout is not None:
                check_disk_space(specs.write)
                reserve_shards(specs.write)
            if local and fit_threads:
                fit_local_threads(pipeline.options, _parallel_tasks(plan, specs))  # (Beam ran on a copy of options)
            for file, data in files.values():
                write_atomically(file.url, [data])
            with contextlib.ExitStack() as stack:
                stack.enter_context(runner_context(options))
                if progress is not None and specs.write.progress_dir is not None:
                    counts = (len(plan.units), plan.num_shards, plan.sources.total_bytes)
                    stack.enter_context(ProgressLine(specs.write.progress_dir, *counts, progress))
                build_pipeline(pipeline, plan.units, specs, ranges, streamed)
                plan = dataclasses.replace(plan, job_graph_outline=outline)
                if not local:  # a local run's runner weighs the graph it is given (pipelines.runners)
                    plan = dataclasses.replace(plan, job_graph_bytes=_checked_graph_size(pipeline, options))
                check_stopped()  # stopped while the graph was built: the pipeline does not start
                result = _run_and_wait(pipeline, options, local)
                if local:
                    weighed = getattr(pipeline.runner, "graph_bytes", None)
                    size = weighed if weighed is not None else job_graph_size(pipeline)
                    plan = dataclasses.replace(plan, job_graph_bytes=size)
                if counters is not None:
                    counters.update(run_counters(result))
            record_complete(plan.output, manifest)
        except BaseException as error:
            owned = cleanup()
            if not owned and isinstance(error, Exception):
                # Why it failed (its files gone, its run directory removed) is the other build's doing.
                check_owns_output(plan.output, plan.run_id)
            raise
        finally:
            clean_up_on_stop(None)
            job = watched_job()
            close_run(job.result if job is not None else None)
        return plan, load_schema(plan.output)


def _parallel_tasks(plan: BuildPlan, specs: StageSpecs) -> int:
    """How many of the run's steps could run at once: its units (the tendency's too), or its shards' sorts."""
    units = len(plan.units) + sum(len(extra.plan.units) for extra in (specs.tendency, specs.field) if extra is not None)
    if specs.write.strategy is WriteStrategy.UNIT_RUNS:  # (a shard's units are cut one after the other)
        units -= len(plan.units) - plan.num_shards
    return max(units, plan.num_shards if specs.write.bucket_dir is not None else 1)


def _commit_without_samples(plan: BuildPlan, committed: Schema) -> Schema:
    """An append whose new steps make no sample of any split: committed as a generation without shards.

    Its samples are counted as dropped, and the next append does not plan those steps again.
    """
    check_stopped()
    manifest, earlier = prepare_append(plan.output, plan.manifest(), committed)
    tendency, field = tendency_spec(plan), field_spec(plan)  # (its new steps may still add pairs, and values)
    summaries = merge_by_name(
        [tendency_summary(tendency) if tendency is not None else {}, field_summary(field) if field is not None else {}]
    )
    try:
        finalize_output(finalize_spec(plan), [], summaries)
    except BaseException:
        remove_run_files(plan.output, Manifest(frozenset(), manifest.runs), None, earlier)
        raise
    record_complete(plan.output, manifest)
    return load_schema(plan.output)


def _run_and_wait(pipeline: beam.Pipeline, options: PipelineOptions, local: bool) -> PipelineResult:
    """Run the pipeline and wait for it to end; a remote job is watched: a stop, or the clean-up, cancels it first."""
    result = pipeline.run()
    if not local:
        # Closed (a Dask client) only after the clean-up, which may have to cancel the job first.
        watch_job(RemoteJob(result, runner_name(options).rsplit(".", 1)[-1]))
        check_stopped()  # stopped while the job was submitted: it is cancelled as the run's files are removed
    result.wait_until_finish()
    return result


def run_counters(result: PipelineResult) -> dict[str, int]:
    """The finished run's counters of ours, by name (committed values; none where the runner keeps none)."""
    try:
        found = result.metrics().query(MetricsFilter().with_namespace(METRICS_NAMESPACE))["counters"]
    except Exception:  # a runner without metrics (Beam's DaskRunner): the summary goes without
        return {}
    out: dict[str, int] = {}
    for counter in found:
        value = counter.committed if counter.committed is not None else counter.attempted
        out[counter.key.metric.name] = out.get(counter.key.metric.name, 0) + int(value or 0)
    return out


def _remove_run_files(output: str, manifest: Manifest, work: str | None, earlier: bytes | None = None) -> bool:
    """Remove what a failed or stopped run wrote, once no write of it runs any more; whether the output was its own."""
    # Other worker threads may still be writing: stop them first, or they would write again
    # into what is being removed.
    if not cancel_writes():
        logger.warning("writes still running after the wait; what they leave, --overwrite removes")
    job = watched_job()
    if job is not None and not job.stop():
        # A job that still runs would write again into what is removed, or commit shards that are gone.
        logger.warning("%s; its files were left (--overwrite removes them once it has stopped)", job.problem)
        return True
    return remove_run_files(output, manifest, work, earlier)


def job_graph_size(pipeline: beam.Pipeline) -> int:
    """Bytes of the job graph a runner is sent: the pipeline's runner-API proto, every stage pickled in it."""
    return len(pipeline.to_runner_api().SerializeToString())


def _checked_graph_size(pipeline: beam.Pipeline, options: PipelineOptions) -> int:
    """The job graph's size; refused for Dataflow over its limit, before it is submitted."""
    size = job_graph_size(pipeline)
    if runner_name(options) == DATAFLOW_RUNNER and size > DATAFLOW_GRAPH_LIMIT:
        raise UserError(
            f"job graph: {size / 1e6:,.1f} MB, over Dataflow's limit of {DATAFLOW_GRAPH_LIMIT / 1e6:.0f} MB; "
            "build fewer variables or features at a time (one config each), or use another runner"
        )
    return size
