"""The streaming shard writer: the same bytes as sorting the whole shard in memory, within its memory budget."""

from __future__ import annotations

import dataclasses
import gzip
import io
import multiprocessing
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from apache_beam.runners.portability.fn_api_runner import fn_runner
from apache_beam.testing import test_pipeline

from pipelines.graph import build_pipeline
from pipelines.output import prepare_output
from planning import sizing
from planning.config import parse_config
from planning.plan import make_plan
from planning.run.names import work_dir
from planning.specs import WriteSpec, compile_specs
from planning.splits import SplitPlan
from planning.write_strategy import WritePlan, WriteStrategy
from schemas import load_schema
from schemas.errors import UserError
from schemas.example_codec import ExampleEncoder
from schemas.schema import RECORD_COUNT, Feature, Schema
from schemas.tfrecord import frame, frame_parts
from transforms.buckets.blobs import bucket_pieces, row_dtype
from transforms.buckets.sorting import INDEX_BYTES_PER_RECORD, BufferLedger, SortedBuckets
from transforms.files import write_atomically
from transforms.shards import write_shard

SEED = 7


def features_of(values: int) -> tuple[Feature, ...]:
    """A float feature of ``values`` values and two int64 features (varints of varying length)."""
    return (
        Feature("x", "float32", (values,), ("v",), "variable"),
        Feature("index/time", "int64", (), (), "index"),
        Feature("coord/time", "int64", (2,), ("t",), "coord"),
    )


def spec_for(
    output: Path, features, per_record: int = 1, compression: str | None = None, budget: int = 64 * 2**20, **extra
) -> WriteSpec:
    schema = Schema(features, examples_per_record=per_record)
    return WriteSpec(
        output=str(output),
        run_id="test",
        strategy=WriteStrategy.BUCKET_FILES,
        features=features,
        record_features=schema.record_features(),
        stacks=(),
        splits=(SplitPlan("data", 0, 1, num_shards=1),),
        seed=SEED,
        compression=compression,
        examples_per_record=per_record,
        writer_budget_bytes=budget,
        **extra,
    )


def sample_columns(features, n: int, rng) -> dict[str, np.ndarray]:
    ids = rng.permutation(10 * n)[:n]
    return {
        "x": rng.standard_normal((n, features[0].size), dtype=np.float32),
        "index/time": ids.astype(np.int64),
        "coord/time": np.stack([ids * 3600, -ids], axis=1).astype(np.int64),  # negative ints: 10-byte varints
    }


class Shard:
    """A shard's samples cut into buckets as units would (random keys), and what an in-memory sort writes."""

    def __init__(self, spec: WriteSpec, n: int, buckets: int, rng):
        features = spec.features
        columns = sample_columns(features, n, rng)
        self.keys = rng.permutation(np.arange(n, dtype=np.uint64) * np.uint64(2**40) + np.uint64(12345))
        if spec.examples_per_record == 1:
            payloads = [frame_parts(record) for record in ExampleEncoder(features).encode(columns)]
        else:
            payloads = np.empty(n, dtype=row_dtype(features))
            for i, feature in enumerate(features):
                payloads[f"f{i}"] = columns[feature.name]
        cuts = np.sort(rng.choice(np.arange(1, n), buckets - 1, replace=False)) if buckets > 1 else []
        self.blobs = []
        for part in np.split(np.arange(n), cuts):
            chosen = payloads[part] if isinstance(payloads, np.ndarray) else [payloads[i] for i in part]
            self.blobs.append(b"".join(bucket_pieces(self.keys[part], chosen)))
        self.expected = in_memory_shard(spec, self.keys, columns, payloads)

    def files(self, directory: Path) -> list[str]:
        directory.mkdir(exist_ok=True)
        paths = []
        for i, blob in enumerate(self.blobs):
            path = directory / f"unit-{i:06d}.bucket"
            path.write_bytes(blob)
            paths.append(str(path))
        return paths


def in_memory_shard(spec: WriteSpec, keys, columns, payloads) -> bytes:
    """The shard as the writer used to make it: every record sorted by key in memory, packed whole."""
    order = np.argsort(keys)
    per_record = spec.examples_per_record
    if per_record == 1:
        return b"".join(b"".join(payloads[i]) for i in order)
    n = len(keys)
    records = -(-n // per_record)
    packed = {}
    for feature in spec.features:
        values = np.zeros((records * per_record, *feature.shape), dtype=feature.dtype)
        values[:n] = columns[feature.name][order]
        packed[feature.name] = values.reshape(records, per_record, *feature.shape)
    packed[RECORD_COUNT] = np.array([min(per_record, n - r * per_record) for r in range(records)], dtype=np.int64)
    return b"".join(frame(record) for record in ExampleEncoder(spec.record_features).encode(packed))


def written(spec: WriteSpec) -> bytes:
    data = Path(spec.shard_path(0)).read_bytes()
    return gzip.decompress(data) if spec.compression else data


CASES = {
    # name: (values per sample, samples, buckets, samples per record, budget)
    "many small records": (24, 20_000, 40, 1, 2**18),
    "large records": (11_000, 120, 7, 1, 2**20),
    "packed 4": (24, 5_001, 13, 4, 2**17),
    "packed 32": (24, 5_003, 13, 32, 2**17),
}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("as_files", [True, False], ids=["bucket files", "blobs"])
def test_streaming_writer_writes_what_an_in_memory_sort_wrote(tmp_path, case, as_files):
    values, n, buckets, per_record, budget = CASES[case]
    spec = spec_for(tmp_path / "out", features_of(values), per_record, budget=budget)
    shard = Shard(spec, n, buckets, np.random.default_rng(1))
    ledger = BufferLedger()
    result = write_shard(spec, 0, shard.files(tmp_path / "buckets") if as_files else shard.blobs, ledger)
    assert written(spec) == shard.expected
    assert result.examples == n
    assert result.records == -(-n // per_record)
    assert result.bytes == len(shard.expected)
    # Runs are spilled exactly when the index outgrows half the budget (small records here; not large ones).
    assert (ledger.runs > 0) == (n * INDEX_BYTES_PER_RECORD > budget // 2)
    assert ledger.peak <= budget


def test_gzip_bytes_do_not_depend_on_the_budget(tmp_path):
    """Gzip output is one stream whatever the batches: a small budget writes the same file as the default."""
    files = {}
    for budget in (2**17, 64 * 2**20):
        spec = spec_for(tmp_path / f"out-{budget}", features_of(24), 32, compression="gzip", budget=budget)
        shard = Shard(spec, 3_000, 9, np.random.default_rng(2))
        write_shard(spec, 0, shard.blobs)
        assert written(spec) == shard.expected
        files[budget] = Path(spec.shard_path(0)).read_bytes()
    assert files[2**17] == files[64 * 2**20]


@pytest.mark.parametrize("compression", [None, "gzip"])
def test_a_shard_without_records_is_what_finalize_writes_for_an_empty_shard(tmp_path, compression):
    spec = spec_for(tmp_path / "out", features_of(4), compression=compression)
    result = write_shard(spec, 0, [])
    empty = tmp_path / "empty"
    write_atomically(str(empty), [], compression)
    assert Path(spec.shard_path(0)).read_bytes() == empty.read_bytes()
    assert (result.records, result.examples) == (0, 0)


@pytest.mark.parametrize("budget", [2**16, 64 * 2**20], ids=["spilled runs", "in memory"])
def test_a_sample_cut_twice_fails_the_shard(tmp_path, budget):
    spec = spec_for(tmp_path / "out", features_of(8), budget=budget)
    shard = Shard(spec, 2_000, 4, np.random.default_rng(3))
    with pytest.raises(RuntimeError, match="duplicate shuffle key"):
        write_shard(spec, 0, [*shard.blobs, shard.blobs[2]])
    assert list((tmp_path / "out").iterdir()) == []  # the temporary file is gone


def test_a_truncated_bucket_fails_with_its_name(tmp_path):
    spec = spec_for(tmp_path / "out", features_of(8))
    shard = Shard(spec, 500, 3, np.random.default_rng(4))
    paths = shard.files(tmp_path / "buckets")
    Path(paths[1]).write_bytes(shard.blobs[1][:-10])
    with pytest.raises(ValueError, match=r"unit-000001\.bucket: truncated bucket"):
        write_shard(spec, 0, paths)


@pytest.mark.parametrize("per_record", [1, 8])
def test_a_shard_over_the_cap_fails_in_one_line_with_the_fix(tmp_path, per_record):
    spec = spec_for(tmp_path / "out", features_of(64), per_record, budget=2**18, max_shard_bytes=200_000)
    shard = Shard(spec, 2_000, 5, np.random.default_rng(5))
    assert len(shard.expected) > 200_000
    message = r"^shard data-00000-of-00001\.tfrecord: (over )?[0-9.]+ MB, above the 0.2 MB a shard may hold"
    with pytest.raises(UserError, match=message) as error:
        write_shard(spec, 0, shard.blobs)
    assert "raise output.num_shards or lower output.target_shard_mb" in str(error.value)
    assert "\n" not in str(error.value)
    assert not list((tmp_path / "out").glob("*"))  # nothing written, or the temporary file removed


@pytest.mark.parametrize("per_record", [1, 4])
def test_planning_keeps_every_written_shard_under_the_cap(small_archive, tmp_path, monkeypatch, per_record):
    """With the cap lowered to 100 kB, planning splits the one configured shard; none written exceeds it."""
    cap = 100_000
    monkeypatch.setattr(sizing, "MAX_SHARD_BYTES", cap)
    config = parse_config(
        {
            "input": {"paths": str(small_archive / "*.nc")},
            "variables": ["t", "q"],
            "sample": {"window": {"lat": 4, "lon": 4}, "keep": ["level"]},
            "output": {"path": str(tmp_path / "out"), "num_shards": 1, "examples_per_record": per_record},
        }
    )
    plan = make_plan(config)
    assert plan.num_shards > 1
    prepare_output(plan.output, overwrite=False, manifest=plan.manifest())
    specs = compile_specs(
        plan, WritePlan(WriteStrategy.BUCKET_FILES, "bucket files", work_dir(plan.output, plan.run_id))
    )
    specs = dataclasses.replace(specs, write=dataclasses.replace(specs.write, max_shard_bytes=cap))
    with test_pipeline.TestPipeline(runner=fn_runner.FnApiRunner()) as p:
        build_pipeline(p, plan.units, specs)
    shards = load_schema(plan.output).splits["data"]
    assert sum(s.examples for s in shards) == plan.num_samples
    assert max(s.bytes for s in shards) <= cap
    assert sum(s.bytes for s in shards) > cap


def test_a_record_larger_than_a_shard_may_hold_fails_at_planning(small_archive, tmp_path, monkeypatch):
    monkeypatch.setattr(sizing, "MAX_SHARD_BYTES", 10_000)
    config = parse_config(
        {
            "input": {"paths": str(small_archive / "*.nc")},
            "variables": ["t"],
            "sample": {"window": {"lat": 4, "lon": 4}, "keep": ["level"]},
            "output": {"path": str(tmp_path / "out"), "examples_per_record": 64},
        }
    )
    with pytest.raises(UserError, match=r"^output: a record of 64 samples may take .* output.examples_per_record$"):
        make_plan(config)


def test_runs_beyond_the_open_file_limit_merge_in_several_passes(tmp_path):
    rng = np.random.default_rng(6)
    keys = rng.permutation(np.arange(30_000, dtype=np.uint64) * np.uint64(977))
    sizes = rng.integers(1, 300, len(keys))
    payloads = [rng.integers(0, 256, s, dtype=np.uint8).tobytes() for s in sizes]
    ledger = BufferLedger()
    with SortedBuckets(2**16, ledger, max_open=4) as buckets:
        for number, part in enumerate(np.array_split(np.arange(len(keys)), 20)):
            blob = b"".join(bucket_pieces(keys[part], [[payloads[i]] for i in part]))
            if number % 2:
                buckets.add_blob(blob)
            else:  # as a remote bucket file is read
                buckets.add_stream(io.BytesIO(blob), f"gs://bucket/unit-{number}")
        out = b"".join(bytes(batch.payloads) for batch in buckets.batches(10_000))
    assert out == b"".join(payloads[i] for i in np.argsort(keys))
    assert ledger.runs > 4  # more runs than a merge of 4 open files takes at once


def _write_traced(spec, paths) -> tuple[int, BufferLedger]:
    """Write shard 0 under tracemalloc; its peak above the baseline, and the writer's own ledger.

    A first, untraced write makes what a process makes once (lazy imports, caches: ~20 KB, varying
    by a few KB from one process to the next, which left the traced write 0.98-1.00x the budget):
    not the writer's to hold. The traced write replaces its shard.
    """
    write_shard(spec, 0, paths)
    ledger = BufferLedger()
    tracemalloc.start()
    try:
        baseline = tracemalloc.get_traced_memory()[0]
        write_shard(spec, 0, paths, ledger)
        return tracemalloc.get_traced_memory()[1] - baseline, ledger
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize(
    ("values", "samples", "per_record", "compression", "budget"),
    # gzip's own state (zlib's window and tables, ~0.3 MB) is the writer's too: it gets 1 MB.
    [(110, 30_000, 1, None, 2**19), (24, 280_000, 32, "gzip", 2**20)],
    ids=["small records", "packed 32, gzip"],
)
def test_memory_stays_within_the_budget_over_a_shard_thirty_times_larger(
    tmp_path, values, samples, per_record, compression, budget
):
    """A budget of 0.5 or 1 MB over a shard 30 times that: the writer's own count and tracemalloc both stay under it.

    tracemalloc counts every allocation made through Python, numpy and zlib, deterministically
    (unlike RSS), so it also catches buffers the writer's own count would miss.
    """
    spec = spec_for(tmp_path / "out", features_of(values), per_record, compression, budget=budget)
    shard = Shard(spec, samples, 64, np.random.default_rng(7))
    paths = shard.files(tmp_path / "buckets")
    expected = shard.expected
    del shard
    assert len(expected) > 30 * budget
    # In a fresh process: tracemalloc counts every thread's allocations, and this one may host
    # other tests' threads (a Dask scheduler, Beam's workers).
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        peak, ledger = pool.apply(_write_traced, (spec, paths))
    assert written(spec) == expected
    assert ledger.runs > 0
    assert ledger.peak <= budget
    assert peak < budget, f"{peak / budget:.2f}x the budget"
