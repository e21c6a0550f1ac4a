"""How records reach their shards, chosen once per build by ``choose_write_strategy``."""

from __future__ import annotations

import enum

from planning.plan import BuildPlan
from schemas.urls import is_remote

#: Above this many samples the in-place layout's arrays (about 20 bytes a sample on the
#: driver) are not worth holding; such builds use bucket files.
MAX_IN_PLACE_SAMPLES = 20_000_000


class WriteStrategy(enum.Enum):
    #: each unit writes its records at their final offsets in preallocated shards (planning.layout)
    IN_PLACE = "in place"
    #: each unit writes one bucket file per shard; only (shard, path) goes through GroupByKey
    BUCKET_FILES = "bucket files"
    #: each unit's bucket bytes go through the runner's GroupByKey to the shard writers
    RUNNER_SHUFFLE = "runner shuffle"


def choose_write_strategy(plan: BuildPlan, shared_filesystem: bool) -> tuple[WriteStrategy, str]:
    """The build's write strategy and why; ``shared_filesystem``: every worker sees the driver's disk.

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
                              GroupByKey (DESIGN.md, decision 3); shard writers read the files.
    ``RUNNER_SHUFFLE``        distributed runners whose workers share no disk (Dataflow; Dask,
                              Flink, ... without --shared_filesystem): their shuffle is built
                              for bulk bytes.
    ========================  =================================================================
    """
    if not shared_filesystem:
        return WriteStrategy.RUNNER_SHUFFLE, "workers share no filesystem: records ride the runner's shuffle"
    reason = _why_not_in_place(plan)
    if reason is None:
        return WriteStrategy.IN_PLACE, "records are written at offsets laid out at planning"
    return WriteStrategy.BUCKET_FILES, reason


def _why_not_in_place(plan: BuildPlan) -> str | None:
    output = plan.config.output
    if not output.in_place:
        return "output.in_place is false"
    if is_remote(plan.output):
        return "the output is a URL: records cannot be written at offsets there"
    if plan.config.nan_policy == "drop":
        return "nan_policy: drop decides on the workers which samples are written"
    if output.examples_per_record > 1 or output.compression:
        return "packed or compressed records are only laid out after the shard's sort"
    if any(f.dtype == "int64" for f in plan.schema.features if f.role in ("variable", "aux_coord")):
        return "integer variables or coords are varint-encoded: their records' sizes depend on the data"
    if plan.grid.num_samples > MAX_IN_PLACE_SAMPLES:
        return f"more than {MAX_IN_PLACE_SAMPLES:,} samples"
    return None
