"""The portable job, as Dataflow receives it: Beam's PortableRunner (an embedded job server, LOOPBACK workers)
builds byte-identical to the local runner through every write path the planner can pick for it."""

from __future__ import annotations

import logging

import pytest
import yaml

from pipelines.build import main
from pipelines.demo import ArchiveShape, write_archive
from schemas import load_schema

from conftest import BUCKET

PORTABLE = ["--runner=PortableRunner", "--job_endpoint=embed", "--environment_type=LOOPBACK"]
#: pairs in time across files, every level: the demo's kind of samples on a few files
SAMPLE = {"window": {"lat": 10, "lon": 12}, "offsets": {"time": [0, 1]}, "keep": ["level"]}


@pytest.fixture(scope="module")
def archive(tmp_path_factory):
    folder = tmp_path_factory.mktemp("era5")
    write_archive(folder, ArchiveShape(num_files=3, steps_per_file=4, levels=3, lat=20, lon=24), invariants=True)
    return sorted(folder.glob("*.nc"))


def _config(folder, paths, output: str, mode: str = "write", **output_options) -> str:
    config = {
        "input": {"paths": paths, "concat_dim": "time"},
        "sample": SAMPLE,
        "shuffle": {"mode": mode},
        "output": {"path": output, "num_shards": 3, **output_options},
    }
    path = folder / f"config-{abs(hash((output, mode, str(output_options))))}.yaml"
    path.write_text(yaml.safe_dump(config))
    return str(path)


def _shards(read, output: str) -> dict[str, bytes]:
    """Every shard of ``output`` and its index, by name, as ``read(path)`` gives their bytes."""
    schema = load_schema(output)
    return {f: read(f"{output}/{f}") for s in schema.splits["data"] for f in (s.file, s.index)}


def _strategy(caplog) -> str:
    return next(r.args[0] for r in caplog.records if r.getMessage().startswith("records are written by"))


@pytest.mark.parametrize(
    ("output_options", "strategy"),
    [({}, "in place"), ({"in_place": False}, "bucket files")],
    ids=["in-place", "buckets"],
)
def test_a_portable_job_on_a_shared_filesystem_writes_the_local_runners_bytes(
    archive, tmp_path, caplog, output_options, strategy
):
    paths = [str(p) for p in archive]
    local, portable = str(tmp_path / "local"), str(tmp_path / "portable")
    assert main(["--config", _config(tmp_path, paths, local, **output_options)]) == 0
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="pipelines.graph"):
        config = _config(tmp_path, paths, portable, **output_options)
        assert main(["--config", config, *PORTABLE, "--shared_filesystem"]) == 0
    assert _strategy(caplog) == strategy

    def read(path: str) -> bytes:
        with open(path, "rb") as f:
            return f.read()

    expected = _shards(read, local)
    assert len(expected) == 6 and _shards(read, portable) == expected


def test_a_portable_job_to_gs_spills_to_objects_and_writes_the_local_runners_bytes(gcs, archive, tmp_path, caplog):
    """What Dataflow runs: workers that share no filesystem, a gs:// output (the storage emulator)."""
    for path in archive:
        gcs.put(str(path), f"{BUCKET}/portable-in/{path.name}")
    paths = f"gs://{BUCKET}/portable-in/*.nc"
    local, portable = f"gs://{BUCKET}/out/local", f"gs://{BUCKET}/out/portable"
    assert main(["--config", _config(tmp_path, paths, local)]) == 0
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="pipelines.graph"):
        assert main(["--config", _config(tmp_path, paths, portable), *PORTABLE]) == 0
    assert _strategy(caplog) == "spill objects"
    expected = _shards(gcs.cat, local)
    assert len(expected) == 6 and _shards(gcs.cat, portable) == expected
    assert not gcs.exists(f"{portable}/_tmp")


def test_a_portable_job_in_unit_order_to_gs_writes_the_local_runners_bytes(gcs, archive, tmp_path, caplog):
    """shuffle.mode: read as Dataflow runs it: each shard written whole, straight to gs://, by one worker."""
    for path in archive:
        gcs.put(str(path), f"{BUCKET}/portable-units/{path.name}")
    paths = f"gs://{BUCKET}/portable-units/*.nc"
    local, portable = str(tmp_path / "local"), f"gs://{BUCKET}/out/portable-units"
    assert main(["--config", _config(tmp_path, paths, local, mode="read")]) == 0
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="pipelines.graph"):
        assert main(["--config", _config(tmp_path, paths, portable, mode="read"), *PORTABLE]) == 0
    assert _strategy(caplog) == "unit runs"

    def read(path: str) -> bytes:
        with open(path, "rb") as f:
            return f.read()

    expected = _shards(read, local)
    assert len(expected) == 6 and _shards(gcs.cat, portable) == expected
    assert not gcs.exists(f"{portable}/_tmp")
