"""How records reach their shards, chosen once per build by ``choose_write_strategy``, and what that write needs."""

from __future__ import annotations

import dataclasses
import enum

from planning.layout import ShardLayout, plan_layout
from planning.plan import BuildPlan
from planning.run.names import join, run_dir
from schemas.urls import is_remote

#: Above this many samples the in-place layout's arrays (about 20 bytes a sample on the
#: driver) are not worth holding; such builds use bucket files.
MAX_IN_PLACE_SAMPLES = 20_000_000


class WriteStrategy(enum.Enum):
    #: each unit writes its records at their final offsets in the shards (planning.layout)
    IN_PLACE = "in place"
    #: each unit writes one bucket file per shard; only (shard, path) goes through GroupByKey
    BUCKET_FILES = "bucket files"
    #: each unit writes one spill object of its buckets; only (shard, object, byte range) goes through GroupByKey
    SPILL_OBJECTS = "spill objects"
    #: shuffle.mode: read: one worker writes each shard whole from its run of units, in order (planning.unit_runs)
    UNIT_RUNS = "unit runs"


@dataclasses.dataclass(frozen=True)
class WritePlan:
    """What the write stage needs besides the plan: its strategy (and why), its working folder, its layout."""

    strategy: WriteStrategy
    reason: str
    #: a folder every worker sees: bucket files, progress markers and the layout go there (the
    #: driver's filesystem, shared; or, for spill objects, the output's own ``_tmp/<run>/`` URL)
    work_dir: str | None = None
    layout: ShardLayout | None = None  # IN_PLACE, once laid out
    #: whether a live progress line reads the markers (none is shown with --quiet): without one, none is written
    progress_shown: bool = True

    @property
    def bucket_dir(self) -> str | None:
        return join(self.work_dir, "buckets") if self.strategy is WriteStrategy.BUCKET_FILES else None

    @property
    def spill_dir(self) -> str | None:
        return join(self.work_dir, "spill") if self.strategy is WriteStrategy.SPILL_OBJECTS else None

    @property
    def progress_dir(self) -> str | None:
        # Markers are local files the driver's live line reads: none in a URL, none that nothing reads (a file
        # made for each unit: at 4x the benchmark's, 0.1-0.3 s of the kernel's inode allocation).
        if not self.progress_shown or self.work_dir is None or is_remote(self.work_dir):
            return None
        return join(self.work_dir, "progress")


def choose_write_strategy(plan: BuildPlan, work_dir: str | None) -> WritePlan:
    """The build's write strategy, why, and where its working files go; decides only, writes nothing.

    ``work_dir``: a folder every worker sees (they share the driver's filesystem), or None. An
    ``IN_PLACE`` write is laid out next, once the output is the run's (``lay_out``).

    ========================  =================================================================
    strategy                  when
    ========================  =================================================================
    ``IN_PLACE``              workers share the output's local filesystem (the local runner, or a
                              cluster with --shared_filesystem), output.in_place is
                              true, and every record's size and shard are known at planning: no
                              nan_policy: drop, no packing, no compression, no integer
                              variables, at most MAX_IN_PLACE_SAMPLES samples. Every byte is
                              written once; no sort stage.
    ``BUCKET_FILES``          workers share a filesystem, otherwise. The local runner holds every
                              grouped value in memory, so bulk bytes must not ride its
                              GroupByKey (docs/design.md, decision 3); shard writers read the files.
    ``SPILL_OBJECTS``         workers share no filesystem (Dataflow, Dask without
                              --shared_filesystem, Flink, Spark): each unit writes one object under
                              the output's own ``_tmp/<run>/`` holding its buckets back to back,
                              and only references to them ride the runner's GroupByKey. A
                              runner's shuffle is billed by the byte (Dataflow Shuffle), and
                              Beam's DaskRunner lists a key's values in one worker's memory.
    ``UNIT_RUNS``             shuffle.mode: read, on any runner: a worker writes each shard whole
                              from its run of consecutive units (planning.unit_runs), streaming,
                              in place locally or as one object; nothing is sorted or spilled.
    ========================  =================================================================
    """
    if plan.shuffle_mode == "read":
        reason = "shuffle.mode: read: each shard is written whole from its run of units, in unit order"
        return WritePlan(WriteStrategy.UNIT_RUNS, reason, work_dir)
    if work_dir is None:
        reason = "workers share no filesystem: one spill object a unit under the output's _tmp/, references shuffled"
        return WritePlan(WriteStrategy.SPILL_OBJECTS, reason, run_dir(plan.output, plan.run_id))
    reason = _why_not_in_place(plan)
    if reason is not None:
        return WritePlan(WriteStrategy.BUCKET_FILES, reason, work_dir)
    return WritePlan(WriteStrategy.IN_PLACE, "records are written at offsets laid out at planning", work_dir)


def lay_out(plan: BuildPlan, write: WritePlan) -> WritePlan:
    """The write ready to run: an ``IN_PLACE`` one with every record's shard and offset computed
    and saved under its work dir (planning.layout); any other as it is."""
    if write.strategy is not WriteStrategy.IN_PLACE:
        return write
    return dataclasses.replace(write, layout=plan_layout(plan, join(write.work_dir, "layout")))


def _why_not_in_place(plan: BuildPlan) -> str | None:
    if not plan.in_place:
        return "output.in_place is false"
    if is_remote(plan.output):
        return "the output is a URL: records cannot be written at offsets there"
    if plan.nan_policy == "drop":
        return "nan_policy: drop decides on the workers which samples are written"
    if plan.examples_per_record > 1 or plan.compression:
        return "packed or compressed records are only laid out after the shard's sort"
    if any(f.dtype == "int64" for f in plan.schema.features if f.role in ("variable", "aux_coord")):
        return "integer variables or coords are varint-encoded: their records' sizes depend on the data"
    if plan.grid.num_samples > MAX_IN_PLACE_SAMPLES:
        return f"more than {MAX_IN_PLACE_SAMPLES:,} samples"
    return None
