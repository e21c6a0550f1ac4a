"""Finalize: check the counts, then commit: generations.json, stats.json, parser.py and, last, schema.json.

schema.json is the output's commit marker (docs/design.md, decision 5): it is written only after every
shard is in place and each split's written samples equal the samples cut less those dropped for NaN, so a
reader that finds it finds a complete dataset. The other files are written under the run's directory first and
renamed into place just before it (``commit``), so a failure while writing them changes nothing.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import posixpath
from collections.abc import Iterable, Iterator, Sequence

import apache_beam as beam
import numpy as np
from apache_beam.io.filesystems import FileSystems

from planning.features import (
    CHANNEL_AXIS_KEY,
    CHANNELS_KEY,
    CROP_KEY,
    ROLE_KEY,
    STEPS_KEY,
    channel_feature,
    is_role_stack,
    variable_of,
)
from planning.run import generations
from planning.run.contracts import NonFinite, ShardResult
from planning.run.generations import GENERATIONS_FILE
from planning.run.manifest import Manifest
from planning.run.names import MANIFEST_FILE, TMP_DIR, join, new_temporary_token, shard_path, temporary_path
from planning.run.shard_counts import ShardCounts
from planning.specs import FinalizeSpec
from planning.splits import SplitPlan
from schemas.errors import UserError
from schemas.grid_file import split_grid
from schemas.parser_codegen import render_parser
from schemas.schema import GRID_FILE, PARSER_FILE, SCHEMA_FILE, SHARDS_FILE, STATS_FILE, Feature, Schema, Shard
from schemas.shards import COUNTS, Generation, ShardTable
from schemas.urls import is_remote
from transforms.compat import use_anonymous_credentials_for_emulator
from transforms.files import (
    make_durable,
    read_bytes,
    remove_if_empty,
    remove_tree,
    write_atomically,
    write_index,
)
from transforms.stats import Moments, SplitSummary, merge_by_name, per_axes, summary_from_json, summary_to_json
from transforms.units import load_run_file

logger = logging.getLogger(__name__)


def complete_split(
    spec: FinalizeSpec, split: SplitPlan, reported: ShardCounts
) -> tuple[Generation, dict[str, np.ndarray]]:
    """The split's shards of this generation: their naming rule and every shard's counts in order (arrays, not a
    Shard object each); a shard that received no sample is written empty."""
    seen, counts = reported.dense(split.name, split.num_shards)
    for number in np.flatnonzero(~seen).tolist():
        path = shard_path(spec.output, split.name, number, split.num_shards, spec.compression, split.generation)
        counts["bytes"][number] = write_atomically(path, [], spec.compression)
        if not spec.compression:
            write_index(path, [])
    # Every writer names its shards by schemas.shards.shard_name, with an index beside each unless gzipped: what
    # schema.json will say of all of them, checked on one, and on whether each came with an index.
    rule = Generation(split.generation, split.num_shards, spec.compression, not spec.compression, 0, 0, 0)
    named = reported.named(split.name)
    if named is not None:
        number, file, index = named
        expected = rule.file(split.name, number)
        if file != expected or reported.indexed(split.name) - {rule.index}:
            raise RuntimeError(
                f"{spec.output}: split {split.name}: a write stage reported shard {file} (index {index}) where the "
                f"naming rule says {expected} (index: {rule.index}); schema.json not written. This is a bug, please "
                "report it"
            )
    return rule, counts


def _table(spec: FinalizeSpec, reported: ShardCounts) -> ShardTable:
    """This generation's shards of every split, by rule, with their counts."""
    completed = {split.name: complete_split(spec, split, reported) for split in spec.splits}
    joined = {key: np.concatenate([_NONE, *(c[key] for _, c in completed.values())]) for key in COUNTS}
    return ShardTable.from_arrays({name: (rule,) for name, (rule, _) in completed.items()}, joined)


def _appended(committed: Schema, written: ShardTable) -> dict[str, Sequence[Shard]]:
    """Every split's shards of every generation: the committed ones', then this one's.

    An output of the first format (every shard listed) whose shards follow the naming rule, as every build of
    this tool names them, is committed in the second: by rule, counts in the sidecar. Listed only where any does
    not (then what schema.json lists is all that says where they are)."""
    earlier = committed.shard_table or ShardTable.from_shards(committed.splits)
    if earlier is None:
        return {name: (*committed.splits.get(name, ()), *written.split(name)) for name in written.rules}
    rules = {name: (*earlier.rules.get(name, ()), *written.rules[name]) for name in written.rules}
    joined = {
        key: np.concatenate(
            [
                _NONE,
                *(part for name in rules for part in (_counts_of(earlier, name, key), written.split(name).counts(key))),
            ]
        )
        for key in COUNTS
    }
    table = ShardTable.from_arrays(rules, joined)
    return {name: table.split(name) for name in rules}


#: No shard's counts (what a split without shards joins with).
_NONE = np.zeros(0, dtype=np.int64)


def _counts_of(table: ShardTable, split: str, key: str) -> np.ndarray:
    return table.split(split).counts(key) if split in table.rules else _NONE


def _variables_json(spec: FinalizeSpec, moments: dict[str, Moments]) -> dict:
    per = spec.stats.per
    out = {}
    for variable in spec.variables:
        _, dims = per_axes(variable.feature.dims, per)
        m = moments.get(variable.name)
        out[variable.name] = m.to_json(dims) if m is not None else None
    return out


def _broadcast(feature: Feature, values: np.ndarray, per: list[str]) -> np.ndarray:
    """Per-dim statistics arranged to broadcast against one sample of the feature."""
    _, dims = per_axes(feature.dims, per)
    in_feature_order = [d for d in feature.dims if d in dims]
    values = np.transpose(values, [dims.index(d) for d in in_feature_order]) if dims else values
    return values.reshape([feature.shape[i] if d in dims else 1 for i, d in enumerate(feature.dims)])


def normalization(
    spec: FinalizeSpec, moments: dict[str, Moments], everywhere: dict[str, Moments] | None = None
) -> dict:
    """(x - mean) / std per float feature, as arrays that broadcast against one sample.

    A constant field (std 0) or one without values keeps std 1, so it is only centred. With
    nan_policy: fill, ``filled`` says how a reader finds the filled points, which it sets after
    normalising rather than let the fill become (fill - mean) / std: by the feature's nan_mask
    when it has one, else as the values equal to the fill value, only where the fill value lies
    outside the range of the real values of every split (``everywhere``: their moments), which
    makes the test exact; elsewhere a filled point normalises like a real value (and, inside
    that range, stays within it).
    """
    per = spec.stats.per
    everywhere = everywhere or moments
    masks = {f.source["of"]: f.name for f in spec.schema.features if f.role == "mask"}

    def arrays(name: str, feature: Feature) -> tuple[np.ndarray, np.ndarray]:
        m = moments[name]
        mean = np.where(m.count > 0, m.mean, 0.0)
        std = np.sqrt(m.variance)
        std = np.where(np.isfinite(std) & (std > 0), std, 1.0)
        return _broadcast(feature, mean, per), _broadcast(feature, std, per)

    def by_value(name: str, feature: Feature) -> tuple[np.ndarray, int]:
        """Where a value equal to the fill can only be a filled one, and how many were filled."""
        m = everywhere.get(name)
        if m is None:
            return _broadcast(feature, np.zeros(np.shape(moments[name].count), dtype=bool), per), 0
        fill = np.float32(spec.fill_value)  # as stored
        outside = (fill < m.minimum) | (fill > m.maximum)
        return _broadcast(feature, outside, per), int(np.sum(m.filled_count))

    def filled(feature: Feature, names: list[str], axis: int | None = None) -> dict | None:
        if spec.fill_value is None:
            return None
        if feature.name in masks:
            return {"mask": masks[feature.name]}
        pairs = [by_value(n, by_name[n].feature) for n in names]
        if not sum(count for _, count in pairs):
            return None
        where = pairs[0][0] if axis is None else np.stack([w for w, _ in pairs], axis=axis)
        if not where.any():
            return None
        return {"equal_to": float(np.float32(spec.fill_value)), "where": where.tolist()}

    out = {}
    by_name = {v.name: v for v in spec.variables}
    stacked = {name for stack in spec.stacks for name in stack.variables}
    # Each feature of a variable's values (with sample.roles, each role's; its variable's moments serve all).
    role_features = [f for f in spec.schema.features if ROLE_KEY in f.source]
    features_of = {v.name: [v.feature] for v in spec.variables}
    if role_features:
        features_of = {v.name: [f for f in role_features if variable_of(f) == v.name] for v in spec.variables}
    for variable in spec.variables:
        if variable.feature.dtype == "float32" and variable.name not in stacked and variable.name in moments:
            for feature in features_of[variable.name]:
                mean, std = arrays(variable.name, feature)
                out[feature.name] = {"mean": mean.tolist(), "std": std.tolist()}
                how = filled(feature, [variable.name])
                if how:
                    out[feature.name]["filled"] = how
    for stack in spec.stacks:
        if stack.feature.dtype != "float32" or not all(n in moments for n in stack.variables):
            continue
        pairs = [arrays(n, by_name[n].feature) for n in stack.variables]
        axis = 0 if stack.axis == 0 else -1
        out[stack.feature.name] = {
            "mean": np.stack([m for m, _ in pairs], axis=axis).tolist(),
            "std": np.stack([s for _, s in pairs], axis=axis).tolist(),
        }
        how = filled(stack.feature, list(stack.variables), axis)
        if how:
            out[stack.feature.name]["filled"] = how
    for feature in spec.schema.features:  # layout.stack within a role: each channel its variable's
        names = feature.source.get(CHANNELS_KEY, []) if is_role_stack(feature) else []
        if feature.dtype != "float32" or not names or not all(n in moments for n in names):
            continue
        pairs = [arrays(n, channel_feature(feature)) for n in names]
        axis = 0 if feature.source[CHANNEL_AXIS_KEY] == 0 else -1
        out[feature.name] = {
            "mean": np.stack([m for m, _ in pairs], axis=axis).tolist(),
            "std": np.stack([s for _, s in pairs], axis=axis).tolist(),
        }
        how = filled(feature, list(names), axis)
        if how:
            out[feature.name]["filled"] = how
    return out


def derived_nonfinite(spec: FinalizeSpec, summaries: dict[str, SplitSummary]) -> dict[str, NonFinite]:
    """Each derived variable's NaN and inf values over every split; refuses one without a finite value."""
    totals = merge_by_name(summary.nonfinite for summary in summaries.values())
    for variable in spec.variables:
        n = totals.get(variable.name)
        if n is not None and n.values and n.nan + n.inf == n.values:
            raise UserError(
                f"input.preprocess: {variable.feature.source.get('preprocess')} returned {variable.name!r} with no "
                f"finite value in the {n.values:,} values cut ({n.inf:,} inf, {n.nan:,} NaN, from unit "
                f"{n.first_unit} on); fix the function (an overflow inside it? compute in float64), or name its "
                "other outputs under `variables:`"
            )
    return {v.name: totals[v.name] for v in spec.variables if v.name in totals}


def _nonfinite_json(spec: FinalizeSpec, totals: dict[str, NonFinite]) -> dict:
    function = next(v.feature.source.get("preprocess") for v in spec.variables if v.name in totals)
    return {
        "description": (
            "the NaN and inf values of each variable input.preprocess returned, in the samples cut, before "
            "nan_policy; first_unit: the lowest work unit with one"
        ),
        "function": function,
        "variables": {name: dataclasses.asdict(n) for name, n in totals.items()},
    }


def _tendency_variables(spec: FinalizeSpec, tendency: dict[str, Moments]) -> dict:
    per = spec.stats.per
    return {
        v.name: tendency[v.name].to_json([d for d in per if d in v.dims]) for v in spec.variables if v.name in tendency
    }


#: The role whose features normalize="tendency" reads as residuals (sample.roles).
TARGET_ROLE = "targets"


def tendency_normalization(spec: FinalizeSpec, tendency: dict[str, Moments]) -> dict:
    """Per feature of the ``targets`` role whose every step's previous step the sample holds (in any role's
    feature of its variable, over its crop): ``(x - x_before - mean) / std`` with the tendency's moments.

    ``residual_of``: the feature holding x_before, and per axis of the feature (after the sample axis)
    the indices that take x_before from it, aligned with x.
    """
    per = spec.stats.per
    features = [f for f in spec.schema.features if ROLE_KEY in f.source]
    offsets = _concat_offsets(spec)
    out = {}
    for feature in features:
        name = variable_of(feature)
        m = tendency.get(name)
        variable = next((v for v in spec.variables if v.name == name), None)
        if feature.source[ROLE_KEY] != TARGET_ROLE or m is None or feature.dtype != "float32" or offsets is None:
            continue
        base = _residual_base(feature, features, offsets, spec.concat_dim)
        if base is None:
            continue
        dims = [d for d in per if d in variable.dims]
        mean = np.where(m.count > 0, m.mean, 0.0)
        std = np.sqrt(m.variance)
        std = np.where(np.isfinite(std) & (std > 0), std, 1.0)
        out[feature.name] = {
            "mean": _broadcast_dims(feature, mean, dims).tolist(),
            "std": _broadcast_dims(feature, std, dims).tolist(),
            "residual_of": base,
        }
    return out


def _concat_offsets(spec: FinalizeSpec) -> list[int] | None:
    """The offsets along the concat dim a sample takes (role features' steps index them); None: no offsets."""
    for axis in spec.schema.sample.get("axes", []):
        if axis["dim"] == spec.concat_dim and axis["role"] == "offsets":
            return list(axis["offsets"])
    return None


def _residual_base(feature: Feature, features: list[Feature], offsets: list[int], concat_dim: str) -> dict | None:
    """Where x_before of each of ``feature``'s steps is: {"feature": name, "take": [[axis, indices], ...]}; None
    when no feature of its variable holds every one of them over the feature's crop."""
    steps = feature.source.get(STEPS_KEY, {}).get(concat_dim)
    if steps is None or concat_dim not in feature.dims:
        return None
    before = [offsets.index(offsets[s] - 1) if offsets[s] - 1 in offsets else None for s in steps]
    if None in before:
        return None
    crop = feature.source.get(CROP_KEY, {})
    for other in features:
        held = other.source.get(STEPS_KEY, {}).get(concat_dim, [])
        if variable_of(other) != variable_of(feature) or not set(before) <= set(held):
            continue
        take, theirs = [], other.source.get(CROP_KEY, {})
        for axis, dim in enumerate(feature.dims):
            if dim == concat_dim:
                take.append([axis, [held.index(b) for b in before]])
            elif dim in crop or dim in theirs:
                full = [0, other.shape[axis]] if dim not in theirs else None
                mine, their = crop.get(dim, full), theirs.get(dim, full)
                if mine is None or not their[0] <= mine[0] <= mine[1] <= their[1]:
                    break  # (their crop does not cover this feature's)
                take.append([axis, list(range(mine[0] - their[0], mine[1] - their[0]))])
        else:
            return {"feature": other.name, "take": take}
    return None


def _broadcast_dims(feature: Feature, values: np.ndarray, dims: list[str]) -> np.ndarray:
    """Values over ``dims`` (in that order) arranged to broadcast against one sample of the feature."""
    in_feature_order = [d for d in feature.dims if d in dims]
    values = np.transpose(values, [dims.index(d) for d in in_feature_order]) if dims else values
    return values.reshape([feature.shape[i] if d in dims else 1 for i, d in enumerate(feature.dims)])


def _tendency_json(spec: FinalizeSpec, tendency: dict[str, Moments]) -> dict:
    return {
        "description": (
            "population statistics (ddof=0) of x(t+1) - x(t) along the concat dim over the reference split's pairs of "
            "consecutive steps a regular step apart (none across a gap or a split boundary), each pair once at every "
            "cell of the selected region, whatever the samples; differences of the stored values, in float64. "
            "`normalization`: load_dataset(..., normalize='tendency') applies it to residual features"
        ),
        "over": "field",
        "dim": spec.concat_dim,
        "reference_split": spec.reference_split,
        "variables": _tendency_variables(spec, tendency),
        "normalization": tendency_normalization(spec, tendency),
    }


#: stats.json's description of what its statistics count, by config stats.over (its `over` key).
STATS_DESCRIPTIONS = {
    "samples": (
        "population statistics (ddof=0) of the finite values the records store, accumulated in float64: each "
        "variable's values in every written sample (with sample.roles, the union of its role features' steps and "
        "crops), each once per sample holding it, so a value in overlapping samples counts once per sample; NaN "
        "and inf are counted apart, and so are the values nan_policy: fill filled (filled_count), which no "
        "statistic includes. `variables` and `normalization` come from the reference split"
    ),
    "field": (
        "population statistics (ddof=0) of the finite values of each split's selected region, as stored (float32), "
        "accumulated in float64: every grid point and step of the split once, whatever the samples' windows, "
        "offsets, roles or overlaps, samples dropped for NaN included; NaN and inf are counted apart, and so are "
        "the values nan_policy: fill fills (filled_count), which no statistic includes. `variables` and "
        "`normalization` come from the reference split"
    ),
}


def stats_document(
    spec: FinalizeSpec, summaries: dict[str, SplitSummary], nonfinite: dict[str, NonFinite] | None = None
) -> dict:
    """The content of stats.json; ``nonfinite``: derived variables' NaN and inf counts (derived_nonfinite)."""
    reference = spec.reference_split
    moments = summaries[reference].moments if reference in summaries else {}
    document = {
        "description": STATS_DESCRIPTIONS[spec.over],
        "over": spec.over,
        "reference_split": reference,
        "variables": _variables_json(spec, moments),
        "splits": {
            name: {"samples": s.cut - s.dropped_nan, "variables": _variables_json(spec, s.moments)}
            for name, s in summaries.items()
        },
        "normalization": normalization(spec, moments, merge_by_name(s.moments for s in summaries.values())),
    }
    tendency = summaries[reference].tendency if reference in summaries else {}
    if spec.tendency:
        document["tendency"] = _tendency_json(spec, tendency)
        for name, constants in document["tendency"]["normalization"].items():
            if "filled" in document["normalization"].get(name, {}):  # (found in x as stored, as without residuals)
                constants["filled"] = document["normalization"][name]["filled"]
    if nonfinite:
        document["preprocess"] = _nonfinite_json(spec, nonfinite)
    return document


def _check_counts(spec: FinalizeSpec, shards: ShardTable, summaries: dict[str, SplitSummary]) -> dict:
    counts = dict(spec.schema.counts)
    totals = {"samples_cut": 0, "samples_dropped_nan": 0, "samples_with_nan": 0, "examples_written": 0}
    for split in spec.splits:
        summary = summaries.get(split.name, SplitSummary({}))
        written = shards.total(split.name, "examples")
        if summary.cut != split.num_samples or written != summary.cut - summary.dropped_nan:
            raise RuntimeError(
                f"{spec.output}: split {split.name}: {split.num_samples} samples planned, {summary.cut} cut, "
                f"{summary.dropped_nan} dropped for NaN, {written} written; schema.json not written. "
                "This is a bug, please report it"
            )
        totals["samples_cut"] += summary.cut
        totals["samples_dropped_nan"] += summary.dropped_nan
        totals["samples_with_nan"] += summary.with_nan
        totals["examples_written"] += written
    if totals["examples_written"] == 0 and not spec.generation:  # (an append may add no sample: see below)
        raise UserError(
            f"{spec.output}: every one of the {totals['samples_cut']} samples had NaN values and nan_policy: drop "
            "dropped them all; check the data's fill values, or use nan_policy: fill or keep"
        )
    counts.update(totals)
    counts["samples_dropped"] = counts["samples_dropped_at_gaps"] + counts["samples_outside_splits"]
    counts["samples_dropped"] += totals["samples_dropped_nan"]
    counts["records_written"] = sum(shards.total(split, "records") for split in shards.rules)
    return counts


def _check_shards_exist(output: str, shards: Iterable[Shard]) -> None:
    """UserError unless every shard is in the output with the size its writer reported: none is committed missing.

    (A launcher stopped while its job ran removed the run's files; the job must not then commit
    a schema naming shards that are gone.)
    """
    found = {
        posixpath.basename(m.path): m.size_in_bytes for m in FileSystems.match([join(output, "*")])[0].metadata_list
    }
    for shard in shards:
        if shard.index is not None and shard.index not in found:
            raise UserError(
                f"output: {join(output, shard.index)} is missing (removed while the build ran), so schema.json was "
                "not written; build again with --overwrite"
            )
        size = found.get(shard.file)
        if size != shard.bytes:
            state = "is missing" if size is None else f"holds {size:,} bytes where {shard.bytes:,} were written"
            raise UserError(
                f"output: shard {join(output, shard.file)} {state} (its files were removed or changed while the "
                "build ran), so schema.json was not written; build again with --overwrite"
            )


def owns_output(output: str, run_id: str) -> bool:
    """Whether the output's manifest still names this run (no other build has cleared the output since)."""
    try:
        manifest = Manifest.loads(read_bytes(join(output, MANIFEST_FILE)).decode("utf-8", errors="replace"))
    except Exception:  # missing, unreadable or not a manifest of ours: then it names no run
        return False
    return manifest is not None and run_id in manifest.runs


def check_owns_output(output: str, run_id: str) -> None:
    """UserError unless this run still owns ``output``: a build must never commit or report an output it lost."""
    if not owns_output(output, run_id):
        raise UserError(
            f"output: another build replaced {output} while this one ran (its {MANIFEST_FILE} no longer "
            f"names run {run_id}), so this build committed nothing; run one build at a time into an output"
        )


def _earlier(spec: FinalizeSpec) -> tuple[Schema | None, list[dict]]:
    """The committed schema and generation records an append adds to (none for generation 0)."""
    if not spec.generation:
        return None, []
    committed = dataclasses.replace(
        Schema.loads(read_bytes(join(spec.output, SCHEMA_FILE)).decode()), location=spec.output
    )
    source = join(spec.output, GENERATIONS_FILE)
    if committed.sources.get("generations", 1) != spec.generation:
        raise UserError(
            f"output: {spec.output} holds {committed.sources.get('generations', 1)} generation(s), not the "
            f"{spec.generation} this append was planned on (another build committed meanwhile); run --append again"
        )
    recorded = committed.sources.get(generations.DIGEST_KEY)
    return committed, generations.loads(read_bytes(source).decode(), source, spec.generation, recorded)


def _summaries(entry: dict) -> dict[str, SplitSummary]:
    return {name: summary_from_json(data) for name, data in entry["splits"].items()}


def _summed(earlier: dict, counts: dict) -> dict:
    """Counts over every generation: the earlier ones' total and this one's, key by key."""
    return {key: earlier.get(key, 0) + value for key, value in counts.items()}


def _own_statistics(spec: FinalizeSpec, entries: list[dict]) -> list[dict]:
    """Each generation's own statistics per split, and the normalisation stats.json held once it was committed."""
    out, merged = [], {}
    for entry in entries:
        own = _summaries(entry)
        merged = merge_by_name([merged, own])
        reference = merged.get(spec.reference_split)
        everywhere = merge_by_name(s.moments for s in merged.values())
        out.append(
            {
                "generation": entry["generation"],
                "splits": {
                    name: {"samples": s.cut - s.dropped_nan, "variables": _variables_json(spec, s.moments)}
                    for name, s in own.items()
                },
                "normalization": normalization(spec, reference.moments if reference else {}, everywhere),
            }
        )
        if spec.tendency:
            mine = own.get(spec.reference_split)
            out[-1]["tendency"] = _tendency_variables(spec, mine.tendency if mine else {})
    return out


def finalize_output(
    spec: FinalizeSpec, results: ShardCounts | Iterable[ShardResult], summaries: dict[str, SplitSummary]
) -> Schema:
    """Complete the output once every shard is written; returns the schema it committed.

    An append (generation 1, 2, ...) commits the earlier generations' shards with its own, their
    counts summed and their statistics accumulators merged with its own (stats.json as a full
    build of every file writes it, within float64 rounding); generations.json keeps each one's.
    """
    check_owns_output(spec.output, spec.run_id)  # before anything is written over the other build's files
    committed, entries = _earlier(spec)
    written = _table(spec, results if isinstance(results, ShardCounts) else ShardCounts.of(results))
    _check_shards_exist(spec.output, _every_shard(written))  # this generation's
    counts = _check_counts(spec, written, summaries)
    record = {**spec.generation_record, "counts": counts}
    record["splits"] = {name: summary_to_json(s) for name, s in summaries.items()}
    entries = [*entries, record]
    totals = merge_by_name(_summaries(entry) for entry in entries)
    nonfinite = derived_nonfinite(spec, totals)
    shards = {name: written.split(name) for name in written.rules}
    if committed is not None:
        shards = _appended(committed, written)
        counts = _summed(committed.counts, counts)
    sources = {**spec.schema.sources, "generations": len(entries), generations.DIGEST_KEY: generations.digest(entries)}
    sample = dict(spec.schema.sample)
    if committed is not None and "num_samples" in sample:
        sample["num_samples"] += committed.sample.get("num_samples", 0)  # (planned: those of every generation)
    schema = dataclasses.replace(spec.schema, splits=shards, counts=counts, sources=sources, sample=sample)
    schema, grid = _grid_sidecar(spec, schema)
    stats = stats_document(spec, totals, nonfinite)
    stats["generations"] = _own_statistics(spec, entries)
    # What schema.json will name reaches the disk before it does (earlier generations' at their commit).
    make_durable(
        [join(spec.output, name) for shard in _every_shard(written) for name in (shard.file, shard.index) if name]
    )
    parser = render_parser(schema, spec.output, stats["normalization"], stats.get("tendency", {}).get("normalization"))
    contents = {
        GENERATIONS_FILE: generations.dumps(entries).encode(),
        STATS_FILE: json.dumps(stats, indent=2, allow_nan=False).encode(),
        PARSER_FILE: parser.encode(),
        **schema.files(),  # schema.json, and shards.npz where its shards are described by rule
    }
    if grid is not None:
        contents[GRID_FILE] = grid
    commit(spec.output, spec.run_dir, contents, keep_committed=committed is not None)
    for temporary in {spec.run_dir, spec.work_dir} - {None}:
        remove_tree(temporary, inside=spec.output if temporary == spec.run_dir else None)
    remove_if_empty(join(spec.output, TMP_DIR))
    return schema


def _every_shard(table: ShardTable) -> Iterator[Shard]:
    return (shard for name in table.rules for shard in table.split(name))


def _grid_sidecar(spec: FinalizeSpec, schema: Schema) -> tuple[Schema, bytes | None]:
    """The schema as schema.json holds it, and grid.npz's bytes (schemas.grid_file; None: no large grid entry).

    With the run's file of them (planning.specs.run_files) the spec's grid already refers to grid.npz and the
    bytes are read from there: the job graph never carried the values."""
    if spec.grid_file is None:
        return split_grid(schema)
    return schema, load_run_file(spec.grid_file, bytes)


#: Under a run's directory: the metadata it commits, written before any of it is renamed into place.
STAGED_DIR = "commit"
#: Under an append's run directory: the committed metadata its commit replaces, kept until the commit is whole.
KEPT_DIR = "committed"
#: The metadata a commit renames into place, in this order: schema.json, the commit marker, last (grid.npz only where
#: the grid has large entries; shards.npz only where schema.json describes its shards by rule).
COMMIT_ORDER = (GENERATIONS_FILE, STATS_FILE, PARSER_FILE, GRID_FILE, SHARDS_FILE, SCHEMA_FILE)


def commit(output: str, run: str, contents: dict[str, bytes], keep_committed: bool) -> None:
    """Write the metadata under the run's directory ``run``, then rename each into place, schema.json last.

    A failure while writing (a full disk) leaves the committed files as they were. An append first keeps
    the committed files it replaces: a failure between two renames puts them back here; a kill leaves
    them for the next run into the output to put back (restore_committed), and meanwhile each reader
    refuses the mix (the generated parser, load_stats and --verify check the commit they read).
    """
    staged = join(run, STAGED_DIR)
    names = [name for name in COMMIT_ORDER if name in contents]
    for name in names:
        try:
            write_atomically(join(staged, name), [contents[name]], durable=True)
        except OSError as error:
            if error.filename is not None:  # (named as the user knows it: where it is staged is this tool's business)
                error.filename = join(output, name)
            raise
    if keep_committed:
        _keep_committed(output, join(run, KEPT_DIR))
    try:
        for name in names:
            _replace(join(staged, name), join(output, name))
    except BaseException:
        if keep_committed:
            try:
                restore_committed(output, run)
            except Exception as error:  # the commit's error is the one to report; the next run puts them back
                logger.warning("could not put the committed metadata of %s back: %s", output, error)
        raise


def _keep_committed(output: str, kept: str) -> None:
    """Copies of the committed metadata under ``kept``, schema.json last (a complete copy has it).

    A retried commit finds the copies its first attempt made before renaming anything, and keeps those.
    """
    if FileSystems.exists(join(kept, SCHEMA_FILE)):
        return
    if not is_remote(kept):
        os.makedirs(kept, exist_ok=True)  # (a local copy makes no folder; object stores have none)
    for name in COMMIT_ORDER:
        if name != SCHEMA_FILE and not FileSystems.exists(join(output, name)):
            continue  # (one removed by hand: the commit writes it anew, and has nothing to put back)
        # Copied by the filesystem (an object store copies without the bytes passing through here: a large
        # output's schema.json lists every shard), under a temporary name: a copy cut short is never taken for one.
        temporary = temporary_path(join(kept, name), new_temporary_token())
        try:
            FileSystems.copy([join(output, name)], [temporary])
            make_durable([temporary])
            _replace(temporary, join(kept, name))
        finally:
            if FileSystems.exists(temporary):
                FileSystems.delete([temporary])


def _replace(source: str, destination: str) -> None:
    """Rename ``source`` over ``destination`` (locally atomic; an object store copies, replacing the object whole)."""
    FileSystems.rename([source], [destination])
    make_durable([destination])  # (locally: the directory's entry too; object stores already are)


def restore_committed(output: str, run: str) -> bool:
    """Put back the committed metadata a run's commit kept, if its commit never renamed schema.json; whether it did.

    The kept schema.json tells: while the output's is still byte for byte the one kept, the commit did
    not happen, and whatever it renamed before (generations.json, stats.json, parser.py) is replaced by
    the kept copy. Otherwise the commit is whole, and the copies are left for the run's clean-up.
    """
    kept = join(run, KEPT_DIR)
    try:
        marker = read_bytes(join(kept, SCHEMA_FILE))
    except Exception:  # none kept (or not whole): nothing was renamed
        return False
    try:
        if read_bytes(join(output, SCHEMA_FILE)) != marker:
            return False
    except Exception:  # no schema.json at all: not the output it was kept for
        return False
    for name in COMMIT_ORDER[:-1]:
        if FileSystems.exists(join(kept, name)):
            _replace(join(kept, name), join(output, name))
    FileSystems.delete([join(kept, SCHEMA_FILE)])
    logger.warning(
        "%s: put back the metadata of its last commit, which an append stopped during its commit had replaced", output
    )
    return True


def _finalize(collected: tuple[ShardCounts, dict[str, SplitSummary]], spec: FinalizeSpec) -> Schema:
    use_anonymous_credentials_for_emulator()
    results, summaries = collected
    return finalize_output(spec, results, summaries)


#: Tags of what Finalize joins: one ShardResult per shard written, and the merged split summaries.
SHARD, STATS = "shard", "stats"


def _tagged(value, tag: str) -> tuple:
    return tag, value


class _CollectFn(beam.CombineFn):
    """(tag, value) pairs -> (every shard's counts as arrays, the split summaries merged), as one element."""

    def create_accumulator(self):
        return ShardCounts(), {}

    def add_input(self, accumulator, element):
        results, summaries = accumulator
        tag, value = element
        if tag == SHARD:
            results.add(value)
            return results, summaries
        return results, merge_by_name([summaries, value])

    def merge_accumulators(self, accumulators):
        results, summaries = self.create_accumulator()
        for part, its in accumulators:
            results.absorb(part)
            summaries = merge_by_name([summaries, its])
        return results, summaries

    def extract_output(self, accumulator):
        return accumulator


@dataclasses.dataclass
class Finalize(beam.PTransform):
    """(shard results, merged split summaries) -> the written schema (one element).

    The two branches meet through a Flatten and one combine rather than a side input: Beam's
    DaskRunner evaluates a side input in a computation of its own, which would run everything
    upstream of it (cutting every unit) a second time.
    """

    spec: FinalizeSpec

    def expand(self, inputs):
        shards, summaries = inputs
        return (
            (
                shards | "TagShards" >> beam.Map(_tagged, SHARD),
                summaries | "TagStats" >> beam.Map(_tagged, STATS),
            )
            | "Join" >> beam.Flatten()
            # Without defaults: a global combine's default value is a side input (see above).
            | "Collect" >> beam.CombineGlobally(_CollectFn()).without_defaults()
            | "WriteMetadata" >> beam.Map(_finalize, self.spec)
        )
