"""Icechunk repositories as input end to end: a tag, a branch and a snapshot id build the shards the same data builds
from NetCDF files, the snapshot read recorded; an append reads the branch's later snapshot and records it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from arco_like import PACKED, STATIC, arco_like, write_netcdf
from arco_like import _encoding as arco_like_encoding  # as the NetCDF files store them

from pipelines.build import main
from schemas import load_schema, load_stats

from helpers import refused

icechunk = pytest.importorskip("icechunk")

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

VARIABLES = ["temperature", "2m_temperature", PACKED, STATIC]
#: Steps in the first commit (tagged v1); the second commit appends the rest.
FIRST = 8


def _config(path, output: Path, icechunk_version: dict | None = None) -> dict:
    config = {
        "input": {"paths": [str(path)], "concat_dim": "time"},
        "variables": VARIABLES,
        "select": {"level": [500, 850]},
        "sample": {"window": {"latitude": 5, "longitude": 6}, "keep": ["level"]},
        "output": {"path": str(output), "num_shards": 2},
    }
    if icechunk_version is not None:
        config["input"]["icechunk"] = icechunk_version
    return config


def _build(tmp_path: Path, config: dict, *flags: str) -> Path:
    path = tmp_path / f"{Path(config['output']['path']).name}.yaml"
    path.write_text(yaml.safe_dump(config))
    assert main(["--config", str(path), "--quiet", *flags]) == 0
    return Path(config["output"]["path"])


@pytest.fixture(scope="module")
def repository(tmp_path_factory) -> dict:
    """A repository of two commits on main (the first FIRST steps, tagged v1; then the rest appended), and the
    same data as NetCDF files, up to each commit."""
    root = tmp_path_factory.mktemp("icechunk")
    ds = arco_like()
    path = root / "repo"
    repo = icechunk.Repository.create(icechunk.local_filesystem_storage(str(path)))
    session = repo.writable_session("main")
    ds.isel(time=slice(0, FIRST)).to_zarr(
        session.store, zarr_format=3, consolidated=False, encoding=arco_like_encoding(ds)
    )
    first = session.commit("first steps")
    repo.create_tag("v1", snapshot_id=first)
    session = repo.writable_session("main")
    ds.isel(time=slice(FIRST, None)).to_zarr(session.store, append_dim="time", consolidated=False)
    second = session.commit("more steps")
    return {
        "path": path,
        "first": first,
        "second": second,
        "netcdf_first": write_netcdf(ds.isel(time=slice(0, FIRST)), root / "netcdf_first"),
        "netcdf": write_netcdf(ds, root / "netcdf"),
    }


def _shards(output: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(output.glob("*.tfrecord*"))}


def _from_netcdf(tmp_path: Path, files: list[Path]) -> Path:
    config = _config("x", tmp_path / "from_netcdf")
    config["input"]["paths"] = [str(p) for p in files]
    return _build(tmp_path, config)


@pytest.mark.parametrize("version", ["tag", "snapshot"])
def test_a_tag_or_snapshot_gives_the_shards_of_its_netcdf_copy(repository, tmp_path, version):
    chosen = {"tag": "v1"} if version == "tag" else {"snapshot": repository["first"]}
    output = _build(tmp_path, _config(repository["path"], tmp_path / "out", chosen))
    reference = _from_netcdf(tmp_path, repository["netcdf_first"])
    assert _shards(output) and _shards(output) == _shards(reference)
    assert load_stats(str(output)) == load_stats(str(reference))
    assert load_schema(str(output)).sources["icechunk_snapshot"] == repository["first"]


def test_the_branch_by_default_and_an_append_that_reads_its_later_snapshot(repository, tmp_path):
    """Built from tag v1 first, then appended from branch main (the default): the new generation reads main's
    snapshot, records it, and the output holds what a build of every step holds."""
    output = _build(tmp_path, _config(repository["path"], tmp_path / "out", {"tag": "v1"}))
    _build(tmp_path, _config(repository["path"], output), "--append")
    generations = json.loads((output / "generations.json").read_text())["generations"]
    assert [g.get("icechunk_snapshot") for g in generations] == [repository["first"], repository["second"]]
    assert load_schema(str(output)).sources["icechunk_snapshot"] == repository["second"]
    whole = _build(tmp_path, _config(repository["path"], tmp_path / "whole"))
    assert load_schema(str(whole)).sources["icechunk_snapshot"] == repository["second"]
    assert load_schema(str(output)).sample["num_samples"] == load_schema(str(whole)).sample["num_samples"]


@pytest.mark.parametrize(
    ("version", "expected"),
    [
        ({"snapshot": "ABCDEFGHJKMNPQRSTVWX"}, "Icechunk snapshot 'ABCDEFGHJKMNPQRSTVWX' is not in the repository"),
        ({"snapshot": "bad"}, "Icechunk snapshot 'bad' is not in the repository (invalid snapshot id"),
        (
            {"tag": "v9"},
            "Icechunk tag 'v9' is not in the repository (ref not found `v9`); set input.icechunk.tag to "
            "one that is (tags: v1)",
        ),
        ({"branch": "dev"}, "set input.icechunk.branch to one that is (branches: main)"),
    ],
)
def test_a_version_the_repository_lacks_is_refused_in_one_line(repository, tmp_path, capsys, version, expected):
    line = refused(_config(repository["path"], tmp_path / "out", version), tmp_path, capsys)
    assert f"{repository['path']}: " in line and expected in line


def test_icechunk_on_a_path_that_is_no_repository_is_refused(repository, tmp_path, capsys):
    line = refused(_config(repository["netcdf"][0], tmp_path / "out", {"tag": "v1"}), tmp_path, capsys)
    assert "input.icechunk: " in line and "is not an Icechunk repository" in line


def test_a_repository_on_object_storage_is_refused_in_one_line_saying_what_to_do(repository, gcs, tmp_path, capsys):
    """Icechunk reads object storage through its own client (not fsspec's): local repositories only, said so."""
    from conftest import BUCKET

    gcs.put(str(repository["path"]), f"{BUCKET}/icechunk/repo", recursive=True)
    url = f"gs://{BUCKET}/icechunk/repo"
    line = refused(_config(url, tmp_path / "out"), tmp_path, capsys)
    assert line.startswith(f"error: {url}: an Icechunk repository on object storage is not read yet"), line
    assert "copy it to a local path" in line
