"""ComputeFieldStats: per split and variable, the moments of every step and cell of the split's region, each once.

stats.over: field summarises the source, not the samples: each (cell, step) of a split's selected
region counts once, whatever the sample windows, strides, offsets and roles (as GraphCast and
anemoi normalise), like stats.tendency's pairs (transforms.tendency). Its own units
(planning.plan.FieldPlan) read slabs of steps; the values are summarised as stored (cast to the
record dtype) with the build's Moments, merged in unit order like the other statistics. With
nan_policy: fill, a NaN is counted as filled (the record would hold the fill), else as a NaN; the
sample counts still come from the blocks (transforms.stats).
"""

from __future__ import annotations

import dataclasses

import apache_beam as beam
import numpy as np

from planning.reads.source_index import SourceIndex
from planning.run.cancellation import check_stopped
from planning.sampling import Unit
from planning.specs import FieldSpec
from transforms.cut import read_box, to_record_dtype, with_run_files
from transforms.stats import MergeSummaries, Moments, SplitSummary, keyed_part, merge_by_name
from transforms.tendency import source_reader


def field_moments(spec: FieldSpec, sources: SourceIndex, unit: Unit) -> dict[str, dict[str, Moments]]:
    """Per split, per variable, the moments of the steps and cells ``unit`` owns."""
    plan, cut = spec.plan, spec.cut
    grid, concat_dim, split_dim = plan.grid, plan.concat_dim, plan.split_dim
    box = grid.source_box(unit)
    starts = {a.dim: start for a, (start, _) in zip(grid.grid_axes, unit.ranges)}
    slabs = read_box(cut, sources, box, source_reader(cut, concat_dim, sources), f"field unit {unit.index}")
    out: dict[str, dict[str, Moments]] = {}
    for variable in cut.variables:
        values = slabs.values.pop(variable.name)
        # A variable without a dim the units split is the same in every unit along it: the first ones count it.
        if any(start != plan.firsts[dim] for dim, start in starts.items() if dim not in variable.dims):
            continue
        if concat_dim not in variable.dims and not plan.counts_static:
            continue  # (a static field: in the first generation's statistics already)
        stored = to_record_dtype(values, variable, unit, cut.allow_float32_overflow)
        if concat_dim in variable.dims:
            counted = plan.counted(*box[concat_dim])
            stored = np.compress(counted, stored, axis=variable.dims.index(concat_dim))
        nan = None
        if cut.nan_policy == "fill" and stored.dtype.kind == "f":
            nan = np.isnan(stored)
            nan = nan if nan.any() else None
        keep = [variable.dims.index(d) for d in spec.per if d in variable.dims]
        if split_dim not in variable.dims:  # (a static field, or one without input.new_dim: in every split)
            which = {index: None for index in range(len(plan.splits))}
        else:
            labels = plan.labels(*box[split_dim])
            if split_dim == concat_dim:
                labels = labels[counted]
            which = {index: labels == index for index in np.unique(labels[labels >= 0])}
        axis = variable.dims.index(split_dim) if split_dim in variable.dims else None
        for index, mine in which.items():
            values, filled = stored, nan
            if mine is not None and not mine.all():
                values = np.compress(mine, values, axis=axis)
                filled = None if nan is None else np.compress(mine, nan, axis=axis)
            split = spec.split_names[index]
            out.setdefault(split, {})[variable.name] = Moments.of(values, keep, filled)
    return out


def _summaries(moments: dict[str, dict[str, Moments]]) -> dict[str, SplitSummary]:
    return {split: SplitSummary(by_variable) for split, by_variable in moments.items()}


class _FieldFn(beam.DoFn):
    def __init__(self, spec: FieldSpec):
        self._spec = spec.for_workers()

    def setup(self):
        self._spec = dataclasses.replace(self._spec, cut=with_run_files(self._spec.cut))

    def process(self, unit: Unit):
        check_stopped()
        summary = _summaries(field_moments(self._spec, self._spec.cut.sources, unit))
        yield keyed_part(unit.index, summary)


@dataclasses.dataclass
class ComputeFieldStats(beam.PTransform):
    """Field units -> one {split: SplitSummary with only moments} dict, merged in unit order."""

    spec: FieldSpec

    def expand(self, units):
        merge = MergeSummaries()
        return units | "SummarizeField" >> beam.ParDo(_FieldFn(self.spec)) | "MergeField" >> merge


def field_summary(spec: FieldSpec) -> dict[str, SplitSummary]:
    """ComputeFieldStats' result computed here, unit by unit in order (an append that adds steps but no sample)."""
    spec = dataclasses.replace(spec, cut=with_run_files(spec.cut))
    return merge_by_name(_summaries(field_moments(spec, spec.cut.sources, unit)) for unit in spec.plan.units)
