"""Zarr input end to end: an ARCO-ERA5-like store (local and through gs://) builds the shards its NetCDF copy does."""

from __future__ import annotations

import functools
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
import yaml
from arco_like import PACKED, STATIC, arco_like, set_codecs, write_netcdf, write_store

from pipelines import graph
from pipelines.build import main
from planning.plan import make_plan
from schemas import load_schema, load_stats

from conftest import BUCKET, REPO
from helpers import assert_matches_source, doc_block, expected_feature, read_all_records, refused

pytestmark = [
    pytest.mark.filterwarnings("ignore:Consolidated metadata:UserWarning"),
    pytest.mark.filterwarnings("ignore:Failed to open Zarr store with consolidated metadata:RuntimeWarning"),
]

#: A few of the store's many variables: on levels, at the surface, packed, and static.
VARIABLES = ["temperature", "geopotential", "2m_temperature", PACKED, STATIC]
SAMPLE = {"window": {"latitude": 5, "longitude": 6}, "keep": ["level"]}


def _config(tmp_path: Path, paths, output: Path, variables=VARIABLES) -> Path:
    config = {
        "input": {"paths": [str(p) for p in paths], "concat_dim": "time"},
        "variables": variables,
        "sample": SAMPLE,
        "output": {"path": str(output), "num_shards": 2},
    }
    path = tmp_path / f"{output.name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _build(tmp_path: Path, paths, output: Path) -> Path:
    assert main(["--config", str(_config(tmp_path, paths, output)), "--quiet"]) == 0
    return output


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> dict:
    """The same data as a v3 store with consolidated metadata, a v2 store without, and NetCDF files."""
    root = tmp_path_factory.mktemp("arco")
    ds = arco_like()
    return {
        "dataset": ds,
        "v3": write_store(ds, root / "arco-v3.zarr"),
        "v2": write_store(ds, root / "arco-v2.zarr", zarr_format=2, consolidated=False),
        "netcdf": write_netcdf(ds, root / "netcdf"),
    }


@pytest.fixture(scope="module")
def from_netcdf(inputs, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("from_netcdf")
    return _build(root, inputs["netcdf"], root / "out")


def _shards(output: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(output.glob("*.tfrecord*"))}


def assert_same_output(output: Path, reference: Path) -> None:
    """Byte-identical shards and equal statistics."""
    shards = _shards(output)
    assert shards and shards == _shards(reference)
    assert load_stats(str(output)) == load_stats(str(reference))


def assert_records_are_slices(output: Path, store: Path | str, levels=None) -> None:
    """Every record's variables equal their slice of the store (of its ``levels``), as xarray reads it."""
    schema = load_schema(str(output))
    records = read_all_records(output, schema)
    source = xr.open_zarr(store, chunks=None).load()
    if levels is not None:
        source = source.sel(level=levels)
    count = len(records["index/time"])
    assert count == schema.sample["num_samples"] > 0
    for i in range(count):
        record = {name: values[i] for name, values in records.items()}
        for feature in schema.variable_features:
            np.testing.assert_array_equal(record[feature.name], expected_feature(source, schema, feature.name, record))


@pytest.mark.parametrize("layout", ["v3", "v2"])
def test_a_store_gives_the_shards_of_its_netcdf_copy(inputs, from_netcdf, tmp_path, layout):
    output = _build(tmp_path, [inputs[layout]], tmp_path / "out")
    assert_same_output(output, from_netcdf)
    assert_records_are_slices(output, inputs[layout])
    sources = load_schema(str(output)).sources
    assert (sources["files"], sources["listed"][0]["path"]) == (1, str(inputs[layout]))
    assert_matches_source(output, 100)


@pytest.mark.parametrize("in_place", [True, False])
def test_units_cut_in_pieces_write_the_shards_of_the_netcdf_copy(
    inputs, from_netcdf, tmp_path, monkeypatch, capsys, in_place
):
    """A unit budget under one chunk: each unit (a step) is read once and cut in pieces, a block each, written in
    place or through bucket files; the summary says what was fetched against the chunks needed."""
    monkeypatch.setattr(graph, "make_plan", functools.partial(make_plan, unit_budget_bytes=2e4))
    path = _config(tmp_path, [inputs["v3"]], tmp_path / "out")
    config = yaml.safe_load(path.read_text())
    config["output"]["in_place"] = in_place
    path.write_text(yaml.safe_dump(config))
    assert main(["--config", str(path), "--quiet"]) == 0
    assert _shards(tmp_path / "out") == _shards(from_netcdf)
    # The same statistics, to the rounding of another order of float additions (blocks of other sizes).
    _assert_close(load_stats(str(tmp_path / "out")), load_stats(str(from_netcdf)))
    out = capsys.readouterr().out
    found = re.search(r"read ([\d.]+) MB from the store for ([\d.]+) MB of chunks needed \(([\d.]+)x", out)
    assert found, out
    assert 1 < float(found.group(3)) < 1.1  # above 1x by the static field, which every unit fetches, the first owns


def _assert_close(found, expected) -> None:
    if isinstance(expected, dict):
        assert found.keys() == expected.keys()
        for key in expected:
            _assert_close(found[key], expected[key])
    elif isinstance(expected, list):
        assert len(found) == len(expected)
        for a, b in zip(found, expected):
            _assert_close(a, b)
    elif isinstance(expected, float):
        assert found == pytest.approx(expected, rel=1e-12, abs=1e-300, nan_ok=True)
    else:
        assert found == expected


def test_the_packed_variable_decodes_as_xarray_decodes_it(inputs, from_netcdf):
    """The NetCDF route decodes scale, offset and fill itself: the store's values, through xarray, agree."""
    schema = load_schema(str(from_netcdf))
    records = read_all_records(from_netcdf, schema)
    assert np.isnan(records[PACKED]).any()  # the fill value is masked, not read as a number
    store = xr.open_zarr(inputs["v3"], chunks=None)[PACKED].values
    with xr.open_mfdataset(inputs["netcdf"][:-1]) as files:
        np.testing.assert_array_equal(store, files[PACKED].values)


def test_a_store_on_cloud_storage(inputs, from_netcdf, gcs, tmp_path):
    gcs.put(str(inputs["v3"]), f"{BUCKET}/arco/arco.zarr", recursive=True)
    url = f"gs://{BUCKET}/arco/arco.zarr"
    output = _build(tmp_path, [url], tmp_path / "out")
    assert_same_output(output, from_netcdf)
    assert_records_are_slices(output, inputs["v3"])
    # Out to the bucket too: the same shards.
    config = yaml.safe_load(_config(tmp_path, [url], tmp_path / "out").read_text())
    config["output"]["path"] = f"gs://{BUCKET}/arco-out"
    (tmp_path / "remote.yaml").write_text(yaml.safe_dump(config))
    assert main(["--config", str(tmp_path / "remote.yaml"), "--quiet"]) == 0
    remote = {Path(p).name: gcs.cat(p) for p in gcs.glob(f"{BUCKET}/arco-out/*.tfrecord*")}
    assert remote == _shards(from_netcdf)


def assert_fails(tmp_path: Path, capsys, paths, *expected: str, variables=VARIABLES) -> str:
    output = tmp_path / "failed"
    status = main(["--config", str(_config(tmp_path, paths, output, variables))])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert status == 2, err
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for fragment in expected:
        assert fragment in lines[0], lines[0]
    assert not (output / "schema.json").exists()
    return lines[0]


def test_a_store_listed_with_netcdf_files_is_refused(inputs, tmp_path, capsys):
    paths = [inputs["v3"], inputs["netcdf"][0]]
    assert_fails(tmp_path, capsys, paths, str(inputs["v3"]), "is a Zarr store", "read alone")


def test_a_directory_named_zarr_that_is_not_a_store(tmp_path, capsys):
    (tmp_path / "empty.zarr").mkdir()
    assert_fails(tmp_path, capsys, [tmp_path / "empty.zarr"], "empty.zarr", "not a Zarr store")


def test_a_variable_the_store_lacks(inputs, tmp_path, capsys):
    assert_fails(
        tmp_path, capsys, [inputs["v3"]], "'relative_humidity'", "not a data variable", variables=["relative_humidity"]
    )


def test_a_chunk_missing_in_the_middle(inputs, tmp_path, capsys):
    store = shutil.copytree(inputs["v3"], tmp_path / "holed.zarr")
    (store / "geopotential" / "c" / "5" / "0" / "0" / "0").unlink()
    message = assert_fails(tmp_path, capsys, [store], "'geopotential'", "'geopotential/c/5/0/0/0' is missing")
    assert "(time steps 5 to 5)" in message and "set input.missing_chunks: fill" in message
    # A store written with write_empty_chunks=False: the absent chunk reads as fill values, as xarray reads it.
    config = yaml.safe_load(_config(tmp_path, [store], tmp_path / "filled").read_text())
    config["input"]["missing_chunks"] = "fill"
    (tmp_path / "filled.yaml").write_text(yaml.safe_dump(config))
    assert main(["--config", str(tmp_path / "filled.yaml"), "--quiet"]) == 0
    assert_records_are_slices(tmp_path / "filled", store)
    records = read_all_records(tmp_path / "filled", load_schema(str(tmp_path / "filled")))
    at_step_5 = records["index/time"] == 5
    assert at_step_5.any() and np.isnan(records["geopotential"][at_step_5]).all()
    assert not np.isnan(records["geopotential"][~at_step_5]).any()


@pytest.mark.parametrize("coordinate", ["time", "latitude"])
def test_a_coordinate_chunk_missing_is_named(inputs, tmp_path, capsys, coordinate):
    """A coordinate read as fill values would misplace every sample (latitude: silently): named, even with fill."""
    store = shutil.copytree(inputs["v3"], tmp_path / "holed.zarr")
    (store / coordinate / "c" / "0").unlink()
    config = yaml.safe_load(_config(tmp_path, [store], tmp_path / "failed").read_text())
    config["input"]["missing_chunks"] = "fill"
    line = refused(config, tmp_path, capsys)
    assert f"holed.zarr: coordinate '{coordinate}': chunk '{coordinate}/c/0' is missing" in line, line
    assert "restore it" in line


@pytest.mark.parametrize(
    ("layout", "codec", "expected"),
    [
        ("v2", {"id": "imagecodecs_jpeg2k", "level": 80}, "install imagecodecs (pip install imagecodecs)"),
        ("v2", {"id": "zfpy", "mode": 4}, "install zfpy (pip install zfpy)"),
        # Opens without zfpy: only decoding a chunk would fail, on the worker.
        ("v3", {"name": "numcodecs.zfpy", "configuration": {"mode": 4}}, "install zfpy (pip install zfpy)"),
        ("v2", {"id": "blosc2"}, "install the package that registers it with numcodecs or zarr (imagecodecs, "),
    ],
    ids=["imagecodecs", "zfpy-v2", "zfpy-v3", "unknown"],
)
def test_a_codec_that_is_not_installed(inputs, tmp_path, capsys, layout, codec, expected):
    store = shutil.copytree(inputs[layout], tmp_path / "coded.zarr")
    if layout == "v2":
        metadata = store / "temperature" / ".zarray"
        metadata.write_text(json.dumps(json.loads(metadata.read_text()) | {"compressor": codec}))
    else:
        set_codecs(store, "temperature", [codec])
    name = codec.get("id") or codec["name"]
    line = assert_fails(tmp_path, capsys, [store], f"coded.zarr: codec {name!r} is not available; {expected}")
    assert line.endswith(")"), line  # names a package, never "pip install the"


def test_a_dim_of_absurd_length_is_refused_before_anything_is_allocated(tmp_path, capsys):
    """Metadata declaring 10^12 steps without a coordinate (16 KB on disk): one line naming the dim and its size."""
    import zarr

    root = zarr.open_group(tmp_path / "huge.zarr", mode="w", zarr_format=3)
    root.create_array("v", shape=(10**12, 4), chunks=(10**6, 4), dtype="f4", dimension_names=["time", "latitude"])
    message = assert_fails(tmp_path, capsys, [tmp_path / "huge.zarr"], "huge.zarr: dim 'time' has", variables=["v"])
    assert "1,000,000,000,000 elements, over the 2,147,483,648 a build can plan" in message
    # With a coordinate too: refused before it is loaded (8 TB).
    root.create_array("time", shape=(10**12,), chunks=(10**6,), dtype="i8", dimension_names=["time"])
    assert_fails(
        tmp_path, capsys, [tmp_path / "huge.zarr"], "huge.zarr: dim 'time' has 1,000,000,000,000", variables=["v"]
    )


def test_a_selection_reads_the_same_from_a_store_as_from_files(inputs, tmp_path):
    """Levels and a latitude band from the store, and from its NetCDF copy: the same shards."""
    outputs = {}
    for name in ("v3", "netcdf"):
        paths = inputs[name] if name == "netcdf" else [inputs[name]]
        path = _config(tmp_path, paths, tmp_path / f"selected-{name}")
        config = yaml.safe_load(path.read_text())
        config["select"] = {"level": [500, 850], "latitude": {"min": -70, "max": 70}}
        path.write_text(yaml.safe_dump(config))
        assert main(["--config", str(path), "--quiet"]) == 0
        outputs[name] = tmp_path / f"selected-{name}"
    assert_same_output(outputs["v3"], outputs["netcdf"])
    schema = load_schema(str(outputs["v3"]))
    assert schema.feature("temperature").shape[0] == 2  # two levels
    source = inputs["dataset"].sel(level=[500, 850])
    records = read_all_records(outputs["v3"], schema)
    latitudes = source.latitude.values[(source.latitude.values >= -70) & (source.latitude.values <= 70)]
    for i in range(0, len(records["index/time"]), 5):
        t, y, x = (int(records[f"index/{d}"][i]) for d in ("time", "latitude", "longitude"))
        expected = source.temperature.isel(time=t, longitude=slice(x, x + 6)).sel(latitude=latitudes[y : y + 5])
        np.testing.assert_array_equal(records["temperature"][i], expected.values)
    assert_matches_source(outputs["v3"], 100)


@pytest.mark.parametrize("decode_times", [True, False])
def test_the_other_features_build_the_same_from_a_store_as_from_files(inputs, tmp_path, decode_times):
    """Pairs along time across chunks and files, splits, nan_policy: drop, stats per level, a stack, a seed,
    packed and compressed records, times kept as numbers or not: the store and its NetCDF copy agree."""
    outputs = {}
    for name in ("v3", "netcdf"):
        paths = inputs[name] if name == "netcdf" else [inputs[name]]
        path = _config(
            tmp_path, paths, tmp_path / f"features-{name}", variables=["temperature", "geopotential", PACKED]
        )
        config = yaml.safe_load(path.read_text())
        last, after = ("2020-01-01T05", "2020-01-01T06") if decode_times else (1051901, 1051902)
        config["input"]["decode_times"] = decode_times
        config["sample"] = {"window": {"latitude": 5, "longitude": 6}, "offsets": {"time": [0, 1]}, "keep": ["level"]}
        config |= {
            "splits": {"train": {"time": [None, last]}, "valid": {"time": [after, None]}},
            "nan_policy": "drop",
            "stats": {"per": ["level"]},
            "layout": {"stack": {"name": "upper", "variables": ["temperature", "geopotential"]}},
            "shuffle": {"seed": 7},
        }
        config["output"] |= {"examples_per_record": 2, "compression": "gzip"}
        path.write_text(yaml.safe_dump(config))
        assert main(["--config", str(path), "--quiet"]) == 0
        outputs[name] = tmp_path / f"features-{name}"
    assert_same_output(outputs["v3"], outputs["netcdf"])
    schema = load_schema(str(outputs["v3"]))
    assert list(schema.splits) == ["train", "valid"]
    for name in outputs:
        assert_matches_source(outputs[name], 100)


def test_the_readme_config_builds_from_an_arco_like_store(inputs, tmp_path):
    """The docs' ARCO-ERA5 config, on the test's store (ARCO's names and layout) and without its date splits."""
    config = yaml.safe_load(doc_block("zarr:config"))
    assert config["input"]["paths"].startswith("gs://gcp-public-data-arco-era5/")
    config["input"]["paths"] = str(inputs["v3"])
    config["sample"]["window"] = {"latitude": 4, "longitude": 4}  # the test's grid is 10 x 18
    del config["splits"]  # 2010 to 2020; the test's store holds 12 hours of 2020
    config["output"]["path"] = str(tmp_path / "out")
    (tmp_path / "arco_era5.yaml").write_text(yaml.safe_dump(config))
    assert main(["--config", str(tmp_path / "arco_era5.yaml"), "--quiet"]) == 0
    assert_records_are_slices(tmp_path / "out", inputs["v3"], levels=config["select"]["level"])


def test_the_readme_dataflow_command_builds_its_graph(inputs, gcs, staged_once, tmp_path, capsys):
    """The docs' Dataflow command line, dry run against the storage emulator."""
    command = doc_block("zarr:dataflow").replace("\\\n", " ").split()
    assert command[:4] == ["python", "-m", "pipelines.build", "--config"]
    gcs.put(str(inputs["v3"]), f"{BUCKET}/readme/arco.zarr", recursive=True)
    config = yaml.safe_load(doc_block("zarr:config"))
    config["input"]["paths"] = f"gs://{BUCKET}/readme/arco.zarr"
    config["sample"]["window"] = {"latitude": 4, "longitude": 4}
    config["splits"] = {
        "train": {"time": ["2020-01-01T00", "2020-01-01T07"]},
        "valid": {"time": ["2020-01-01T08", None]},
    }
    config["output"]["path"] = f"gs://{BUCKET}/readme/out"
    (tmp_path / command[4]).write_text(yaml.safe_dump(config))
    flags = [f.replace("my-bucket", BUCKET) for f in command[5:] if not f.startswith("--setup_file")]
    offline = ["--no_auth", "--dry_run=True", f"--setup_file={REPO / 'setup.py'}"]
    assert main(["--config", str(tmp_path / command[4]), *flags, *offline]) == 0
    assert "Dry run: the job graph" in capsys.readouterr().out
