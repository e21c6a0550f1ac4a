"""``inspect --verify --source N``: random records re-read from the inputs with plain xarray, compared bit for bit."""

from __future__ import annotations

import shutil
from pathlib import Path

import netCDF4
import numpy as np
import pytest

from pipelines.source_check import chosen_samples
from schemas import VerifyError, load_schema, verify_output

from helpers import assert_matches_source, build_quietly, source_check, tamper_record


@pytest.fixture(scope="module")
def archive(tmp_path_factory) -> Path:
    """Three files along time, and invariants.nc (static fields)."""
    from pipelines.demo import ArchiveShape, write_archive

    directory = tmp_path_factory.mktemp("source_archive")
    write_archive(directory, ArchiveShape(num_files=3, steps_per_file=3, levels=2, lat=10, lon=12), 3, True)
    return directory


def _config(archive: Path, output: Path, **more) -> dict:
    return {
        "input": {"paths": str(archive / "*.nc")},
        "variables": ["t", "u", "orography"],
        "sample": {"window": {"lat": 5, "lon": {"size": 4, "stride": 2}}, "keep": ["level"]},
        "output": {"path": str(output), "num_shards": 2},
    } | more


@pytest.fixture(scope="module")
def patches(archive, tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("source_patches")
    return build_quietly(_config(archive, tmp / "out"), tmp)


def test_every_record_equals_its_source(patches):
    report = assert_matches_source(patches)
    total = load_schema(str(patches)).num_examples()
    assert f"{total} random sample(s) (seed 0) equal their source bit for bit, every one of 9 features" in report
    lines = verify_output(str(patches), source_samples=5, seed=1).summary().splitlines()  # the Python API
    assert lines[0].startswith("OK: ") and lines[1].startswith(f"OK: {patches}: 5 random sample(s) (seed 1) equal")


def test_a_record_altered_with_valid_checksums_is_named(patches, tmp_path):
    """The record's CRCs and size are right, so --verify alone passes: only the source tells the value is wrong."""
    output = Path(shutil.copytree(patches, tmp_path / "altered"))
    position, value = tamper_record(output, "u")
    assert verify_output(str(output)).records == load_schema(str(output)).num_examples()
    status, message = source_check(output)
    lines = message.strip().splitlines()
    assert status == 1 and len(lines) == 1, message
    shard = load_schema(str(output)).splits["data"][0].file
    assert lines[0].startswith(
        f"error: {output}: u of sample {position} of split 'data' ({shard}, record 0) at [level=0, lat=0, lon=0] is "
        f"{value[0]!s} in the record but "
    ), message
    assert lines[0].endswith("build it again from the inputs"), message


def test_an_index_moved_off_the_grid_is_named(patches, tmp_path):
    output = Path(shutil.copytree(patches, tmp_path / "moved"))
    position, value = tamper_record(output, "index/lat")
    status, message = source_check(output)
    assert status == 1, message
    shard = load_schema(str(output)).splits["data"][0].file
    assert message.startswith(
        f"error: {output}: index/lat of sample {position} of split 'data' ({shard}, record 0) is {value[0]}, which is "
        "no sample's start on the grid (2 positions along 'lat', window)"
    ), message


def test_a_record_in_another_splits_shards_is_named(archive, tmp_path):
    splits = {"train": {"time": [None, "2020-01-01T12"]}, "valid": {"time": ["2020-01-01T18", None]}}
    output = build_quietly(_config(archive, tmp_path / "out", splits=splits), tmp_path)
    assert_matches_source(output)
    position, value = tamper_record(output, "index/time", "train", by=6)  # a valid step's index, on the grid
    status, message = source_check(output)
    assert status == 1, message
    shard = load_schema(str(output)).splits["train"][0].file
    assert message.startswith(
        f"error: {output}: sample {position} of split 'train' ({shard}, record 0) covers time steps {value[0]} to "
        f"{value[0]} of the sample grid, but split 'train' holds steps 0 to 2: the record is in another split's"
    ), message
    status, report = source_check(output, 10_000, "--split", "valid")  # --split: that split's samples alone
    assert status == 0 and "equal their source bit for bit" in report, report


def test_inputs_changed_since_the_build_are_found(archive, tmp_path):
    inputs = Path(shutil.copytree(archive, tmp_path / "inputs"))
    output = build_quietly(_config(inputs, tmp_path / "out"), tmp_path)
    first = sorted(inputs.glob("era5_*.nc"))[0]
    with netCDF4.Dataset(first, "a") as dataset:
        dataset["t"][0, 1, 2, 3] = 0.0  # time 0, level 1, lat 2, lon 3: in every sample covering it
    status, message = source_check(output)
    assert status == 1 and "t of sample" in message and "but 0.0 in the source" in message, message
    first.unlink()
    status, message = source_check(output)
    assert status == 1, message
    assert f"error: {first}: an input schema.json lists, but input.paths no longer finds it" in message, message


def test_relative_input_paths_are_found_from_another_folder(archive, tmp_path, monkeypatch):
    """input.paths relative to where the build ran: the check finds them from anywhere (the files schema.json lists)."""
    shutil.copytree(archive, tmp_path / "run" / "data")
    monkeypatch.chdir(tmp_path / "run")
    output = build_quietly(_config(Path("data"), tmp_path / "out"), tmp_path)
    assert load_schema(str(output)).config["input"]["paths"] == ["data/*.nc"]
    monkeypatch.chdir(tmp_path)
    assert_matches_source(output, 20)


def test_packed_records_nan_filled_and_masked_with_a_time_selection(tmp_path):
    """NaN in the source: filled in the records and marked by mask/*; several samples a record; gzip."""
    import xarray as xr

    rng = np.random.default_rng(2)
    values = rng.normal(280, 5, size=(6, 5, 7)).astype(np.float32)
    values[rng.random(values.shape) < 0.2] = np.nan
    times = np.arange("2021-01-01", 6, dtype="datetime64[D]").astype("datetime64[ns]")
    data = xr.Dataset({"t": (("time", "lat", "lon"), values)}, {"time": times, "lat": np.arange(5.0)})
    data.to_netcdf(tmp_path / "in.nc")
    config = {
        "input": {"paths": str(tmp_path / "in.nc")},
        "select": {"time": {"min": "2021-01-02"}},
        "sample": {"window": {"lat": 3, "lon": 2}},
        "nan_policy": "fill",
        "fill_value": -1.0,
        "nan_mask": True,
        "output": {"path": str(tmp_path / "out"), "examples_per_record": 4, "compression": "gzip"},
    }
    output = build_quietly(config, tmp_path)
    assert_matches_source(output)


def test_the_same_seed_draws_the_same_samples():
    counts = {"train": 50, "valid": 10}
    first = chosen_samples(counts, 7, seed=3)
    assert first == chosen_samples(counts, 7, seed=3) and first != chosen_samples(counts, 7, seed=4)
    assert sum(map(len, first.values())) == 7 and all(sorted(set(v)) == v for v in first.values())
    assert all(0 <= i < counts[name] for name, picks in first.items() for i in picks)
    assert chosen_samples(counts, 1000, seed=0) == {"train": list(range(50)), "valid": list(range(10))}


def test_without_the_build_install_verify_says_what_it_needs(patches, monkeypatch):
    from schemas import verify

    monkeypatch.setattr(verify, "SOURCE_CHECK", "a_module_that_is_not_installed")
    with pytest.raises(VerifyError, match=r"checking against the source needs the build's install"):
        verify_output(str(patches), source_samples=3)


def test_source_needs_verify_and_a_count(patches, capsys):
    from pipelines.inspect import main

    for argv, expected in ((["--source", "3"], "add --verify"), (["--verify", "--source", "0"], "at least 1")):
        with pytest.raises(SystemExit) as exit_:
            main([str(patches), *argv])
        assert exit_.value.code == 2 and expected in capsys.readouterr().err
