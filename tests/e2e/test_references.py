"""Virtual references as input end to end: a kerchunk reference file made from NetCDF-4 files builds the shards the
files themselves build; references to a file that is gone are refused in one line, at planning and on a worker."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml
from arco_like import PACKED, STATIC, arco_like, write_netcdf

from pipelines.build import main
from schemas import load_schema, load_stats

from helpers import refused

kerchunk_hdf = pytest.importorskip("kerchunk.hdf")
kerchunk_combine = pytest.importorskip("kerchunk.combine")

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

VARIABLES = ["temperature", "2m_temperature", PACKED, STATIC]
SAMPLE = {"window": {"latitude": 5, "longitude": 6}, "keep": ["level"]}


def _config(paths, output: Path) -> dict:
    return {
        "input": {"paths": [str(p) for p in paths], "concat_dim": "time"},
        "variables": VARIABLES,
        "select": {"level": [500, 850]},
        "sample": SAMPLE,
        "output": {"path": str(output), "num_shards": 2},
    }


def _build(tmp_path: Path, config: dict) -> Path:
    path = tmp_path / f"{Path(config['output']['path']).name}.yaml"
    path.write_text(yaml.safe_dump(config))
    assert main(["--config", str(path), "--quiet"]) == 0
    return Path(config["output"]["path"])


def write_references(files: list[Path], path: Path) -> Path:
    """One kerchunk reference file for NetCDF-4 files along time and a static file, as kerchunk's docs combine them
    (no chunk inlined: every chunk is a byte range of its file)."""
    along = [kerchunk_hdf.SingleHdf5ToZarr(str(p), inline_threshold=0).translate() for p in files[:-1]]
    combined = kerchunk_combine.MultiZarrToZarr(
        along, concat_dims=["time"], identical_dims=["level", "latitude", "longitude"]
    ).translate()
    static = kerchunk_hdf.SingleHdf5ToZarr(str(files[-1]), inline_threshold=0).translate()
    path.write_text(json.dumps(kerchunk_combine.merge_vars([combined, static])))
    return path


@pytest.fixture(scope="module")
def netcdf(tmp_path_factory) -> list[Path]:
    return write_netcdf(arco_like(), tmp_path_factory.mktemp("references") / "netcdf")


@pytest.fixture(scope="module")
def from_netcdf(netcdf, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("from_netcdf")
    return _build(root, _config(netcdf, root / "out"))


def _shards(output: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(output.glob("*.tfrecord*"))}


@pytest.mark.parametrize("form", ["json", "parquet", "file-urls"])
def test_a_kerchunk_reference_gives_the_shards_of_its_netcdf_files(netcdf, from_netcdf, tmp_path, form):
    references = write_references(netcdf, tmp_path / "era5.json")
    if form == "file-urls":  # the files named as file:// URLs, as references made from URLs name them
        text = references.read_text()
        for path in netcdf:
            text = text.replace(json.dumps(str(path))[1:-1], f"file://{path}")
        references.write_text(text)
    if form == "parquet":
        from kerchunk.df import refs_to_dataframe

        refs_to_dataframe(json.loads(references.read_text()), str(tmp_path / "era5.parq"))
        references = tmp_path / "era5.parq"
    output = _build(tmp_path, _config([references], tmp_path / "out"))
    shards = _shards(output)
    assert shards and shards == _shards(from_netcdf)
    assert load_stats(str(output)) == load_stats(str(from_netcdf))
    assert load_schema(str(output)).sources["listed"][0]["path"] == str(references)


def test_a_reference_to_a_missing_file_is_refused_at_planning(netcdf, tmp_path, capsys):
    files = [tmp_path / p.name for p in netcdf]
    for source, copy in zip(netcdf, files):
        shutil.copy(source, copy)
    references = write_references(files, tmp_path / "era5.json")
    files[1].unlink()
    line = refused(_config([references], tmp_path / "out"), tmp_path, capsys)
    assert f"{references}: refers to {files[1]}, which is not found" in line
    assert "regenerate the references" in line


def test_a_referenced_file_gone_before_a_worker_reads_it_names_the_file(netcdf, tmp_path):
    """A worker's read of a chunk whose file went after planning: an error naming the file, never fill values
    (zarr reads an absent chunk as fill values)."""
    from planning.formats.zarr_store import open_store, open_store_dataset
    from schemas.errors import UserError

    files = [tmp_path / p.name for p in netcdf]
    for source, copy in zip(netcdf, files):
        shutil.copy(source, copy)
    references = str(write_references(files, tmp_path / "era5.json"))
    store = open_store(references)
    dataset = open_store_dataset(references, store, decode_times=False, indexes=False)
    files[0].unlink()
    with pytest.raises(UserError, match=f"'temperature/0.0.0.0' refers to {files[0]}, which is not found"):
        np.asarray(dataset["temperature"].variable[0])


def test_a_reference_file_that_is_not_there_is_refused(tmp_path, capsys):
    missing = tmp_path / "nowhere.json"
    line = refused(_config([missing], tmp_path / "out"), tmp_path, capsys)
    assert f"{missing}: no such reference file" in line


def test_a_reference_file_on_cloud_storage_to_files_there(netcdf, from_netcdf, gcs, tmp_path, capsys):
    """References and files in a bucket (the references name gs:// URLs): the shards of the local files; a file
    gone from the bucket refused in one line."""
    from conftest import BUCKET

    local = write_references(netcdf, tmp_path / "era5.json")
    text = local.read_text()
    for path in netcdf:
        gcs.put(str(path), f"{BUCKET}/refs/{path.name}")
        text = text.replace(json.dumps(str(path))[1:-1], f"gs://{BUCKET}/refs/{path.name}")
    assert str(netcdf[0]) not in text
    remote = tmp_path / "remote.json"
    remote.write_text(text)
    gcs.put(str(remote), f"{BUCKET}/refs/era5.json")
    output = _build(tmp_path, _config([f"gs://{BUCKET}/refs/era5.json"], tmp_path / "out"))
    assert _shards(output) == _shards(from_netcdf)
    gcs.rm(f"{BUCKET}/refs/{netcdf[1].name}")
    line = refused(_config([f"gs://{BUCKET}/refs/era5.json"], tmp_path / "again"), tmp_path, capsys)
    assert f"refers to gs://{BUCKET}/refs/{netcdf[1].name}, which is not found" in line


def test_an_append_reads_references_regenerated_with_more_files(netcdf, from_netcdf, tmp_path):
    """References to the first files, then regenerated to all of them and --append: the samples of a full build."""
    from schemas import Reader

    first = write_references([*netcdf[:2], netcdf[-1]], tmp_path / "first.json")
    output = _build(tmp_path, _config([first], tmp_path / "out"))
    config = _config([write_references(netcdf, tmp_path / "all.json")], output)
    path = tmp_path / "append.yaml"
    path.write_text(yaml.safe_dump(config))
    assert main(["--config", str(path), "--quiet", "--append"]) == 0

    def by_sample(output) -> dict:
        records = Reader(str(output), "data").read_all()
        keys = zip(*(records[f"index/{d}"].ravel() for d in ("time", "latitude", "longitude")))
        return {key: records["temperature"][i] for i, key in enumerate(keys)}

    appended, expected = by_sample(output), by_sample(from_netcdf)
    assert appended.keys() == expected.keys()
    for key, values in expected.items():
        np.testing.assert_array_equal(appended[key], values)
