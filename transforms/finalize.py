"""Finalize: check the counts, then write stats.json, parser.py and, last, schema.json.

schema.json is the output's commit marker (DESIGN.md, decision 5): it is written only after
every shard is in place and the record count equals the number of samples cut, so a reader
that finds it finds a complete dataset.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Iterable

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from schemas.parser_codegen import render_parser
from schemas.schema import PARSER_FILE, SCHEMA_FILE, STATS_FILE, Schema, Shard
from transforms.output import TMP_DIR, join, shard_name, write_atomically
from transforms.plan import BuildPlan
from transforms.shards import ShardResult
from transforms.stats import Moments, stats_document

logger = logging.getLogger(__name__)


def complete_splits(plan: BuildPlan, results: Iterable[ShardResult], split: str = "data") -> tuple[Shard, ...]:
    """Every shard of the split in order; a shard that received no sample is written empty."""
    by_index = {r.shard: r for r in results if r.split == split}
    shards = []
    for index in range(plan.num_shards):
        result = by_index.get(index)
        if result is None:
            name = shard_name(split, index, plan.num_shards)
            write_atomically(join(plan.output, name), [])
            result = ShardResult(split, index, name, 0, 0)
        shards.append(Shard(result.file, result.records, result.bytes))
    return tuple(shards)


def finalize_output(
    plan: BuildPlan, results: list[ShardResult], moments: dict[str, Moments], bucket_dir: str | None = None
) -> Schema:
    """Complete the output once every shard is written; returns the schema it committed."""
    shards = complete_splits(plan, results)
    written = sum(s.records for s in shards)
    if written != plan.num_samples:
        raise RuntimeError(
            f"{plan.output}: {written} records written but {plan.num_samples} samples planned; "
            "schema.json not written. This is a bug, please report it"
        )
    schema = dataclasses.replace(
        plan.schema,
        splits={"data": shards},
        counts={
            **plan.schema.counts,
            "samples_cut": plan.num_samples,
            "samples_dropped": plan.schema.counts.get("samples_dropped_at_gaps", 0),
            "records_written": written,
        },
    )
    variables = [v.name for v in plan.variables]
    write_atomically(join(plan.output, STATS_FILE), [json.dumps(stats_document(moments, variables), indent=2).encode()])
    write_atomically(join(plan.output, PARSER_FILE), [render_parser(schema, plan.output).encode()])
    write_atomically(join(plan.output, SCHEMA_FILE), [schema.dumps().encode()])
    for temporary in {join(plan.output, TMP_DIR), bucket_dir} - {None}:
        if FileSystems.exists(temporary):
            FileSystems.delete([temporary])
    return schema


def _finalize(results: list[ShardResult], plan: BuildPlan, moments: dict[str, Moments], bucket_dir) -> Schema:
    return finalize_output(plan, results, moments, bucket_dir)


class Finalize(beam.PTransform):
    """Shard results + the merged statistics -> the written schema (one element)."""

    def __init__(self, plan: BuildPlan, moments, bucket_dir: str | None = None):
        super().__init__()
        self._plan = plan
        self._moments = moments
        self._bucket_dir = bucket_dir

    def expand(self, results):
        return (
            results
            | "CollectShards" >> beam.combiners.ToList()
            | "WriteMetadata"
            >> beam.Map(_finalize, self._plan, beam.pvalue.AsSingleton(self._moments), self._bucket_dir)
        )
