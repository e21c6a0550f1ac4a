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

from helpers import assert_matches_source, build_quietly, import_generated_parser, read_all_records, refused

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
    assert_matches_source(output, 200)  # roles' steps and crops, and their time features
    from schemas import Reader, reassemble
    from schemas.errors import UserError

    # The records read back as predictions: inputs/tas and targets/tas would share tas's cells on the grid.
    with pytest.raises(UserError, match=r"'inputs/tas' and 'targets/tas' both hold 'tas' on the grid") as error:
        reassemble(str(output), Reader(str(output), "test"), split="test")
    assert "\n" not in str(error.value)


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
    assert_matches_source(output)  # fills and masks, of a role's stack too
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
    assert_matches_source(output, 200)
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
    # Reassembled, the stack's channels come back as their variables at the role's steps, with targets/tas's tas.
    from schemas import reassemble
    from schemas.errors import UserError

    ds = reassemble(str(output), split="test")
    assert set(ds.data_vars) == {"tas", "uas", "vas", "coverage"}
    for name in ("tas", "uas", "vas"):
        got = ds[name].transpose("time", "lat", "lon")
        held = ~np.isnan(got.values)
        want = reference[name].sel(time=got["time"].values).values.astype(np.float32)
        assert held.any() and np.array_equal(got.values[held], want[held]), name
    # A prediction holding the stack (its tas channel among the inputs) beside targets/tas: refused on the grid.
    with pytest.raises(
        UserError,
        match=r"('inputs/fields' and 'targets/tas'|'targets/tas' and 'inputs/fields') both hold 'tas' on the grid",
    ):
        reassemble(str(output), Reader(str(output), "test"), split="test")


# ---- reassembly: a forecaster's predictions back at their valid times ---------------------------------------------


@pytest.fixture(scope="module")
def roles_output(cmip, tmp_path_factory) -> Path:
    directory, _ = cmip
    tmp = tmp_path_factory.mktemp("roles-reassembly")
    return build_quietly(_config(directory, tmp / "out", time_features=["year_progress"]), tmp)


def _forecaster(output: Path, split: str = "test", keep_inputs: bool = False):
    """A model that predicts targets/tas (tas one step after the sample's index, over the centred 8 x 8) as the
    truth + 1, with the records' index features (and, ``keep_inputs``, the inputs/tas it was given)."""
    from schemas import Reader

    for batch in Reader(str(output), split).iter_batches(50):
        keys = {k: v for k, v in batch.items() if k.startswith("index/")}
        given = {"inputs/tas": batch["inputs/tas"]} if keep_inputs else {}
        yield {**keys, **given, "targets/tas": batch["targets/tas"] + np.float32(1)}


def _target_cells(output: Path, reference, init_times) -> np.ndarray:
    """(init_time, lat, lon): where the test split's samples put a target, from their keys and the config alone."""
    from schemas import Reader

    records = Reader(str(output), "test").read_all()
    row = {t: i for i, t in enumerate(init_times)}
    where = np.zeros((len(init_times), *reference["tas"].shape[1:]), bool)
    for t, y, x in zip(records["index/time"], records["index/lat"], records["index/lon"]):
        where[row[reference["time"].values[t]], y + 4 : y + 12, x + 4 : x + 12] = True
    return where


def test_a_forecasters_targets_come_back_at_their_valid_times(roles_output, cmip):
    """layout="forecast": tas over (init_time, lead_time); the predicted targets at lead +1 step, over their crop,
    equal (exactly) xarray's tas of the source at valid_time = init_time + lead_time, + 1; the inputs' leads NaN."""
    from schemas import reassemble

    _, reference = cmip
    ds = reassemble(str(roles_output), _forecaster(roles_output), split="test", layout="forecast")
    assert ds["tas"].dims == ("init_time", "lead_time", "lat", "lon") and set(ds.data_vars) == {"tas", "coverage"}
    times = reference["time"].values
    assert list(ds["lead_time"].values) == [times[0] - times[1], times[0] - times[0], times[1] - times[0]]
    lead = ds.isel(lead_time=2)
    where = _target_cells(roles_output, reference, ds["init_time"].values)
    assert where.sum() == 18 * 32 * 64  # each test sample's 8 x 8 (windows do not overlap)
    np.testing.assert_array_equal(~np.isnan(lead["tas"].values), where)
    rows = where.any(axis=(1, 2))
    truth = reference["tas"].sel(time=lead["valid_time"].values[rows]).values.astype(np.float32) + np.float32(1)
    np.testing.assert_array_equal(lead["tas"].values[rows][where[rows]], truth[where[rows]])
    assert np.isnan(ds["tas"].isel(lead_time=slice(0, 2)).values).all()  # the inputs' leads: none predicted


def test_the_records_of_a_roles_output_come_back_as_the_source(roles_output, cmip):
    """Each role's features at their own steps and crops: on the grid, and in the forecast layout at every lead,
    the source's values at the valid times (exactly, where a role held them)."""
    from schemas import reassemble

    _, reference = cmip
    grid = reassemble(str(roles_output), split="test")
    assert set(grid.data_vars) == {"tas", "uas", "vas", "coverage"}
    for name in ("tas", "uas", "vas"):
        got = grid[name].transpose("time", "lat", "lon")
        want = reference[name].sel(time=got["time"].values).values.astype(np.float32)
        held = ~np.isnan(got.values)
        assert held.any() and np.array_equal(got.values[held], want[held]), name
    # uas is an input at t - 1 and t, vas a forcing at t + 1: vas starts two steps after uas.
    first = {name: int(np.flatnonzero(~np.isnan(grid[name]).all(["lat", "lon"]))[0]) for name in ("uas", "vas")}
    assert first["vas"] == first["uas"] + 2
    forecast = reassemble(str(roles_output), split="test", layout="forecast")
    for name in ("tas", "uas", "vas"):
        for lead in range(3):
            got = forecast[name].isel(lead_time=lead)
            rows = ~np.isnan(got.values).all(axis=(1, 2))  # the inits a role holds this lead of
            want = reference[name].sel(time=got["valid_time"].values[rows]).values.astype(np.float32)
            held = ~np.isnan(got.values[rows])
            assert np.array_equal(got.values[rows][held], want[held]), (name, lead)
    assert np.isnan(forecast["vas"].isel(lead_time=0)).all()  # (a forcing at +1 step only)


def test_a_prediction_with_the_inputs_it_was_given_is_refused_on_the_grid_only(roles_output, cmip):
    from schemas import reassemble
    from schemas.errors import UserError

    _, reference = cmip
    with pytest.raises(UserError, match=r"'inputs/tas' and 'targets/tas' both hold 'tas' on the grid, where their"):
        reassemble(str(roles_output), _forecaster(roles_output, keep_inputs=True), split="test")
    ds = reassemble(str(roles_output), _forecaster(roles_output, keep_inputs=True), split="test", layout="forecast")
    lead = ds["tas"].isel(lead_time=1)  # the inputs' offset 0: the values the model was given, as they were
    held = ~np.isnan(lead.values)
    want = reference["tas"].sel(time=ds["init_time"].values).values.astype(np.float32)
    assert held.sum() > 0 and np.array_equal(lead.values[held], want[held])


def test_the_command_line_writes_a_forecasters_predictions_as_the_library_does(roles_output, tmp_path, capsys):
    from pipelines.reassemble import main
    from schemas import reassemble

    predictions = tmp_path / "predictions"
    predictions.mkdir()
    for i, batch in enumerate(_forecaster(roles_output)):
        np.savez(predictions / f"{i}.npz", **batch)
    to = tmp_path / "forecast.zarr"
    args = [str(roles_output), "--split", "test", "--layout", "forecast", "--predictions", str(predictions)]
    assert main([*args, "--to", str(to), "--chunk_mb", "0.2", "--quiet"]) == 0, capsys.readouterr().err
    import xarray as xr

    written = xr.open_zarr(to).load()
    want = reassemble(str(roles_output), _forecaster(roles_output), split="test", layout="forecast")
    assert written["tas"].encoding["chunks"][0] < written.sizes["init_time"]  # several chunks, several tasks
    for name in ("tas", "coverage", "valid_time"):
        np.testing.assert_array_equal(written[name].values, want[name].values, err_msg=name)


@pytest.mark.parametrize("layout", ["grid", "forecast"])
def test_the_command_line_puts_the_records_roles_back_as_the_library_does(roles_output, tmp_path, layout, capsys):
    """Without --predictions: every role's features of a variable (inputs/tas, targets/tas) placed as one variable,
    finished once (it was placed again after it was finished); the time features, which the coordinates give,
    are not placed (their names were folders in the store)."""
    import xarray as xr

    from pipelines.reassemble import main
    from schemas import reassemble

    to = tmp_path / "records.zarr"
    args = [str(roles_output), "--split", "test", "--layout", layout, "--to", str(to), "--chunk_mb", "0.2", "--quiet"]
    assert main(args) == 0, capsys.readouterr().err
    written = xr.open_zarr(to).load()
    want = reassemble(str(roles_output), split="test", layout=layout)
    assert set(written.data_vars) == set(want.data_vars) == {"tas", "uas", "vas", "coverage"}
    for name in ("tas", "uas", "vas", "coverage"):
        np.testing.assert_array_equal(written[name].values, want[name].values, err_msg=name)
