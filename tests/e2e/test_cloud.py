"""gs:// in and out through a real GCS JSON API (gcp-storage-emulator), and Dataflow graphs built offline."""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path

import apache_beam as beam
import pytest
import xarray as xr
import yaml
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.runners.portability.fn_api_runner import fn_runner

from pipelines import graph, runners
from pipelines.build import main
from pipelines.inspect import main as inspect_main
from planning.config import parse_config
from planning.plan import make_plan
from planning.run.contracts import BYTES_READ
from planning.specs import cut_spec
from schemas import load_schema
from transforms.cut import CutSamples

from conftest import BUCKET, REPO
from helpers import expected_feature, parse_with_generated_parser, stored_bytes

DATAFLOW = [
    "--runner=DataflowRunner",
    "--project=my-project",
    "--region=us-central1",
    f"--temp_location=gs://{BUCKET}/tmp",
    "--no_auth",
    "--dry_run=True",
    "--sdk_location=container",
]


@pytest.fixture(scope="module")
def uploaded(gcs, tmp_path_factory, sample_file) -> dict[str, list[Path]]:
    """Files in the bucket: time-split TREFHT (classic NetCDF), NetCDF-4, ERA-Interim (or its stand-in)."""
    local = tmp_path_factory.mktemp("upload")
    with xr.open_dataset(sample_file("TREFHT.B06.57.atm.1890-1999ANN.nc")) as ds:
        for i, (start, stop) in enumerate([(0, 37), (37, 80), (80, 110)]):
            ds.isel(time=slice(start, stop)).to_netcdf(local / f"trefht_{i}.nc", format="NETCDF3_64BIT")
    from pipelines.demo import ArchiveShape, write_archive

    # 8 days of 6-hourly steps, as the demo archive: configs/training_ready.yaml splits them by date.
    shape = ArchiveShape(num_files=4, steps_per_file=8, levels=3, lat=20, lon=24)
    write_archive(local / "era5", shape, invariants=True)
    files = {
        "trefht": sorted(local.glob("trefht_*.nc")),
        "era5": sorted((local / "era5").glob("*.nc")),
        "eraint": [sample_file("eraint_uvz.nc")],
        "nc4": [sample_file("nc4uvt.nc")],
    }
    for name, paths in files.items():
        for path in paths:
            gcs.put(str(path), f"{BUCKET}/in/{name}/{path.name}")
    return files


def _config(tmp_path: Path, paths, output: str, sample: dict, concat_dim: str = "time", **output_options) -> Path:
    config = {
        "input": {"paths": paths, "concat_dim": concat_dim},
        "sample": sample,
        "output": {"path": output, "num_shards": 2, **output_options},
    }
    path = tmp_path / f"config-{abs(hash(output))}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


CASES = {
    "trefht": ({"window": {"time": {"size": 8, "stride": 15}}}, "time"),  # windows at 30 and 75 span files
    "eraint": ({"window": {"latitude": 9, "longitude": 9}, "keep": ["level"]}, "month"),
    "nc4": ({"window": {"lat": 16, "lon": 16}, "keep": ["lev"]}, "time"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_gs_input_and_output_equal_a_local_build(gcs, uploaded, tmp_path, name):
    sample, concat_dim = CASES[name]
    remote_out = f"gs://{BUCKET}/out/{name}"
    remote = _config(tmp_path, f"gs://{BUCKET}/in/{name}/*.nc", remote_out, sample, concat_dim)
    local = _config(tmp_path, [str(p) for p in uploaded[name]], str(tmp_path / "local"), sample, concat_dim)
    assert main(["--config", str(remote)]) == 0
    assert main(["--config", str(local)]) == 0

    downloaded = tmp_path / "downloaded"
    gcs.get(remote_out.removeprefix("gs://"), str(downloaded), recursive=True)
    schema = load_schema(remote_out)  # read through gcsfs
    assert {p.name for p in downloaded.iterdir()} == {
        "schema.json",
        "stats.json",
        "parser.py",
        "generations.json",
        "shards.npz",
        "_inventory.json",
        "_manifest.json",
    } | {file for s in schema.splits["data"] for file in (s.file, s.index)}
    for shard in schema.splits["data"]:
        for file in (shard.file, shard.index):  # the shard, and its index written on gs:// as locally
            assert (downloaded / file).read_bytes() == (tmp_path / "local" / file).read_bytes()
    assert inspect_main([remote_out, "--verify", "--source", "40"]) == 0  # every shard read back through gcsfs,
    # and samples compared with the gs:// inputs xarray reads
    parsed = parse_with_generated_parser(downloaded)
    source = xr.concat([xr.open_dataset(p) for p in uploaded[name]], dim=concat_dim)
    variable = schema.variable_features[0].name
    assert len(parsed[variable]) == schema.num_records() > 0
    for i in range(0, schema.num_records(), max(1, schema.num_records() // 40)):
        record = {key: values[i] for key, values in parsed.items()}
        assert (record[variable] == expected_feature(source, schema, variable, record)).all()


def _stored_bytes(plan, files: list[Path]) -> int:
    """Bytes the input files store for every unit's slab (its source box, halos included)."""
    total = 0
    for unit in plan.units:
        box = plan.grid.source_box(unit)
        for source, path in zip(plan.sources, files):
            begin, end = max(box[plan.concat_dim][0], source.start), min(box[plan.concat_dim][1], source.stop)
            if begin < end:
                local = {**box, plan.concat_dim: (begin - source.start, end - source.start)}
                total += stored_bytes(path, local, [v.name for v in plan.variables])
    return total


@pytest.mark.parametrize("name", sorted(CASES))
def test_workers_read_little_more_than_their_slabs(gcs, uploaded, name):
    """No whole-file copies: the bytes fetched by all units stay within 1.3x what their slabs store."""
    sample, concat_dim = CASES[name]
    paths = f"gs://{BUCKET}/in/{name}/*.nc"
    config = parse_config(
        {"input": {"paths": paths, "concat_dim": concat_dim}, "sample": sample, "output": {"path": "x"}}
    )
    plan = make_plan(config, unit_budget_bytes=2e6)  # several units per file, as on real archives
    assert len(plan.units) > len(plan.sources)
    with beam.Pipeline(runner=fn_runner.FnApiRunner()) as pipeline:
        _ = pipeline | beam.Create(list(plan.units)) | CutSamples(cut_spec(plan))
    (counter,) = pipeline.result.metrics().query(MetricsFilter().with_name(BYTES_READ))["counters"]
    stored = _stored_bytes(plan, uploaded[name])
    print(f"{name}: {len(plan.units)} units read {counter.committed / stored:.3f}x the bytes their slabs store")
    assert 0 < counter.committed <= 1.3 * stored


def test_multi_process_local_runner_with_gs(gcs, uploaded, tmp_path):
    """Worker processes unpickle the plan and open their own clients: nothing unpicklable rides along."""
    sample = {"window": {"lat": 10, "lon": 12}, "offsets": {"time": [0, 1]}, "keep": ["level"]}
    single = f"gs://{BUCKET}/out/single"
    multi = f"gs://{BUCKET}/out/multi"
    paths = f"gs://{BUCKET}/in/era5/*.nc"
    assert main(["--config", str(_config(tmp_path, paths, single, sample))]) == 0
    flags = ["--direct_num_workers=1", "--direct_running_mode=multi_processing"]  # a worker process of its own
    assert main(["--config", str(_config(tmp_path, paths, multi, sample)), *flags]) == 0
    for shard in load_schema(multi).splits["data"]:
        assert gcs.cat(f"{multi}/{shard.file}") == gcs.cat(f"{single}/{shard.file}")
    assert not gcs.exists(f"{multi}/_tmp")


def test_a_gs_build_refuses_a_working_folder_others_can_write(gcs, uploaded, tmp_path, monkeypatch, capsys):
    """A local run into gs:// keeps its working files in this user's own temp folder, never in one planted there."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    planted = tmp_path / f"xarray-tfrecords-{os.geteuid()}"
    planted.mkdir()
    planted.chmod(0o777)  # as another local user would leave it, to read or swap the run's files
    output = f"gs://{BUCKET}/out/planted"
    sample = {"window": {"lat": 16, "lon": 16}, "keep": ["lev"]}
    assert main(["--config", str(_config(tmp_path, f"gs://{BUCKET}/in/nc4/*.nc", output, sample))]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"error: working folder: {planted} may be written by other users")
    assert not list(planted.iterdir()) and not gcs.exists(f"{output}/schema.json")


def _inputs_for(config_name: str) -> tuple[str, str]:
    if config_name == "erainterim_patches.yaml":
        return f"gs://{BUCKET}/in/eraint/*.nc", "month"
    return f"gs://{BUCKET}/in/era5/*.nc", "time"


@pytest.mark.parametrize("config_name", sorted(p.name for p in (REPO / "configs").glob("*.yaml")))
def test_dataflow_graph_builds_offline_for_every_config(uploaded, staged_once, tmp_path, capsys, config_name):
    config = yaml.safe_load((REPO / "configs" / config_name).read_text())
    config["input"]["paths"], config["input"]["concat_dim"] = _inputs_for(config_name)
    config["output"]["path"] = f"gs://{BUCKET}/dry/{config_name}"
    path = tmp_path / config_name
    path.write_text(yaml.safe_dump(config))
    assert main(["--config", str(path), *DATAFLOW, f"--setup_file={REPO / 'setup.py'}"]) == 0
    assert "Dry run: the job graph" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"drop": "--temp_location"}, "DataflowRunner needs --temp_location=gs://"),
        ({"flag": "--temp_location=/tmp/local"}, "--temp_location=/tmp/local is local"),
        ({"output": "out/local"}, "output: out/local is a local path, but DataflowRunner runs on remote workers"),
        ({"input": "/data/*.nc"}, "input: /data/*.nc is a local path"),
        ({"flag": "--project=P"}, "Beam options: Invalid Project ID (P)"),
        ({"flag": "--region=Central US"}, "--region=Central US is not a Google Cloud region name"),
        (
            {"flag": "--temp_location=gs://no-such-bucket/tmp"},
            "--temp_location=gs://no-such-bucket/tmp: bucket gs://no-such-bucket does not exist",
        ),
        ({"flag": "--staging_location=gs://nope/staging"}, "--staging_location=gs://nope/staging: bucket gs://nope"),
        (
            {"output": "gs://no-such-bucket/out"},
            "output: bucket gs://no-such-bucket of gs://no-such-bucket/out does not",
        ),
    ],
)
def test_bad_dataflow_setups_fail_before_submission(uploaded, tmp_path, capsys, change, expected):
    flags = [f for f in DATAFLOW if not f.startswith(change.get("drop", "--never"))]
    if "flag" in change:
        key = change["flag"].split("=")[0]
        flags = [f for f in flags if not f.startswith(key)] + [change["flag"]]
    config = _config(
        tmp_path,
        change.get("input", f"gs://{BUCKET}/in/era5/*.nc"),
        change.get("output", f"gs://{BUCKET}/dry/bad"),
        {"window": {"lat": 9, "lon": 9}},
    )
    assert main(["--config", str(config), *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("error: ") and expected in err, err


def _dry_run_config(tmp_path: Path) -> Path:
    return _config(tmp_path, f"gs://{BUCKET}/in/era5/*.nc", f"gs://{BUCKET}/dry/ship", {"window": {"lat": 9, "lon": 9}})


def test_dataflow_gets_this_checkout_when_no_code_is_shipped(uploaded, gcs, staged_once, tmp_path, capsys):
    assert main(["--config", str(_dry_run_config(tmp_path)), *DATAFLOW]) == 0
    out = capsys.readouterr().out
    assert f"Shipping this checkout to the workers with --setup_file={REPO / 'setup.py'}, " in out
    assert f"and what they run with --requirements_file={REPO / 'worker-requirements.txt'} (or choose" in out
    assert "Dry run: the job graph" in out
    # The temp location was checked by writing a probe object there, which is gone again.
    assert not [p for p in gcs.find(f"{BUCKET}/tmp") if "write-check" in p]


def test_a_dataflow_launch_leaves_nothing_in_the_temp_directory(uploaded, gcs, staged_once, tmp_path, monkeypatch):
    """Beam stages the job's dependencies (the sdist, the pickled session) in a temp folder it never removes."""
    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    assert main(["--config", str(_dry_run_config(tmp_path)), *DATAFLOW]) == 0
    assert tempfile.tempdir == str(temp)  # given back
    assert sorted(p.name for p in temp.iterdir() if not p.name.startswith("xarray-tfrecords-locks")) == []


def test_dataflow_refuses_an_install_that_cannot_ship_itself(uploaded, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(runners, "PACKAGE_ROOT", tmp_path)  # installed without a checkout: no setup.py beside it
    assert main(["--config", str(_dry_run_config(tmp_path)), *DATAFLOW]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--setup_file=" in err and "--sdk_container_image=" in err, err


def test_a_dataflow_dry_run_prints_the_job_graph_size_and_refuses_one_over_the_limit(
    uploaded, staged_once, tmp_path, capsys, monkeypatch
):
    config = str(_dry_run_config(tmp_path))
    assert main(["--config", config, *DATAFLOW]) == 0
    out = capsys.readouterr().out
    sizes = [line for line in out.splitlines() if line.startswith("  job graph: ")]
    assert len(sizes) == 1 and sizes[0].endswith(" MB (Dataflow's limit: 10 MB)"), out
    monkeypatch.setattr(graph, "DATAFLOW_GRAPH_LIMIT", 10_000)  # as a graph over 10 MB would be
    assert main(["--config", config, *DATAFLOW]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert err.count("\n") == 0 and err.startswith("error: job graph: ") and "over Dataflow's limit" in err, err
    assert "Dry run" not in captured.out


def test_a_region_shaped_name_dataflow_may_not_know_only_warns(uploaded, staged_once, tmp_path, capsys, caplog):
    flags = [f for f in DATAFLOW if not f.startswith("--region")] + ["--region=moon-central9"]
    assert main(["--config", str(_dry_run_config(tmp_path)), *flags]) == 0
    assert "Dry run: the job graph" in capsys.readouterr().out
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("--region=moon-central9 is not among the Dataflow regions" in w for w in warnings), warnings


@pytest.mark.parametrize("ending", [b"\r", b"\n", b"\r\n", b"\r\n\r\n", b"--", b""])
def test_the_emulator_keeps_every_byte_of_an_upload(gcs, ending):
    # Its own parser dropped an upload's last b"\r" (gcsfs ends the data with b"\n--boundary"): a spill object
    # one byte short about once in 256, which the shard writer rightly refused. Both clients' multipart forms.
    from google.cloud import storage

    data = os.urandom(1000) + b"\r\n--==0==\n" + ending  # a delimiter's look-alike inside the data too
    gcs.pipe(f"{BUCKET}/emulator/gcsfs", data)
    assert gcs.cat(f"{BUCKET}/emulator/gcsfs") == data
    client = storage.Client(project="test", credentials=None, client_options={"api_endpoint": gcs_endpoint()})
    client.bucket(BUCKET).blob("emulator/client").upload_from_string(data)  # CRLF delimiters (RFC 2046)
    assert gcs.cat(f"{BUCKET}/emulator/client") == data


def gcs_endpoint() -> str:
    return os.environ["STORAGE_EMULATOR_HOST"]


def test_an_output_folder_made_in_the_cloud_console_is_built_into(gcs, uploaded, tmp_path, capsys):
    # The Console's "Create folder" leaves placeholder objects named "folder/": folders, as an empty local
    # directory is, not files this tool did not write. A file beside them still is.
    from google.cloud import storage

    sample, concat_dim = CASES["trefht"]
    output = f"gs://{BUCKET}/out/console"
    bucket = storage.Client(project="test", client_options={"api_endpoint": gcs_endpoint()}).bucket(BUCKET)
    for placeholder in ("out/console/", "out/console/plots/"):
        bucket.blob(placeholder).upload_from_string(b"")
    config = _config(tmp_path, f"gs://{BUCKET}/in/trefht/*.nc", output, sample, concat_dim)
    assert main(["--config", str(config)]) == 0
    assert main(["--config", str(config), "--overwrite"]) == 0
    assert gcs.exists(f"{BUCKET}/out/console/plots/")  # (a folder of the user's, left as it was)
    bucket.blob("out/console/plots/figure.png").upload_from_string(b"\x89PNG")
    assert main(["--config", str(config), "--overwrite"]) == 2
    assert "did not write (plots/figure.png)" in capsys.readouterr().err
