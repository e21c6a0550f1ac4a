"""Builds on a Dask cluster (Beam's DaskRunner, LocalCluster worker processes) equal the local runner's builds."""

from __future__ import annotations

import functools
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import yaml
from apache_beam.options.pipeline_options import PipelineOptions
from distributed import Client, LocalCluster, get_task_stream

from pipelines import graph, runners
from pipelines.build import main
from planning.config import load_config
from planning.plan import make_plan
from schemas import load_schema

from conftest import BUCKET

#: A hung cluster must fail CI, not hang it: no test here takes a minute (its cluster's start included).
pytestmark = pytest.mark.timeout(300)
#: Small units, so that the small archive makes several and the cluster spreads them.
UNIT_BUDGET_BYTES = 200_000
SAMPLE = {"window": {"lat": 5, "lon": 6}, "offsets": {"time": [0, 1]}, "keep": ["level"]}


@pytest.fixture(scope="session")
def dask_cluster():
    """Two single-threaded worker processes, as a real cluster has: every element crosses a process boundary."""
    cluster = LocalCluster(
        n_workers=2, processes=True, threads_per_worker=1, dashboard_address=None, silence_logs=logging.ERROR
    )
    try:
        yield cluster
    finally:
        cluster.close()


@pytest.fixture
def client(dask_cluster):
    with Client(dask_cluster.scheduler_address, timeout=30) as client:
        yield client


@pytest.fixture(autouse=True)
def small_units(monkeypatch):
    monkeypatch.setattr(graph, "make_plan", functools.partial(make_plan, unit_budget_bytes=UNIT_BUDGET_BYTES))


def dask_flags(client: Client, *more: str) -> list[str]:
    address = client.scheduler.address
    return ["--runner=DaskRunner", f"--dask_client_address={address}", "--dask_connection_timeout=30", *more]


def write_config(tmp_path: Path, name: str, inputs, output: str, in_place: bool = True, mode: str = "write") -> Path:
    config = {
        "input": {"paths": inputs},
        "variables": ["t", "q"],
        "sample": SAMPLE,
        "shuffle": {"mode": mode},
        "output": {"path": output, "num_shards": 3, "in_place": in_place},
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def build(config: Path, *flags: str) -> None:
    assert main(["--config", str(config), "--quiet", *flags]) == 0


def assert_close(a, b, path="stats"):
    """Equal JSON documents, numbers equal to float precision (merge order may change the last digits)."""
    if isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for key in a:
            assert_close(a[key], b[key], f"{path}.{key}")
    elif isinstance(a, list):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            assert_close(x, y, f"{path}[{i}]")
    elif isinstance(a, float) and isinstance(b, float):
        assert np.isclose(a, b, rtol=1e-9, atol=0), (path, a, b)
    else:
        assert a == b, (path, a, b)


def assert_same_output(read, dask_output: str, local_output: Path) -> None:
    """Every shard byte-identical, the same shard list and counts, statistics equal."""
    schema, reference = load_schema(dask_output), load_schema(str(local_output))
    assert schema.splits == reference.splits and schema.counts == reference.counts
    files = [shard.file for shards in reference.splits.values() for shard in shards]
    assert len(files) == 3 and reference.num_examples() > 0
    for file in files:
        assert read(f"{dask_output}/{file}") == (local_output / file).read_bytes(), file
        # The index beside each shard, whichever path wrote it (in place, bucket files, the runner's shuffle).
        assert read(f"{dask_output}/{file}.tfindex") == (local_output / f"{file}.tfindex").read_bytes(), file
    assert_close(json.loads(read(f"{dask_output}/stats.json")), json.loads((local_output / "stats.json").read_text()))


@pytest.fixture(scope="module")
def local_build(small_archive, tmp_path_factory) -> Path:
    """The local runner's build that every Dask build here must equal (built once: they all build the same)."""
    tmp = tmp_path_factory.mktemp("local")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(graph, "make_plan", functools.partial(make_plan, unit_budget_bytes=UNIT_BUDGET_BYTES))
        build(write_config(tmp, "local", str(small_archive / "*.nc"), str(tmp / "local")))
    return tmp / "local"


def read_local(path: str) -> bytes:
    return Path(path).read_bytes()


def strategy_logged(caplog) -> str:
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("records are written by")]
    return line


def test_in_place_on_a_shared_filesystem_equals_the_local_build(
    small_archive, local_build, tmp_path, client, caplog, monkeypatch
):
    caplog.set_level(logging.INFO, logger="pipelines.graph")
    budget = (
        UNIT_BUDGET_BYTES / 16
    )  # many units per partition (each GroupByKey adds a few dozen tasks, whatever the units)
    monkeypatch.setattr(graph, "make_plan", functools.partial(make_plan, unit_budget_bytes=budget))
    config = write_config(tmp_path, "dask", str(small_archive / "*.nc"), str(tmp_path / "dask"))
    with get_task_stream(client) as tasks:
        build(config, "--shared_filesystem", *dask_flags(client))
    assert "in place" in strategy_logged(caplog)
    assert_same_output(read_local, str(tmp_path / "dask"), local_build)
    assert sorted(p.name for p in (tmp_path / "dask").iterdir()) == sorted(p.name for p in local_build.iterdir())

    # The units were cut by tasks the scheduler ran on the worker processes, in a few partitions per worker
    # thread (runners.unit_ranges), not one per unit (about 200 tasks a unit, each with its overhead), and
    # committed through the merge tree's two GroupByKeys and one global combine (transforms.streamed): fewer tasks
    # than units.
    units = make_plan(load_config(config), unit_budget_bytes=budget).units
    workers = client.scheduler_info()["workers"]
    assert runners.unit_ranges(PipelineOptions(dask_flags(client)), len(units)) == 2 * 2  # 2 single-threaded workers
    assert len(tasks.data) < len(units), (len(tasks.data), len(units))
    assert {t["worker"] for t in tasks.data} <= set(workers)
    assert os.getpid() not in client.run(os.getpid).values()


def test_bucket_files_on_a_shared_filesystem_equal_the_local_build(
    small_archive, local_build, tmp_path, client, caplog
):
    caplog.set_level(logging.INFO, logger="pipelines.graph")
    config = write_config(tmp_path, "dask", str(small_archive / "*.nc"), str(tmp_path / "dask"), in_place=False)
    build(config, "--shared_filesystem", *dask_flags(client))
    assert "bucket files" in strategy_logged(caplog)
    assert_same_output(read_local, str(tmp_path / "dask"), local_build)
    assert not (tmp_path / "dask" / "_tmp").exists()


@pytest.fixture
def workers_see_the_emulator(gcs, client):
    """The workers started before the emulator: give them its address, as a real cluster's environment would."""
    names = ("STORAGE_EMULATOR_HOST", "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT")
    env = {name: os.environ[name] for name in names}
    client.run(lambda: os.environ.update(env))
    try:
        yield gcs
    finally:
        client.run(lambda: [os.environ.pop(name, None) for name in names])


def test_without_a_shared_filesystem_records_go_through_spill_objects_not_the_runners_groupbykey(
    small_archive, local_build, tmp_path, client, workers_see_the_emulator, caplog
):
    """Beam's DaskRunner lists a key's values in one worker's memory: a shard's records must not be those values.
    Each unit writes one spill object on gs://; each shard's GroupByKey hands over byte ranges of them."""
    from transforms.buckets.spill import SpilledBucket

    gcs = workers_see_the_emulator
    caplog.set_level(logging.INFO, logger="pipelines.graph")
    for path in sorted(small_archive.glob("*.nc")):
        gcs.put(str(path), f"{BUCKET}/dask/in/{path.name}")
    output = f"gs://{BUCKET}/dask/out"

    def record_what_shard_writers_get():  # on each worker process: what each shard's GroupByKey handed over
        import transforms.shards as shards

        original, got = shards.write_shard, []

        def recording(spec, shard, buckets, ledger=None):
            buckets = list(buckets)
            got.append(buckets)
            return original(spec, shard, buckets, ledger)

        shards.write_shard, shards.seen_by_test = recording, (original, got)

    def restore():
        import transforms.shards as shards

        original, got = shards.__dict__.pop("seen_by_test")
        shards.write_shard = original
        return got

    client.run(record_what_shard_writers_get)
    try:
        build(write_config(tmp_path, "dask", f"gs://{BUCKET}/dask/in/*.nc", output), *dask_flags(client))
    finally:
        got = [buckets for found in client.run(restore).values() for buckets in found]
    assert "spill objects" in strategy_logged(caplog)
    # Each of the 3 shards was written once, from references into its units' spill objects under the run's _tmp/.
    assert len(got) == 3 and all(buckets for buckets in got), got
    references = [b for buckets in got for b in buckets]
    assert all(isinstance(b, SpilledBucket) and b.url.startswith(f"{output}/_tmp/") for b in references)
    objects = {b.url for b in references}
    assert all(url.endswith(".spill") for url in objects) and len(objects) < len(references)  # one a unit, not a shard
    assert_same_output(gcs.cat, output, local_build)
    # No spill object, run file or progress marker is left, on gs:// or on this machine.
    assert sorted(p.rsplit("/", 1)[1] for p in gcs.ls(output)) == sorted(p.name for p in local_build.iterdir())
    assert not Path("gs:").exists()  # progress markers are local files: none were made for a URL


def test_unit_order_without_a_shared_filesystem_writes_the_local_runners_bytes(
    small_archive, tmp_path, client, workers_see_the_emulator, caplog
):
    """shuffle.mode: read on Dask: a task writes each shard whole, straight to gs://; the local runner's bytes."""
    gcs = workers_see_the_emulator
    caplog.set_level(logging.INFO, logger="pipelines.graph")
    for path in sorted(small_archive.glob("*.nc")):
        gcs.put(str(path), f"{BUCKET}/dask-units/in/{path.name}")
    local, output = tmp_path / "local", f"gs://{BUCKET}/dask-units/out"
    build(write_config(tmp_path, "local", str(small_archive / "*.nc"), str(local), mode="read"))
    caplog.clear()
    build(write_config(tmp_path, "dask", f"gs://{BUCKET}/dask-units/in/*.nc", output, mode="read"), *dask_flags(client))
    assert "unit runs" in strategy_logged(caplog)
    assert_same_output(gcs.cat, output, local)
    assert gcs.cat(f"{output}/stats.json") == (local / "stats.json").read_bytes()
    assert sorted(p.rsplit("/", 1)[1] for p in gcs.ls(output)) == sorted(p.name for p in local.iterdir())


def test_a_user_error_on_a_worker_is_one_line(small_archive, tmp_path, client, capsys, monkeypatch):
    archive = tmp_path / "in"
    archive.mkdir()
    for path in small_archive.glob("*.nc"):
        (archive / path.name).write_bytes(path.read_bytes())
    doomed = sorted(archive.glob("*.nc"))[1]
    plan = graph.make_plan

    def plan_then_delete(config, **options):
        planned = plan(config, **options)
        doomed.unlink()  # after planning: only a worker cutting a unit of it finds out
        return planned

    monkeypatch.setattr(graph, "make_plan", plan_then_delete)
    config = write_config(tmp_path, "dask", str(archive / "*.nc"), str(tmp_path / "out"))
    assert main(["--config", str(config), "--quiet", "--shared_filesystem", *dask_flags(client)]) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"error: {doomed}: file not found"), lines
    # No schema.json, no temporary shards or buckets: only the inputs' probes and the manifest, kept for a rerun.
    assert sorted(p.name for p in (tmp_path / "out").rglob("*")) == ["_inventory.json", "_manifest.json"]


NOWHERE = ["--dask_client_address=tcp://127.0.0.1:9", "--dask_connection_timeout=1"]
STOPPED_LINE = "error: stopped by SIGTERM; the run's files were removed and the output is not complete"


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--shared_filesystem"], "DaskRunner needs the cluster's scheduler: --dask_client_address=tcp://HOST:PORT"),
        (["--shared_filesystem", *NOWHERE], "DaskRunner: no Dask scheduler answers at tcp://127.0.0.1:9"),
        (
            ["--shared_filesystem", "--dask_scheduler_file=/nonexistent/scheduler.json"],
            "--dask_scheduler_file=/nonexistent/scheduler.json does not exist; start the scheduler with",
        ),
        (
            ["--shared_filesystem", "--dask_client_address=tcp://127.0.0.1:9", "--dask_connection_timeout=soon"],
            "--dask_connection_timeout: give a whole number of seconds, at least 1",
        ),
        (
            NOWHERE,
            "is a local path, but DaskRunner runs on remote workers that cannot write there; use a gs:// output, "
            "or pass --shared_filesystem",
        ),
    ],
)
def test_bad_dask_setups_fail_before_planning(small_archive, tmp_path, capsys, flags, expected):
    output = tmp_path / "out"
    config = write_config(tmp_path, "c", str(small_archive / "*.nc"), str(output))
    assert main(["--config", str(config), "--runner=DaskRunner", *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("error: ") and expected in err, err
    assert not output.exists()


@pytest.fixture
def silent_scheduler():
    """An address that accepts connections and never answers (a port forwarded to nothing, a frozen scheduler)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)  # the system completes the connections; nobody ever reads or writes on them
        yield f"tcp://127.0.0.1:{sock.getsockname()[1]}"


@pytest.fixture(scope="module")
def cluster_without_workers():
    cluster = LocalCluster(n_workers=0, processes=True, dashboard_address=None, silence_logs=logging.ERROR)
    try:
        yield cluster
    finally:
        cluster.close()


def _one_line(command: list[str], capsys) -> tuple[int, str]:
    """The exit code and the one line a build printed (a build that ignores its timeout waits for ever: the
    test's own timeout ends it)."""
    code = main(command)
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("error: "), err
    return code, err


@pytest.mark.timeout(120)  # the build's timeout is 2 s; without it, it waits for ever
def test_a_scheduler_that_never_answers_fails_in_one_line_within_the_timeout(
    small_archive, tmp_path, capsys, silent_scheduler
):
    """Dask's handshake has no timeout of its own: the build waited for ever despite --dask_connection_timeout."""
    config = write_config(tmp_path, "c", str(small_archive / "*.nc"), str(tmp_path / "out"))
    flags = [f"--dask_client_address={silent_scheduler}", "--dask_connection_timeout=2", "--shared_filesystem"]
    code, err = _one_line(["--config", str(config), "--runner=DaskRunner", *flags], capsys)
    assert code == 2
    assert err == (
        f"error: DaskRunner: no Dask scheduler answers at {silent_scheduler} (no answer within 2 s); start the "
        "cluster first, or fix --dask_client_address (--dask_connection_timeout=SECONDS waits longer)"
    )
    assert not (tmp_path / "out").exists()


def _left_in_temp(temp: Path) -> list[str]:
    """What a build left in its temp directory: its folders, not the folder of output locks once it holds none."""
    return sorted(
        str(p.relative_to(temp))
        for p in temp.rglob("*")
        if not (p.name.startswith("xarray-tfrecords-locks-") and p.is_dir() and not any(p.iterdir()))
    )


def test_a_build_stopped_while_it_waits_for_the_scheduler_leaves_nothing_in_the_temp_directory(
    small_archive, tmp_path, silent_scheduler
):
    """SIGTERM during the scheduler check: the build unwinds at once; it used to end after the stop's grace, leaving
    its submission folder (and the output lock in it) in the temp directory."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    config = write_config(tmp_path, "c", str(small_archive / "*.nc"), str(tmp_path / "out"))
    flags = [f"--dask_client_address={silent_scheduler}", "--dask_connection_timeout=60", "--shared_filesystem"]
    command = [sys.executable, "-m", "pipelines.build", "--config", str(config), "--runner=DaskRunner", *flags]
    build = subprocess.Popen(command, env={**os.environ, "TMPDIR": str(temp)}, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not any(temp.glob("xarray-tfrecords-submit-*")):  # the run started: the check follows at once
            assert build.poll() is None and time.monotonic() < deadline, "the build never started its run"
            time.sleep(0.05)
        time.sleep(1.0)  # into the check, which would wait 60 s
        build.send_signal(signal.SIGTERM)
        _, err = build.communicate(timeout=60)
    finally:
        build.kill()
    assert build.returncode == 143, err
    assert err.strip().splitlines()[-1] == STOPPED_LINE, err
    assert _left_in_temp(temp) == []
    assert not (tmp_path / "out").exists()


@pytest.mark.timeout(120)  # the build's timeout is 2 s; without it, it waits for ever
def test_a_cluster_without_workers_fails_in_one_line_within_the_timeout(
    small_archive, tmp_path, capsys, cluster_without_workers
):
    """It used to warn and wait silently for workers that might never come."""
    address = cluster_without_workers.scheduler_address
    config = write_config(tmp_path, "c", str(small_archive / "*.nc"), str(tmp_path / "out"))
    flags = [f"--dask_client_address={address}", "--dask_connection_timeout=2", "--shared_filesystem"]
    code, err = _one_line(["--config", str(config), "--runner=DaskRunner", *flags], capsys)
    assert code == 2
    assert err == (
        f"error: DaskRunner: the Dask cluster at {address} has no workers (none joined within 2 s); start some "
        f"(dask worker {address}, or cluster.scale(N)), or give queued ones longer with "
        "--dask_connection_timeout=SECONDS"
    )
    assert not (tmp_path / "out").exists()


def test_the_check_waits_for_workers_that_join_within_the_timeout():
    """A cluster scaling up (workers queued on HPC) passes once one joins, and its threads are counted."""
    from pipelines import preflight

    with LocalCluster(n_workers=0, processes=True, dashboard_address=None, silence_logs=logging.ERROR) as cluster:
        address = cluster.scheduler_address
        flags = ["--runner=DaskRunner", f"--dask_client_address={address}", "--dask_connection_timeout=60"]
        options = PipelineOptions(flags)
        joining = threading.Timer(0.5, cluster.scale, [1])
        joining.start()
        try:
            preflight._check_dask_scheduler(options)  # (its own 60 s timeout: an error if it missed the worker)
        finally:
            joining.join()
        with Client(address, timeout=30) as client:
            threads = sum(client.nthreads().values())
        assert threads >= 1 and runners.dask_threads(options) == threads


def test_dataflow_workers_share_no_filesystem(small_archive, tmp_path, capsys):
    config = write_config(tmp_path, "c", str(small_archive / "*.nc"), str(tmp_path / "out"))
    assert main(["--config", str(config), "--runner=DataflowRunner", "--shared_filesystem"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "Dataflow workers never see this machine's filesystem" in err, err


#: The launcher, with units small enough that the small archive makes a job of many tasks.
LAUNCHER = f"""
import functools, sys
from pipelines import build, graph
from planning.plan import make_plan
graph.make_plan = functools.partial(make_plan, unit_budget_bytes={UNIT_BUDGET_BYTES})
sys.exit(build.main(sys.argv[1:]))
"""


def _tasks_on_cluster(client: Client) -> int:
    """Tasks the scheduler knows plus those the workers still execute."""
    known = client.run_on_scheduler(lambda dask_scheduler: len(dask_scheduler.tasks))
    return known + sum(client.run(lambda dask_worker: len(dask_worker.state.executing)).values())


def test_a_stopped_launcher_cancels_the_job_before_it_removes_the_files(small_archive, tmp_path, client):
    """Ctrl-C on the launcher: the job is cancelled and its last tasks end first; then nothing of the run is left."""
    output = tmp_path / "out"
    config = yaml.safe_load(write_config(tmp_path, "dask", str(small_archive / "*.nc"), str(output)).read_text())
    config["input"]["preprocess"] = "preprocess_examples:slow"  # a second a slab: the job runs for a while
    path = tmp_path / "slow.yaml"
    path.write_text(yaml.safe_dump(config))
    tests = str(Path(__file__).resolve().parents[1])
    temp = tmp_path / "tmp"  # the launcher's temp directory: Beam's and the submission's folders go with the run
    temp.mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([tests, os.environ.get("PYTHONPATH", "")]), "TMPDIR": str(temp)}
    command = [sys.executable, "-c", LAUNCHER, "--config", str(path), "--quiet", "--shared_filesystem"]
    launcher = subprocess.Popen([*command, *dask_flags(client)], env=env, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while _tasks_on_cluster(client) == 0:  # the job is submitted and runs
            assert launcher.poll() is None and time.monotonic() < deadline, "the job never ran"
            time.sleep(0.2)
        time.sleep(1.5)  # some tasks done, some running, most waiting
        launcher.send_signal(signal.SIGINT)
        _, err = launcher.communicate(timeout=60)
    finally:
        launcher.kill()
    assert launcher.returncode == 130, err
    lines = err.strip().splitlines()
    assert lines[0] == "stopping: cancelling the DaskRunner job and waiting for it to end", err
    assert lines[-1] == (
        "error: interrupted; the DaskRunner job was cancelled, "
        "the run's files were removed and the output is not complete"
    ), err
    assert _tasks_on_cluster(client) == 0  # nothing of the job runs any more ...
    time.sleep(2.5)  # ... so nothing writes into the output after the clean-up (a task takes a second and more)
    left = sorted(str(p.relative_to(output)) for p in output.rglob("*"))
    assert left == ["_inventory.json", "_manifest.json"], left
    assert _left_in_temp(temp) == []


def test_tendency_and_field_statistics_on_dask_equal_numpys(small_archive, tmp_path, client):
    """stats.tendency's and stats.over: field's own units and merges run on the cluster too (their branches join
    the summaries at Finalize)."""
    import xarray as xr

    config = write_config(tmp_path, "dask", str(small_archive / "*.nc"), str(tmp_path / "dask"))
    stats = {"tendency": True, "over": "field"}
    config.write_text(yaml.safe_dump({**yaml.safe_load(config.read_text()), "stats": stats}))
    build(config, "--shared_filesystem", *dask_flags(client))
    document = json.loads((tmp_path / "dask" / "stats.json").read_text())
    tendency = document["tendency"]["variables"]
    assert document["over"] == "field"
    with xr.open_mfdataset(sorted(small_archive.glob("*.nc"))) as source:
        for name in ("t", "q"):
            values = source[name].values.astype(np.float32).astype(np.float64)
            pairs = np.diff(values, axis=0)
            assert tendency[name]["count"] == pairs.size
            assert np.isclose(tendency[name]["mean"], pairs.mean(), rtol=1e-12, atol=0)
            assert np.isclose(tendency[name]["variance"], pairs.var(), rtol=1e-12, atol=0)
            field = document["variables"][name]
            assert field["count"] == values.size
            assert np.isclose(field["mean"], values.mean(), rtol=1e-12, atol=0)
            assert np.isclose(field["variance"], values.var(), rtol=1e-12, atol=0)
