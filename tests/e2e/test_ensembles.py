"""input.new_dim: an ensemble stored one file (or run of files) per member, joined along a dim read from the names.

The members are made from the real CCSM file TREFHT.B06.57 (member 57 as it is, the others
perturbed so that no two are alike), each split in two along time, one half NETCDF3 and one
NETCDF4. Every record is compared with the xarray slice its index/* features name on the
members concatenated by xarray; statistics with numpy over the split's members.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

from schemas import load_schema

from helpers import assert_matches_source, build_quietly, expected_feature, read_all_records, refused

TREFHT = "TREFHT.B06.57.atm.1890-1999ANN.nc"
MEMBERS = (57, 59, 60, 63)
PATTERN = r"TREFHT\.B06\.(\d+)\."
#: the file name's middle part: years covered by each member's two files
HALVES = (("1890-1944", slice(0, 55)), ("1945-1999", slice(55, 110)))


def _member(source: xr.Dataset, member: int) -> xr.Dataset:
    """Member 57 is the real file; the others are it warmed and rolled, so no two members are alike."""
    if member == MEMBERS[0]:
        return source
    shifted = source.copy()
    shifted["TREFHT"] = (source["TREFHT"] + np.float32(member - 57) / 4).roll(lon=member, roll_coords=False)
    return shifted


def write_ensemble(source_path: Path, directory: Path, members=MEMBERS, halves=HALVES) -> xr.Dataset:
    """Each member as two files along time; returns the members concatenated by xarray (the reference)."""
    directory.mkdir(parents=True, exist_ok=True)
    with xr.open_dataset(source_path) as ds:
        source = ds[["TREFHT"]].load()
    datasets = []
    for member in members:
        data = _member(source, member)
        datasets.append(data)
        for (years, steps), file_format in zip(halves, ("NETCDF3_64BIT", "NETCDF4")):
            data.isel(time=steps).to_netcdf(directory / f"TREFHT.B06.{member}.atm.{years}ANN.nc", format=file_format)
    return xr.concat(datasets, dim=xr.DataArray(list(members), dims="member", name="member"))


@pytest.fixture(scope="module")
def ensemble(sample_file, tmp_path_factory) -> tuple[Path, xr.Dataset]:
    directory = tmp_path_factory.mktemp("ensemble")
    return directory, write_ensemble(sample_file(TREFHT), directory)


def _config(directory: Path, output: Path, **more) -> dict:
    config = {
        "input": {"paths": str(directory / "*.nc"), "new_dim": {"name": "member", "from": PATTERN}},
        "output": {"path": str(output)},
    }
    return config | more


def _check_records(records: dict, schema, reference: xr.Dataset) -> None:
    for i in range(len(records["TREFHT"])):
        record = {name: values[i] for name, values in records.items()}
        np.testing.assert_array_equal(record["TREFHT"], expected_feature(reference, schema, "TREFHT", record))


def test_members_split_into_train_and_test_by_member(ensemble, tmp_path):
    directory, reference = ensemble
    config = _config(
        directory,
        tmp_path / "out",
        sample={"window": {"lat": 32, "lon": 64}},
        splits={"train": {"member": [57, 60]}, "test": {"member": [63, 63]}},
    )
    output = build_quietly(config, tmp_path)
    schema = load_schema(str(output))
    assert schema.sample["grid_dims"] == ["member", "time", "lat", "lon"]
    assert schema.sample["new_dim"] == {"name": "member", "from": PATTERN, "values": list(MEMBERS)}
    assert schema.sample["splits"]["test"] == {"first": 63, "last": 63, "index_range": [3, 4]}
    per_member = 110 * 2 * 2
    assert (schema.num_examples("train"), schema.num_examples("test")) == (3 * per_member, per_member)
    stats = json.loads((output / "stats.json").read_text())
    for split, members in (("train", [57, 59, 60]), ("test", [63])):
        records = read_all_records(output, schema, split)
        assert sorted(set(records["coord/member"].tolist())) == members
        np.testing.assert_array_equal(records["coord/member"], np.array(MEMBERS)[records["index/member"]])
        _check_records(records, schema, reference)
        values = reference["TREFHT"].sel(member=members).values.astype(np.float64)
        assert stats["splits"][split]["variables"]["TREFHT"]["mean"] == pytest.approx(values.mean(), rel=1e-9)
    assert_matches_source(output, 300)


def test_members_kept_whole_with_statistics_per_member_and_a_selection(ensemble, tmp_path):
    directory, reference = ensemble
    config = _config(
        directory,
        tmp_path / "out",
        select={"member": [57, 63]},
        sample={"keep": ["member"], "window": {"lat": 64, "lon": 128}},
        splits={"train": {"time": ["1890", "1979"]}, "test": {"time": ["1980", "1999"]}},
        stats={"per": ["member"]},
    )
    output = build_quietly(config, tmp_path)
    schema = load_schema(str(output))
    feature = schema.feature("TREFHT")
    assert (feature.shape, feature.dims) == ((2, 64, 128), ("member", "lat", "lon"))
    assert schema.coords["member"] == [57, 63]
    selected = reference.sel(member=[57, 63])
    records = read_all_records(output, schema, "train")
    assert len(records["TREFHT"]) == 90
    _check_records(records, schema, selected)
    stats = json.loads((output / "stats.json").read_text())
    means = stats["variables"]["TREFHT"]["mean"]
    train = selected["TREFHT"].sel(time=slice("1890", "1979")).values.astype(np.float64)
    assert means == pytest.approx(train.mean(axis=(1, 2, 3)).tolist(), rel=1e-9)
    assert_matches_source(output)


def test_windows_along_members_never_straddle_a_split(ensemble, tmp_path):
    directory, reference = ensemble
    config = _config(
        directory,
        tmp_path / "out",
        sample={"window": {"member": {"size": 2, "stride": 1}, "lat": 64, "lon": 128}},
        splits={"train": {"member": [57, 59]}, "test": {"member": [60, 63]}},
    )
    output = build_quietly(config, tmp_path)
    schema = load_schema(str(output))
    # Windows 57-59, 59-60 and 60-63: the middle one would join a train and a test member.
    assert schema.counts["samples_outside_splits"] == 110
    for split, first in (("train", 57), ("test", 60)):
        records = read_all_records(output, schema, split)
        assert len(records["TREFHT"]) == 110
        assert set(records["coord/member"][:, 0].tolist()) == {first}
        _check_records(records, schema, reference)


def test_bad_ensembles_are_refused_in_one_line(ensemble, sample_file, tmp_path, capsys):
    directory, _ = ensemble
    out = tmp_path / "out"
    # Without input.new_dim: the members overlap in time, and the message names the key.
    plain = _config(directory, out)
    del plain["input"]["new_dim"]
    assert "join them along a new dim with input.new_dim" in refused(plain, tmp_path, capsys)
    # A new dim named as a dim of the files.
    lat = _config(directory, out)
    lat["input"]["new_dim"]["name"] = "lat"
    assert "input.new_dim.name: 'lat' is already a dim of " in refused(lat, tmp_path, capsys)
    # A pattern that reads every file as one member: the overlap names the pattern, not new_dim (which is set).
    one = _config(directory, out)
    one["input"]["new_dim"]["from"] = r"(TREFHT)\."
    message = refused(one, tmp_path, capsys)
    assert "overlaps" in message and "both read as member 'TREFHT' by input.new_dim.from" in message, message
    assert "make its group capture the part of the names that tells members apart" in message, message
    # Splits along the members when every sample holds them all.
    kept = _config(directory, out, sample={"keep": ["member"]}, splits={"train": {"member": [57, 59]}})
    assert "splits: 'member' is kept whole in every sample" in refused(kept, tmp_path, capsys)
    # A Zarr store holds its dims itself.
    store = tmp_path / "members.zarr"
    xr.open_dataset(directory / "TREFHT.B06.57.atm.1890-1944ANN.nc").to_zarr(store, consolidated=False)
    zarr = _config(store.parent, out)
    zarr["input"]["paths"] = str(store)
    message = refused(zarr, tmp_path, capsys)
    assert "input.new_dim: joins files by their names, but the input is one Zarr store" in message

    broken = tmp_path / "broken"
    write_ensemble(sample_file(TREFHT), broken, members=(57, 59))
    # A member short of a file: its steps differ from the first member's.
    (broken / "TREFHT.B06.59.atm.1945-1999ANN.nc").unlink()
    message = refused(_config(broken, out), tmp_path, capsys)
    assert "member 59 (" in message and "TREFHT.B06.59.atm.1890-1944ANN.nc" in message, message
    assert "55 steps" in message and "every member needs the same time steps" in message, message
    # Two spellings of one member number.
    write_ensemble(sample_file(TREFHT), broken, members=(57, 59), halves=HALVES[1:])
    (broken / "TREFHT.B06.59.atm.1890-1944ANN.nc").rename(broken / "TREFHT.B06.059.atm.1890-1944ANN.nc")
    message = refused(_config(broken, out), tmp_path, capsys)
    assert "both read as member 59 ('059', '59')" in message or "both read as member 59 ('59', '059')" in message
    # A file the pattern does not match.
    (broken / "TREFHT.B06.059.atm.1890-1944ANN.nc").rename(broken / "TREFHT.control.nc")
    message = refused(_config(broken, out), tmp_path, capsys)
    assert "TREFHT.control.nc: its name does not match input.new_dim.from" in message, message
