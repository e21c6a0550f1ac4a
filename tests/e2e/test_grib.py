"""GRIB input end to end: GRIB 2 files along analysis time and GRIB 1 files along forecast step build records equal
to their slices as cfgrib and xarray read them; a file of several hypercubes, or of none matching, is refused."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import xarray as xr
import yaml
from grib_like import FIELDS, cfgrib_dataset, grib_along_step, grib_along_time, write_grib

from pipelines.build import main
from schemas import load_schema

from helpers import expected_feature, read_all_records, refused

pytest.importorskip("cfgrib")

PRESSURE = {"typeOfLevel": "isobaricInhPa"}


def _config(paths, output: Path, concat_dim: str, variables, sample: dict, grib: dict | None = None) -> dict:
    config = {
        "input": {"paths": [str(p) for p in paths], "concat_dim": concat_dim},
        "variables": variables,
        "sample": sample,
        "output": {"path": str(output), "num_shards": 2},
    }
    if grib is not None:
        config["input"]["grib"] = grib
    return config


def _build(tmp_path: Path, config: dict) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    assert main(["--config", str(path), "--quiet"]) == 0
    return Path(config["output"]["path"])


def _assert_records_are_slices(output: Path, source: xr.Dataset) -> int:
    schema = load_schema(str(output))
    records = read_all_records(output, schema)
    count = len(next(iter(records.values())))
    assert count == schema.num_records() > 0
    for i in range(count):
        record = {name: values[i] for name, values in records.items()}
        for feature in schema.variable_features:
            np.testing.assert_array_equal(record[feature.name], expected_feature(source, schema, feature.name, record))
    return count


@pytest.fixture(scope="module")
def along_time(tmp_path_factory) -> list[Path]:
    return grib_along_time(tmp_path_factory.mktemp("grib2"), edition=2)


def test_grib2_files_along_time_give_their_cfgrib_slices(along_time, tmp_path):
    sample = {"window": {"latitude": 3, "longitude": 4}, "keep": ["step", "isobaricInhPa"]}
    config = _config(along_time, tmp_path / "out", "time", ["t", "z"], sample, {"filter_by_keys": PRESSURE})
    output = _build(tmp_path, config)
    source = cfgrib_dataset(along_time, "time", PRESSURE)
    assert _assert_records_are_slices(output, source) == 6 * 2 * 3  # 6 analyses of 2 x 3 patches
    # The user's directory is left as it was: no .idx file beside the GRIB files.
    assert sorted(p.name for p in along_time[0].parent.iterdir()) == sorted(p.name for p in along_time)


def test_grib1_files_along_step_give_their_cfgrib_slices(tmp_path):
    paths = grib_along_step(tmp_path / "grib1", edition=1)
    surface = {"typeOfLevel": "surface"}
    config = _config(paths, tmp_path / "out", "step", ["sp"], {"window": {"step": 2}}, {"filter_by_keys": surface})
    output = _build(tmp_path, config)
    # Windows of 2 steps (at steps 0 and 2, each across two files) at every grid point.
    assert _assert_records_are_slices(output, cfgrib_dataset(paths, "step", surface)) == 2 * 7 * 12


def test_grib_named_files_need_no_grib_section(tmp_path):
    """Files that hold one hypercube are read whole, as cfgrib reads them, with no input.grib."""
    paths = grib_along_step(tmp_path / "grib1", fields=[FIELDS[-1]], steps=2)
    output = _build(tmp_path, _config(paths, tmp_path / "out", "step", ["sp"], {}))
    assert _assert_records_are_slices(output, cfgrib_dataset(paths, "step", {})) == 2 * 7 * 12


def test_several_hypercubes_are_refused_in_one_line_naming_them(tmp_path, capsys):
    """t on pressure levels and on model levels: cfgrib cannot make one dataset; the refusal lists what is there."""
    path = write_grib(tmp_path / "mixed.grib2", 2, [(20200101, 0)], [0], [*FIELDS, ("t", "hybrid", (1, 2))])
    line = refused(_config([path], tmp_path / "out", "time", ["t"], {}), tmp_path, capsys)
    assert str(path) in line and "several hypercubes" in line
    assert "typeOfLevel=isobaricInhPa: t z" in line and "typeOfLevel=hybrid: t" in line
    assert "input.grib.filter_by_keys" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.yaml", "mixed.grib2"]  # no index file left


def test_a_filter_no_message_matches_is_refused_in_one_line(along_time, tmp_path, capsys):
    config = _config(along_time, tmp_path / "out", "time", ["t"], {}, {"filter_by_keys": {"typeOfLevel": "hybrid"}})
    line = refused(config, tmp_path, capsys)
    assert f"{along_time[0]}: no message matches input.grib.filter_by_keys {{'typeOfLevel': 'hybrid'}}" in line
    assert "typeOfLevel=isobaricInhPa: t z; typeOfLevel=surface: sp" in line


def test_a_file_that_is_not_grib_is_refused_in_one_line(along_time, tmp_path, capsys):
    bad = tmp_path / "broken.grib2"
    bad.write_bytes(b"GRIB" + b"\0" * 64)
    line = refused(_config([bad], tmp_path / "out", "time", ["t"], {}), tmp_path, capsys)
    assert str(bad) in line and ("GRIB" in line or "message" in line)


def _shards(output) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(Path(output).glob("*.tfrecord*"))}


def test_grib_files_on_cloud_storage_give_the_shards_of_the_local_files(along_time, gcs, tmp_path):
    from conftest import BUCKET

    for path in along_time:
        gcs.put(str(path), f"{BUCKET}/grib/{path.name}")
    sample = {"window": {"latitude": 3, "longitude": 4}, "keep": ["step", "isobaricInhPa"]}
    grib = {"filter_by_keys": PRESSURE}
    local = _build(tmp_path, _config(along_time, tmp_path / "local", "time", ["t", "z"], sample, grib))
    remote = _config([f"gs://{BUCKET}/grib/*.grib2"], tmp_path / "remote", "time", ["t", "z"], sample, grib)
    assert _shards(_build(tmp_path, remote)) == _shards(local)
    assert sorted(gcs.ls(f"{BUCKET}/grib")) == sorted(f"{BUCKET}/grib/{p.name}" for p in along_time)  # no .idx


def test_an_append_of_later_grib_files_holds_the_samples_of_a_full_build(along_time, tmp_path):
    from schemas import Reader

    sample = {"window": {"latitude": 3, "longitude": 4}, "keep": ["step", "isobaricInhPa"]}
    grib = {"filter_by_keys": PRESSURE}
    output = _build(tmp_path, _config(along_time[:4], tmp_path / "out", "time", ["t"], sample, grib))
    path = tmp_path / "append.yaml"
    path.write_text(yaml.safe_dump(_config(along_time, output, "time", ["t"], sample, grib)))
    assert main(["--config", str(path), "--quiet", "--append"]) == 0
    full = _build(tmp_path, _config(along_time, tmp_path / "full", "time", ["t"], sample, grib))

    def by_sample(output) -> dict:
        records = Reader(str(output), "data").read_all()
        keys = zip(*(records[f"index/{d}"].ravel() for d in ("time", "latitude", "longitude")))
        return {key: records["t"][i] for i, key in enumerate(keys)}

    appended, expected = by_sample(output), by_sample(full)
    assert appended.keys() == expected.keys() and len(expected) == 36
    for key, values in expected.items():
        np.testing.assert_array_equal(appended[key], values)


def test_an_ensemble_s_members_are_samples_along_number(tmp_path):
    """Members along cfgrib's ``number`` dim, files along time: each member's patches are samples of their own."""
    from grib_like import write_ensemble

    paths = [write_ensemble(tmp_path / f"ens_{d}.grib2", 20200101 + d, seed=d) for d in range(3)]
    sample = {"window": {"latitude": 7, "longitude": 6}}
    output = _build(tmp_path, _config(paths, tmp_path / "out", "time", ["t2m"], sample))
    schema = load_schema(str(output))
    assert {a["dim"]: a["role"] for a in schema.sample["axes"]}["number"] == "iterate"
    # 3 analyses x 3 members x 2 patches.
    assert _assert_records_are_slices(output, cfgrib_dataset(paths, "time", {})) == 3 * 3 * 2


def test_a_reduced_gaussian_grid_gives_whole_fields_with_their_coordinates(tmp_path):
    """A 1-D ``values`` dim kept whole: a sample is a whole field, its latitude and longitude carried as coords."""
    from grib_like import write_reduced_gaussian

    paths = [write_reduced_gaussian(tmp_path / f"rgg_{d}.grib2", 20200101 + d, seed=d) for d in range(2)]
    config = _config(paths, tmp_path / "out", "time", ["t"], {"keep": ["values"]})
    config["coords"] = ["latitude", "longitude"]
    output = _build(tmp_path, config)
    source = cfgrib_dataset(paths, "time", {})
    assert _assert_records_are_slices(output, source) == 2
    records = read_all_records(output, load_schema(str(output)))
    np.testing.assert_array_equal(records["coord/latitude"][0], source.latitude.values.astype(np.float32))
    np.testing.assert_array_equal(records["coord/longitude"][1], source.longitude.values.astype(np.float32))


def test_valid_time_is_each_file_s_own(along_time, tmp_path):
    """valid_time (analysis time plus step, along step in a file) differs from file to file: each sample carries its
    own file's, not the first file's (with times as numbers: records carry no dates)."""
    sample = {"window": {"latitude": 7, "longitude": 12}, "keep": ["step"]}
    surface = {"typeOfLevel": "surface"}
    config = _config(along_time, tmp_path / "out", "time", ["sp"], sample, {"filter_by_keys": surface})
    config["coords"] = ["valid_time"]
    config["input"]["decode_times"] = False
    output = _build(tmp_path, config)
    records = read_all_records(output, load_schema(str(output)))
    source = cfgrib_dataset(along_time, "time", surface)
    valid_times = source.time.values[:, None] + source.step.values[None, :]  # (each file's analysis time + step)
    expected = (valid_times - np.datetime64("1970-01-01")) // np.timedelta64(1, "s")
    assert len(records["coord/valid_time"]) == 6
    for index, valid in zip(records["index/time"].ravel(), records["coord/valid_time"]):
        np.testing.assert_array_equal(valid.ravel(), expected[int(index)].astype(valid.dtype))


@pytest.fixture(scope="module")
def mixed(tmp_path_factory) -> list[Path]:
    """Files of three hypercubes (pressure levels, the surface, model levels), along time."""
    root = tmp_path_factory.mktemp("mixed")
    fields = [*FIELDS, ("t", "hybrid", (1, 2, 3))]
    return [write_grib(root / f"mixed_{d}.grib2", 2, [(20200101 + d, 0)], [0, 6], fields, seed=d) for d in range(2)]


def _plan(paths, filter_by_keys: dict):
    from planning.config.loading import load_config
    from planning.plan import make_plan

    data = _config(paths, Path("/nonexistent/out"), "time", ["t"], {}, {"filter_by_keys": filter_by_keys})
    return make_plan(load_config(data=data))


def test_planning_indexes_each_file_s_messages_once_and_workers_read_only_those(mixed):
    """The index holds exactly the chosen hypercube's messages (t and z on 2 pressure levels at 2 steps), whole
    GRIB messages by their bytes; a worker reading through it gives cfgrib's values."""
    from planning.reads.grib_reads import GribReader
    from planning.reads.source_index import SourceIndex

    plan = _plan(mixed, PRESSURE)
    sources = SourceIndex.from_bytes(plan.sources.to_bytes())  # as workers load it
    for source in sources:
        ranges = sources.grib_messages(source)
        assert ranges.shape == (2 * 2 * 2, 2)
        data = Path(source.path).read_bytes()
        for offset, length in ranges:
            assert data[offset : offset + 4] == b"GRIB" and data[offset + length - 4 : offset + length] == b"7777"
    (variable,) = plan.variables
    box = {"time": (0, 2), "step": (0, 2), "isobaricInhPa": (0, 2), "latitude": (0, 7), "longitude": (0, 12)}
    values = GribReader(sources, "time", plan.grib).read([variable], box).values["t"]
    np.testing.assert_array_equal(values, cfgrib_dataset(mixed, "time", PRESSURE)["t"].values)


def test_an_index_that_does_not_hold_the_file_s_messages_is_refused_on_the_worker(mixed):
    """Offsets that do not start a message (a file rewritten at the same size and times, or an index not this
    file's): refused, never decoded from the wrong bytes."""
    import dataclasses

    from planning.reads.grib_reads import GribReader
    from schemas.errors import UserError

    plan = _plan(mixed, PRESSURE)
    shifted = dataclasses.replace(plan.sources, grib_ranges=plan.sources.grib_ranges + np.array([1, 0]))
    (variable,) = plan.variables
    box = {"time": (0, 1), "step": (0, 2), "isobaricInhPa": (0, 2), "latitude": (0, 7), "longitude": (0, 12)}
    with pytest.raises(UserError, match=f"{mixed[0]}: bytes .* are not the GRIB message planning indexed there"):
        GribReader(shifted, "time", plan.grib).read([variable], box)


def test_a_saved_index_that_is_not_sane_is_dropped_and_files_are_read_whole(mixed):
    """The saved index is read from disk: first rows that do not add up to its ranges are not sought by (the files
    are then scanned whole, giving the same values)."""
    import dataclasses

    from planning.reads.source_index import SourceIndex

    plan = _plan(mixed, PRESSURE)
    bad = dataclasses.replace(plan.sources, grib_first=plan.sources.grib_first + 1)
    loaded = SourceIndex.from_bytes(bad.to_bytes())
    assert loaded.grib_ranges is None and loaded.grib_messages(loaded[0]) is None
    assert SourceIndex.from_bytes(plan.sources.to_bytes()).grib_messages(loaded[1]).shape == (8, 2)


def test_a_projected_grid_s_latitude_and_longitude_are_coordinate_features(tmp_path):
    """A polar stereographic grid (dims y, x): patches carry their cells' 2-D latitude and longitude with coords:,
    each equal to cfgrib's, as a curvilinear NetCDF grid's do."""
    from grib_like import write_polar_stereographic

    paths = [write_polar_stereographic(tmp_path / f"ps_{d}.grib2", 20200101 + d, seed=d) for d in range(2)]
    config = _config(paths, tmp_path / "out", "time", ["t"], {"window": {"y": 10, "x": 8}})
    config["coords"] = ["latitude", "longitude"]
    output = _build(tmp_path, config)
    source = cfgrib_dataset(paths, "time", {})
    assert _assert_records_are_slices(output, source) == 2 * 3 * 2
    records = read_all_records(output, load_schema(str(output)))
    for i in range(len(records["t"])):
        y, x = int(records["index/y"][i].ravel()[0]), int(records["index/x"][i].ravel()[0])
        for name in ("latitude", "longitude"):
            expected = source[name].values[y : y + 10, x : x + 8].astype(np.float32)
            np.testing.assert_array_equal(records[f"coord/{name}"][i], expected)


@pytest.mark.parametrize("level", [500, 500.0])
def test_a_numeric_key_indexes_the_messages_cfgrib_takes(mixed, tmp_path, level):
    """level: 500 or 500.0: the index keeps the messages cfgrib's filter takes, and the build gives cfgrib's values
    (an index that kept fewer would give fewer levels, or none)."""
    keys = {**PRESSURE, "level": level}
    plan = _plan(mixed, keys)
    assert plan.sources.grib_messages(plan.sources[0]).shape == (2 * 2, 2)  # t and z at 500 hPa, 2 steps
    sample = {"window": {"latitude": 7, "longitude": 12}, "keep": ["step"]}
    output = _build(tmp_path, _config(mixed, tmp_path / "out", "time", ["t", "z"], sample, {"filter_by_keys": keys}))
    assert _assert_records_are_slices(output, cfgrib_dataset(mixed, "time", {**PRESSURE, "level": 500})) == 2


def test_a_number_quoted_as_text_is_refused_with_the_reason(mixed, tmp_path, capsys):
    """cfgrib compares level "500" as text, which no message's level is: the refusal says so."""
    keys = {**PRESSURE, "level": "500"}
    line = refused(_config(mixed, tmp_path / "out", "time", ["t"], {}, {"filter_by_keys": keys}), tmp_path, capsys)
    assert "no message matches" in line and "(cfgrib compares 'level: 500' as text: write the number unquoted)" in line


def test_files_that_disagree_on_a_scalar_coordinate_or_their_variables_are_refused(tmp_path, capsys):
    """Analyses along time at different steps (step is a scalar in each file, recorded once for all), or with
    other variables: one line naming both files."""
    pressure = [FIELDS[0]]
    first = write_grib(tmp_path / "a.grib2", 2, [(20200101, 0)], [0], pressure)
    later = write_grib(tmp_path / "b.grib2", 2, [(20200102, 0)], [6], pressure)
    config = _config([first, later], tmp_path / "out", "time", ["t"], {}, {"filter_by_keys": PRESSURE})
    line = refused(config, tmp_path, capsys)
    assert f"{later}: coordinate 'step' is" in line and f"in {first}; files joined along 'time' must agree" in line
    other = write_grib(tmp_path / "c.grib2", 2, [(20200102, 0)], [0], FIELDS[:2])
    config = _config([first, other], tmp_path / "out", "time", ["t"], {}, {"filter_by_keys": PRESSURE})
    line = refused(config, tmp_path, capsys)
    assert f"{other}: its hypercube holds ['t', 'z'] but ['t'] in {first}" in line


# Real GRIB files from cfgrib's sample data (tests/data/README.md): each record equals its cfgrib slice.


def _sample(name: str, tmp_path: Path) -> Path:
    """A copy of a vendored sample file in its own folder (a build must leave that folder as it was)."""
    from conftest import VENDORED_DATA

    folder = tmp_path / "in"
    folder.mkdir()
    copy = folder / name
    copy.write_bytes((VENDORED_DATA / name).read_bytes())
    return copy


def test_a_real_grib1_file_along_time_with_missing_values_gives_its_cfgrib_slices(tmp_path):
    path = _sample("fields_with_missing_values.grib", tmp_path)
    sample = {"window": {"latitude": 13, "longitude": 20}}
    output = _build(tmp_path, _config([path], tmp_path / "out", "time", ["t2m"], sample))
    source = cfgrib_dataset([path], "time", {})
    assert np.isnan(source.t2m.values).any()  # the bitmap's missing points, as NaN, in the records too
    assert _assert_records_are_slices(output, source) == 2 * 7 * 9
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]  # no index file beside it


def test_a_real_grib2_file_along_forecast_step_gives_its_cfgrib_slices(tmp_path):
    path = _sample("step_60m.grib", tmp_path)
    sample = {"window": {"step": {"size": 4, "stride": 3}}, "keep": ["latitude", "longitude"]}
    output = _build(tmp_path, _config([path], tmp_path / "out", "step", ["t2m"], sample))
    assert _assert_records_are_slices(output, cfgrib_dataset([path], "step", {})) == (73 - 4) // 3 + 1


def test_a_real_seasonal_ensemble_gives_a_sample_per_member_start_and_step(tmp_path):
    """168 messages: cfgrib's hypercube of 28 members x 8 starts x 20 steps is NaN where no message is (each start
    has its own few steps); nan_policy: drop keeps the fields that are there, one sample each."""
    path = _sample("forecast_monthly_ukmo.grib", tmp_path)
    config = _config([path], tmp_path / "out", "time", ["t2m"], {"keep": ["latitude", "longitude"]})
    config["nan_policy"] = "drop"
    output = _build(tmp_path, config)
    source = cfgrib_dataset([path], "time", {})
    assert dict(source.t2m.sizes) == {"number": 28, "time": 8, "step": 20, "latitude": 6, "longitude": 11}
    assert _assert_records_are_slices(output, source) == 168


def test_a_real_lambert_grid_carries_its_2d_coordinates_as_features(tmp_path):
    path = _sample("lambert_grid.grib", tmp_path)
    config = _config([path], tmp_path / "out", "time", ["nlwrs"], {"window": {"y": 95, "x": 95}})
    config["coords"] = ["latitude", "longitude"]
    output = _build(tmp_path, config)
    source = cfgrib_dataset([path], "time", {})
    assert _assert_records_are_slices(output, source) == 25
    records = read_all_records(output, load_schema(str(output)))
    y, x = int(records["index/y"][0]), int(records["index/x"][0])
    np.testing.assert_array_equal(
        records["coord/latitude"][0], source.latitude.values[y : y + 95, x : x + 95].astype(np.float32)
    )
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]  # no index file beside it
