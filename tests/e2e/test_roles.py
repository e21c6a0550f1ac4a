"""sample.roles: inputs, targets and forcings with their own steps and crops, on a CMIP-layout archive.

The archive is the one test_cmip_layout makes from the real CCSM file (tas, uas, vas in their own
files). Every role's feature is compared with the xarray slice of its variable at the role's steps
and crop, found from the record's index/* features and the config alone.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from schemas import load_schema

from helpers import build_quietly, import_generated_parser, read_all_records, refused

TREFHT = "TREFHT.B06.57.atm.1890-1999ANN.nc"
ROLES = {
    "inputs": {"variables": ["tas", "uas"], "offsets": {"time": [-1, 0]}},
    "targets": {"variables": ["tas"], "offsets": {"time": [1]}, "crop": {"lat": 8, "lon": 8}},
    "forcings": {"variables": ["vas"], "offsets": {"time": [1]}},
}


@pytest.fixture(scope="module")
def cmip(sample_file, tmp_path_factory):
    from test_cmip_layout import write_cmip_archive

    directory = tmp_path_factory.mktemp("cmip-roles")
    merged = write_cmip_archive(sample_file(TREFHT), directory, members=("r1i1p1f1",))
    return directory, merged["r1i1p1f1"]


def _config(directory: Path, output: Path, **sample) -> dict:
    return {
        "input": {"paths": str(directory / "*.nc")},
        "sample": {"window": {"lat": 16, "lon": 16}, "roles": ROLES, **sample},
        "splits": {"train": {"time": ["1890", "1979"]}, "test": {"time": ["1980", "1999"]}},
        "output": {"path": str(output)},
    }


def _expected(reference, role: dict, name: str, record: dict) -> np.ndarray:
    """The role's variable at its steps and crop, from the record's index/* features (16 x 16 windows)."""
    steps = int(record["index/time"]) + np.array(role.get("offsets", {}).get("time", [0]))
    lat, lon = int(record["index/lat"]), int(record["index/lon"])
    crop = role.get("crop", {})
    lat0, lon0 = lat + (16 - crop.get("lat", 16)) // 2, lon + (16 - crop.get("lon", 16)) // 2
    box = reference[name].isel(
        time=steps, lat=slice(lat0, lat0 + crop.get("lat", 16)), lon=slice(lon0, lon0 + crop.get("lon", 16))
    )
    return box.values.astype(np.float32)


def test_roles_take_their_own_steps_and_crops(cmip, tmp_path):
    directory, reference = cmip
    output = build_quietly(_config(directory, tmp_path / "out", time_features=["year_progress"]), tmp_path)
    schema = load_schema(str(output))
    shapes = {f.name: f.shape for f in schema.variable_features}
    assert shapes == {
        "inputs/tas": (2, 16, 16),
        "inputs/uas": (2, 16, 16),
        "targets/tas": (1, 8, 8),
        "forcings/vas": (1, 16, 16),
    }
    assert schema.sample["roles"]["targets"]["crop"] == {"lat": 8, "lon": 8}
    # Steps -1 to 1 of every sample must exist: 110 - 2 positions; those whose three steps straddle 1979/1980 drop.
    assert schema.num_examples("train") == (90 - 2) * 32 and schema.num_examples("test") == (20 - 2) * 32
    for split in ("train", "test"):
        records = read_all_records(output, schema, split)
        for i in range(0, len(records["index/time"]), 7):
            record = {name: values[i] for name, values in records.items()}
            for role_name, role in ROLES.items():
                for name in role["variables"]:
                    expected = _expected(reference, role, name, record)
                    np.testing.assert_array_equal(record[f"{role_name}/{name}"], expected)
            assert record["time_features/year_progress_sin"].shape == (3,)  # one per step of the sample
    stats = json.loads((output / "stats.json").read_text())
    assert sorted(stats["variables"]) == ["tas", "uas", "vas"]  # per variable: tas in two roles has one set
    norm = stats["normalization"]
    means = [np.ravel(norm[name]["mean"]).tolist() for name in ("inputs/tas", "targets/tas")]
    assert means[0] == means[1] == [stats["variables"]["tas"]["mean"]]
    from schemas import Reader, reassemble
    from schemas.errors import UserError

    with pytest.raises(UserError, match=r"built with sample\.roles .* reassembly does not place yet"):
        reassemble(str(output), Reader(str(output), "test"), split="test")


def test_normalize_reads_roles_with_their_variables_statistics(cmip, tmp_path):
    directory, _ = cmip
    output = build_quietly(_config(directory, tmp_path / "out"), tmp_path)
    stats = json.loads((output / "stats.json").read_text())["variables"]
    parser = import_generated_parser(output)
    raw = next(parser.make_dataset("test", batch_size=64).as_numpy_iterator())
    normalized = next(parser.make_dataset("test", batch_size=64, normalize=True).as_numpy_iterator())
    for name, variable in (("targets/tas", "tas"), ("forcings/vas", "vas"), ("inputs/uas", "uas")):
        mean, std = stats[variable]["mean"], stats[variable]["std"]
        np.testing.assert_allclose(normalized[name], (raw[name] - mean) / std, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"roles": {"a": {"variables": ["tas"], "offsets": {"lat": [0, 1]}}}}, "is not input.concat_dim"),
        ({"roles": {"a": {"variables": ["tas"], "crop": {"lat": 32}}}}, "crop.lat: 32 is larger than the window"),
        ({"roles": {"a": {"variables": ["tas"], "crop": {"time": 1}}}}, "only a window can be cropped"),
        ({"roles": {"a": {"variables": ["tas"], "offsets": {"time": [1, 2]}}}}, "no role takes offset 0"),
        ({"roles": {"index": {"variables": ["tas"]}}}, "'index' cannot name a role"),
        ({"offsets": {"time": [0, 1]}}, "with roles, each role gives its own offsets"),
        ({"roles": {"a": {"variables": ["nope"]}}}, "'nope'"),
    ],
)
def test_roles_refused_in_one_line(cmip, tmp_path, capsys, change, expected):
    directory, _ = cmip
    config = _config(directory, tmp_path / "out")
    config["sample"] = {**config["sample"], **change}
    assert expected in refused(config, tmp_path, capsys)


def test_roles_name_the_variables(cmip, tmp_path, capsys):
    directory, _ = cmip
    config = _config(directory, tmp_path / "out") | {"variables": ["tas"]}
    assert "with sample.roles the roles name the variables" in refused(config, tmp_path, capsys)
    config = _config(directory, tmp_path / "out") | {"nan_policy": "fill", "fill_value": 0.0, "nan_mask": ["tas"]}
    assert "nan_mask: 'tas' is not a float variable or stack of the records" in refused(config, tmp_path, capsys)


def test_nan_masks_of_role_features_take_the_roles_steps_and_crops(tmp_path):
    """nan_policy: fill with nan_mask: mask/<role>/<variable> marks the filled points at the role's steps and crop
    (and per channel of a role's stack); normalize sets exactly those."""
    import xarray as xr

    rng = np.random.default_rng(5)
    shape = (8, 6, 6)
    values = {name: rng.normal(size=shape).astype(np.float32) + 10 for name in ("a", "b")}
    for name in values:
        values[name][rng.random(shape) < 0.15] = np.nan
    data = xr.Dataset(
        {name: (("time", "lat", "lon"), v) for name, v in values.items()},
        coords={"time": np.arange(8.0), "lat": np.arange(6.0), "lon": np.arange(6.0)},
    )
    data.to_netcdf(tmp_path / "in.nc")
    roles = {
        "inputs": {"variables": ["a", "b"], "offsets": {"time": [-1, 0]}},
        "targets": {"variables": ["a"], "offsets": {"time": [1]}, "crop": {"lat": 2, "lon": 2}},
    }
    config = {
        "input": {"paths": str(tmp_path / "in.nc"), "decode_times": False},
        "sample": {"window": {"lat": 4, "lon": 4}, "roles": roles},
        "layout": {"stack": {"name": "ab", "variables": ["a", "b"]}},
        "nan_policy": "fill",
        "fill_value": -99.0,
        "nan_mask": True,
        "output": {"path": str(tmp_path / "out")},
    }
    output = build_quietly(config, tmp_path)
    records = read_all_records(output, load_schema(str(output)))
    assert records["mask/inputs/ab"].shape[1:] == (2, 4, 4, 2) and records["mask/targets/a"].shape[1:] == (1, 2, 2)
    # verify (and every reader) compares a role's shape with its steps and crop, a mask's with its feature's
    from schemas.verify import verify_output

    verify_output(str(output))
    for i in range(len(records["index/time"])):
        t, y, x = (int(records[f"index/{d}"][i]) for d in ("time", "lat", "lon"))
        for c, name in enumerate("ab"):
            window = values[name][t - 1 : t + 1, y : y + 4, x : x + 4]
            np.testing.assert_array_equal(records["mask/inputs/ab"][i][..., c], np.isnan(window))
        np.testing.assert_array_equal(
            records["mask/targets/a"][i], np.isnan(values["a"][t + 1 : t + 2, y + 1 : y + 3, x + 1 : x + 3])
        )
    assert records["mask/targets/a"].any() and records["mask/inputs/ab"].any()
    from schemas import Reader

    normalized = Reader(str(output), "data", normalize=True, normalized_fill=7.0).read_all()
    for name in ("inputs/ab", "targets/a"):
        np.testing.assert_array_equal(normalized[name] == 7.0, records[f"mask/{name}"] != 0)


def test_layout_stack_stacks_within_each_role_holding_its_variables(cmip, tmp_path):
    directory, reference = cmip
    stack = {"name": "fields", "variables": ["uas", "tas"], "axis": 0}
    output = build_quietly(_config(directory, tmp_path / "out") | {"layout": {"stack": stack}}, tmp_path)
    schema = load_schema(str(output))
    # inputs holds both: one feature, channels first; targets holds tas alone: it stays apart.
    assert {f.name: f.shape for f in schema.variable_features} == {
        "inputs/fields": (2, 2, 16, 16),
        "targets/tas": (1, 8, 8),
        "forcings/vas": (1, 16, 16),
    }
    assert schema.feature("inputs/fields").dims == ("channel", "time", "lat", "lon")
    records = read_all_records(output, schema, "test")
    for i in range(0, len(records["index/time"]), 11):
        record = {name: values[i] for name, values in records.items()}
        for channel, name in enumerate(stack["variables"]):
            expected = _expected(reference, ROLES["inputs"], name, record)
            np.testing.assert_array_equal(record["inputs/fields"][channel], expected)
        np.testing.assert_array_equal(record["targets/tas"], _expected(reference, ROLES["targets"], "tas", record))
    # normalize: each channel with its variable's statistics, in the Reader and TensorFlow's parser alike.
    from schemas import Reader

    stats = json.loads((output / "stats.json").read_text())["variables"]
    normalized = Reader(str(output), "test", normalize=True).read_all()["inputs/fields"]
    for channel, name in enumerate(stack["variables"]):
        want = (records["inputs/fields"][:, channel] - np.float32(stats[name]["mean"])) / np.float32(stats[name]["std"])
        np.testing.assert_allclose(normalized[:, channel], want, rtol=1e-5, atol=1e-5)
    parser = import_generated_parser(output)
    batch = next(parser.make_dataset("test", batch_size=64, normalize=True).as_numpy_iterator())
    np.testing.assert_allclose(batch["inputs/fields"], normalized[:64], rtol=1e-5, atol=1e-5)
