"""ComputeTendency: per variable, the moments of x(t+1) - x(t) along the concat dim over the reference split's pairs.

stats.tendency summarises the source's pairs of consecutive steps, not the samples': each pair
(t, t + 1) of the reference split a regular step apart, at every cell of the selected region,
counted once whatever the sample windows, strides and offsets (a residual model's normalisation
is the dataset's, as anemoi and GraphCast compute it). Its own units (planning.plan.TendencyPlan)
read a slab along the concat dim and the step after it; the differences are taken of the values
as stored (cast to the record dtype), in float64, and summarised with the build's Moments, merged
in unit order like the other statistics. A pair with a NaN or inf is counted apart (nan_count,
inf_count), as any value is.
"""

from __future__ import annotations

import dataclasses

import apache_beam as beam
import numpy as np

from planning.reads.slabs import SelectionReader, files_reader
from planning.reads.source_index import SourceIndex
from planning.run.cancellation import check_stopped
from planning.sampling import Unit
from planning.specs import CutSpec, TendencySpec
from transforms.cut import read_box, to_record_dtype, with_run_files
from transforms.stats import MergeSummaries, Moments, SplitSummary, keyed_part
from transforms.units import load_run_file


def source_reader(cut: CutSpec, concat_dim: str, sources: SourceIndex):
    """How a unit of the source's own grid (not the samples') is read: the store's chunks, or the selected files."""
    if cut.zarr_store is not None:
        from planning.reads.zarr_reads import StoreReader  # here: zarr loads only for a store's build

        return StoreReader(
            cut.zarr_store, concat_dim, cut.zarr_missing_chunks, cut.selection, snapshot=cut.zarr_snapshot
        )
    if cut.grib is not None:
        from planning.reads.grib_reads import GribReader  # here: cfgrib loads only for a GRIB build

        return SelectionReader(GribReader(sources, concat_dim, cut.grib), cut.selection)
    return SelectionReader(files_reader(sources, concat_dim), cut.selection)


def tendency_moments(spec: TendencySpec, sources: SourceIndex, unit: Unit) -> dict[str, Moments]:
    """Per variable along the concat dim, the moments of the differences of the pairs ``unit`` owns."""
    plan, cut = spec.plan, spec.cut
    grid, concat_dim = plan.grid, plan.concat_dim
    box = grid.source_box(unit)
    first, stop = plan.unit_pairs(unit)
    pairs = plan.pairs[first:stop]
    starts = {a.dim: start for a, (start, _) in zip(grid.grid_axes, unit.ranges)}
    slabs = read_box(cut, sources, box, source_reader(cut, concat_dim, sources), f"tendency unit {unit.index}")
    out = {}
    for variable in cut.variables:
        values = slabs.values.pop(variable.name)
        if concat_dim not in variable.dims:
            continue  # (a static field has no tendency)
        # A variable without a dim the units split is the same in every unit along it: the first one counts it.
        if any(start for dim, start in starts.items() if dim not in variable.dims):
            continue
        axis = variable.dims.index(concat_dim)
        stored = to_record_dtype(values, variable, unit, cut.allow_float32_overflow)
        difference = np.diff(stored.astype(np.float64), axis=axis)
        if not pairs.all():
            difference = np.compress(pairs, difference, axis=axis)
        if plan.members is not None and plan.split_dim in variable.dims:
            low, high = box[plan.split_dim]
            difference = np.compress(plan.members[low:high], difference, axis=variable.dims.index(plan.split_dim))
        keep = [variable.dims.index(d) for d in spec.per if d in variable.dims]
        out[variable.name] = Moments.of(difference, keep)
    return out


class _TendencyFn(beam.DoFn):
    def __init__(self, spec: TendencySpec):
        self._spec = spec.for_workers()

    def setup(self):
        self._spec = with_tendency_files(self._spec)

    def process(self, unit: Unit):
        check_stopped()
        moments = tendency_moments(self._spec, self._spec.cut.sources, unit)
        summary = {self._spec.split: SplitSummary({}, tendency=moments)}
        yield keyed_part(unit.index, summary)


@dataclasses.dataclass
class ComputeTendency(beam.PTransform):
    """Tendency units -> one {reference split: SplitSummary with only ``tendency``} dict, merged in unit order."""

    spec: TendencySpec

    def expand(self, units):
        merge = MergeSummaries()
        return units | "SummarizeTendency" >> beam.ParDo(_TendencyFn(self.spec)) | "MergeTendency" >> merge


def with_tendency_files(spec: TendencySpec) -> TendencySpec:
    """The spec with what it left in the run's files (the cut's, and the plan's pairs) loaded, once per process."""
    spec = dataclasses.replace(spec, cut=with_run_files(spec.cut))
    if spec.pairs_file is not None:
        plan = load_run_file(spec.pairs_file, spec.plan.with_pairs)
        spec = dataclasses.replace(spec, plan=plan, pairs_file=None)
    return spec


def tendency_summary(spec: TendencySpec) -> dict[str, SplitSummary]:
    """ComputeTendency's result computed here, unit by unit in order (an append that adds steps but no sample)."""
    spec = with_tendency_files(spec)
    merged: dict[str, Moments] = {}
    for unit in spec.plan.units:
        for name, moments in tendency_moments(spec, spec.cut.sources, unit).items():
            merged[name] = merged[name].merge(moments) if name in merged else moments
    return {spec.split: SplitSummary({}, tendency=merged)}
