"""The Beam stages in TestPipelines on the local FnApiRunner, and both shuffle paths of the graph."""

from __future__ import annotations

import io
import threading
import time

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.runners.portability.fn_api_runner import fn_runner
from apache_beam.testing import test_pipeline
from apache_beam.testing.util import assert_that, equal_to

from pipelines.graph import build_pipeline
from pipelines.output import prepare_output
from pipelines.runners import RunOptions, new_pipeline
from planning.config import parse_config
from planning.plan import make_plan
from planning.run.contracts import SAMPLE_ID
from planning.run.names import work_dir
from planning.specs import compile_specs, cut_spec, stats_spec
from planning.write_strategy import WritePlan, WriteStrategy, choose_write_strategy, lay_out
from schemas import load_schema
from schemas.example_codec import ExampleEncoder
from schemas.record_decoder import ExampleDecoder
from schemas.tfrecord import frame, read_records
from transforms.buckets.blobs import unpack_bucket
from transforms.buckets.sorting import SortedBuckets
from transforms.cut import CutSamples, HeldBytes, cut_unit
from transforms.encode import bucket_block
from transforms.merging import summary_tree
from transforms.stats import ComputeStats


def local_pipeline() -> test_pipeline.TestPipeline:
    # TestPipeline's default DirectRunner would first try to download Prism.
    return test_pipeline.TestPipeline(runner=fn_runner.FnApiRunner())


@pytest.fixture
def config(small_archive, tmp_path):
    return parse_config(
        {
            "input": {"paths": str(small_archive / "*.nc")},
            "variables": ["t", "q"],
            "sample": {"window": {"lat": 5, "lon": {"size": 6, "stride": 3}}, "keep": ["level"]},
            "output": {"path": str(tmp_path / "out"), "num_shards": 3},
        }
    )


@pytest.fixture
def plan(config):
    return make_plan(config)


def test_cut_samples_covers_every_sample_once(plan):
    assert len(plan.units) >= 1
    with local_pipeline() as p:
        ids = (
            p
            | beam.Create(list(plan.units))
            | CutSamples(cut_spec(plan))
            | beam.FlatMap(lambda block: block.samples[SAMPLE_ID].values.tolist())
        )
        assert_that(ids, equal_to(list(range(plan.num_samples))))


def test_compute_stats_equals_numpy_over_the_blocks(plan):
    blocks = [cut_unit(cut_spec(plan), plan.sources, unit) for unit in plan.units]
    expected = np.concatenate([b.samples["q"].values.reshape(-1) for b in blocks]).astype(np.float64)

    def check(results):
        (summaries,) = results
        q = summaries["data"].moments["q"]
        assert int(q.count) == expected.size
        assert float(q.mean) == pytest.approx(expected.mean(), rel=1e-12)
        assert float(q.variance) == pytest.approx(expected.var(), rel=1e-9)
        assert summaries["data"].cut == plan.num_samples

    with local_pipeline() as p:
        merged = p | beam.Create(blocks) | ComputeStats(stats_spec(plan))
        assert_that(merged, check)


def test_statistics_are_the_same_to_the_bit_in_any_order_of_the_blocks(small_archive, tmp_path, monkeypatch):
    """Runners deliver blocks in any order and bundle them as they like; float merges in another order differ in the
    last bits. ComputeStats's steps are called as a runner calls them (test_compute_stats_equals_numpy_over_the_blocks
    runs them in a pipeline): per block, grouped by key in arrival order, then the CombineFn's lifecycle (create, add,
    merge, extract) over bundles cut and merged in any order.
    """
    import transforms.stats as stats_module

    config = parse_config(
        {
            "input": {"paths": str(small_archive / "*.nc")},
            "variables": ["t", "q"],
            "sample": {"window": {"lat": 2, "lon": 2}, "keep": ["level"]},
            "stats": {"per": ["level"]},
            "output": {"path": str(tmp_path / "out"), "num_shards": 1},
        }
    )
    plan = make_plan(config, unit_budget_bytes=2e3)
    assert len(plan.units) > 20
    monkeypatch.setattr(summary_tree, "UNITS_PER_GROUP", 4)  # several groups, each merged apart
    monkeypatch.setattr(summary_tree, "GROUPS_PER_BRANCH", 2)  # ... and several branches of them
    spec = stats_spec(plan)
    # What SummarizeBlock makes of each block does not depend on the order: made once, then delivered in any order.
    keyed = [
        stats_module.keyed_summary(cut_unit(cut_spec(plan), plan.sources, unit), spec.split_names, spec.per)
        for unit in plan.units
    ]
    assert len({group for group, _ in keyed}) > 4

    def grouped(elements: list) -> dict[int, list]:  # a GroupByKey: each key's values in the order they arrived
        groups: dict[int, list] = {}
        for key, value in elements:
            groups.setdefault(key, []).append(value)
        return groups

    def run(order: list, rng: np.random.Generator) -> dict:
        groups = [stats_module._merge_group(group, parts) for group, parts in grouped(order).items()]
        groups = [groups[i] for i in rng.permutation(len(groups))]
        merged = [stats_module._merge_branch(branch, parts) for branch, parts in grouped(groups).items()]
        assert len(merged) > 1  # several branches
        combine = stats_module._MergeBranchesInOrderFn()
        shuffled = [merged[i] for i in rng.permutation(len(merged))]
        cuts = sorted(rng.choice(np.arange(1, len(merged)), size=min(2, len(merged) - 1), replace=False).tolist())
        accumulators = []
        for begin, end in zip([0, *cuts], [*cuts, len(shuffled)]):  # one accumulator per bundle, in its order
            accumulator = combine.create_accumulator()
            for element in shuffled[begin:end]:
                accumulator = combine.add_input(accumulator, element)
            accumulators.append(accumulator)
        accumulators.append(combine.create_accumulator())  # an empty bundle
        first, *rest = [accumulators[i] for i in rng.permutation(len(accumulators))]
        merged_twice = combine.merge_accumulators([first, combine.merge_accumulators(rest)])  # merges of merges
        return combine.extract_output(merged_twice)

    rng = np.random.default_rng(0)
    orders = [keyed, keyed[::-1], *([keyed[i] for i in rng.permutation(len(keyed))] for _ in range(3))]
    results = [run(order, rng) for order in orders]
    first = results[0]["data"].moments
    assert set(first) == {"t", "q"} and results[0]["data"].cut == plan.num_samples
    tree = stats_module.summary_tree_of(len(plan.units))  # the tree's order, folded in one place
    for group, ((unit, piece, pieces), summary) in keyed:
        tree.add_part(group, unit, piece, pieces, summary)
    for other in [*results[1:], tree.result()]:
        for name, moments in first.items():
            for field in ("count", "mean", "m2", "minimum", "maximum"):
                got = getattr(other["data"].moments[name], field)
                assert got.tobytes() == getattr(moments, field).tobytes(), (name, field)


def test_buckets_hold_each_sample_once_and_sort_by_key(plan):
    encoder = ExampleEncoder(plan.schema.features)
    specs = compile_specs(plan, WritePlan(WriteStrategy.BUCKET_FILES, "bucket files", "/unused"))
    by_shard: dict[int, list[bytes]] = {}
    for unit in plan.units:
        for shard, pieces in bucket_block(specs.write, encoder, cut_unit(specs.cut, plan.sources, unit)):
            by_shard.setdefault(shard, []).append(b"".join(pieces))
    decoder = ExampleDecoder(plan.schema.features)
    seen = []
    for blobs in by_shard.values():
        key_of = {}
        for blob in blobs:
            keys, lengths, payload = unpack_bucket(blob)
            starts = np.concatenate(([0], np.cumsum(lengths))).astype(int).tolist()
            key_of.update({bytes(payload[a:b]): k for a, b, k in zip(starts[:-1], starts[1:], keys.tolist())})
        with SortedBuckets(2**20) as buckets:
            for blob in blobs:
                buckets.add_blob(blob)
            framed = b"".join(bytes(batch.payloads) for batch in buckets.batches(2**14))
        records = list(read_records(io.BytesIO(framed)))
        keys = [key_of[frame(record)] for record in records]
        assert keys == sorted(keys) and len(set(keys)) == len(keys) == len(key_of)
        for record in records:
            seen.append(tuple(int(decoder.decode(record)[f"index/{d}"]) for d in ("time", "lat", "lon")))
    assert len(seen) == len(set(seen)) == plan.num_samples


def test_bucket_files_and_spill_objects_write_the_same_bytes(config, tmp_path):
    """The local-runner path (bucket files), the distributed path (spill objects, references through GroupByKey),
    and the Dask paths (each unit cut, written and summarised in one step, committed in one combine:
    transforms.streamed), with bucket files, spill objects and written in place."""
    outputs = {}
    cases = [
        ("local", True, False),
        ("spill", False, False),
        ("streamed", True, True),
        ("streamed_spill", False, True),
        ("in_place", None, True),
    ]
    for name, local, streamed in cases:
        output = str(tmp_path / name)
        this_plan = make_plan(config.model_copy(update={"output": config.output.model_copy(update={"path": output})}))
        prepare_output(output, overwrite=False, manifest=this_plan.manifest())
        if local is None:
            write = WritePlan(WriteStrategy.IN_PLACE, "in place", work_dir(output, this_plan.run_id))
            specs = compile_specs(this_plan, lay_out(this_plan, write))
        elif local:
            specs = compile_specs(
                this_plan, WritePlan(WriteStrategy.BUCKET_FILES, "bucket files", work_dir(output, this_plan.run_id))
            )
        else:
            write = choose_write_strategy(this_plan, None)  # (the output's own _tmp/<run>/)
            assert write.strategy is WriteStrategy.SPILL_OBJECTS
            specs = compile_specs(this_plan, write)
        with local_pipeline() as p:
            schemas = build_pipeline(p, this_plan.units, specs, ranges=3, stream_blocks=streamed)
            assert_that(schemas | beam.Map(lambda s: s.num_records()), equal_to([this_plan.num_samples]))
        files = [*(s.file for s in load_schema(output).splits["data"]), "stats.json"]
        outputs[name] = {file: (tmp_path / name / file).read_bytes() for file in files}
    assert all(outputs[name] == outputs["local"] for name, *_ in cases)
    assert not any((tmp_path / name / "_tmp").exists() for name, *_ in cases)


def _group_by_keys(pipeline: beam.Pipeline) -> list[str]:
    """The GroupByKeys in a pipeline (each a shuffle of every partition on Dask), by full label."""
    found = []

    class Visitor(beam.pipeline.PipelineVisitor):
        def enter_composite_transform(self, node):
            if isinstance(node.transform, beam.GroupByKey):
                found.append(node.full_label)

        def visit_transform(self, node):
            self.enter_composite_transform(node)

    pipeline.visit(Visitor())
    return found


@pytest.mark.parametrize("strategy", [WriteStrategy.IN_PLACE, WriteStrategy.BUCKET_FILES])
def test_the_dask_graph_commits_in_one_global_combine(plan, tmp_path, strategy):
    """Streamed (Beam's DaskRunner): written in place, three GroupByKeys in all (the merge tree's groups and branches,
    the commit's combine); with bucket files, one more (a shard's bucket files). The graph of the other runners keeps
    its global combines, and its merge trees."""
    write = lay_out(plan, WritePlan(strategy, "chosen", str(tmp_path / "work")))
    counts = {}
    for streamed in (True, False):
        pipeline = new_pipeline(RunOptions([]))  # (not run: its temp folder goes with it)
        build_pipeline(pipeline, plan.units, compile_specs(plan, write), ranges=3, stream_blocks=streamed)
        # (but the Reshuffles', which Beam's DaskRunner replaces with nothing)
        counts[streamed] = [label for label in _group_by_keys(pipeline) if "Spread" not in label]
    assert len(counts[True]) == (3 if strategy is WriteStrategy.IN_PLACE else 4), counts[True]
    assert len(counts[False]) > len(counts[True])


def test_a_stacked_mask_joins_its_channels_masks_and_an_unfilled_channel_is_all_zero():
    import types

    from planning.run.contracts import Block, Column, Samples
    from planning.run.variables import StackPlan
    from schemas.schema import Feature
    from transforms.encode import record_columns

    rng = np.random.default_rng(2)
    u, v = rng.normal(size=(3, 2, 4)).astype("f4"), rng.normal(size=(3, 2, 4)).astype("f4")
    filled_u = rng.random(u.shape) < 0.4  # v had no NaN in this block: no mask of its own
    samples = Samples({"u": Column(("sample", "y", "x"), u), "v": Column(("sample", "y", "x"), v)}, {})
    wind = Feature("wind", "float32", (2, 2, 4), ("channel", "y", "x"), "variable")
    mask = Feature("mask/wind", "int64", wind.shape, wind.dims, "mask", {"of": "wind"})
    spec = types.SimpleNamespace(stacks=(StackPlan(wind, ("u", "v"), 0),), features=(wind, mask))
    columns = record_columns(spec, Block(0, samples, {}, {"u": filled_u}))
    np.testing.assert_array_equal(columns["wind"], np.stack([u, v], axis=1))
    np.testing.assert_array_equal(columns["mask/wind"], np.stack([filled_u, np.zeros_like(filled_u)], axis=1))


def test_units_in_pieces_take_turns_holding_their_chunks():
    """Two threads each holding 0.6 of the limit: the second waits for the first; one over the limit passes alone."""
    held = HeldBytes(10)
    inside, most = [], []
    lock = threading.Lock()

    def unit(nbytes):
        with held.holding(nbytes):
            with lock:
                inside.append(nbytes)
                most.append(sum(inside))
            time.sleep(0.05)
            with lock:
                inside.remove(nbytes)

    threads = [threading.Thread(target=unit, args=(n,)) for n in (6, 6, 3, 25)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(most) == 4 and max(most) <= 25 and all(m <= 10 or m == 25 for m in most)
    with held.holding(0), held.holding(0):  # units of one piece never wait
        pass
