"""Reassembly (schemas.reassemble): an output's own records put back on the grid give the source, exactly.

Each output is built from real NetCDF files; the reference is the files opened with xarray and
the build's recorded selection applied, independently of the code under test. Cells no sample
covers must be NaN with coverage 0; every other cell must equal the source as stored (float32).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
import yaml

import schemas
from pipelines.demo import ArchiveShape, write_archive
from schemas import Reader, UserError, load_schema
from schemas.reassembly import window_weights

from helpers import build_quietly, load_virtual_dataset

REPO = Path(__file__).resolve().parents[2]


def on_selected_grid(source: xr.Dataset, output: Path) -> xr.Dataset:
    """The source with schema.json's recorded selection applied (what index/* counts on)."""
    schema = load_schema(str(output))
    taken = {
        dim: np.concatenate([np.arange(a, b) for a, b in entry["source_index_runs"]])
        for dim, entry in schema.sample.get("selection", {}).items()
    }
    return source.isel(taken)


def check_round_trip(ds: xr.Dataset, source: xr.Dataset, names, plus: float = 0.0) -> None:
    """Every variable equals the source (+ ``plus``) where a sample covered it and is NaN elsewhere; coordinates too."""
    coverage = ds["coverage"]
    assert int(coverage.max()) >= 1
    for dim in ds["coverage"].dims:
        if dim in source.coords:
            source = source.sel({dim: ds[dim].values})
    for name in names:
        got = ds[name]
        want = source[name].transpose(*got.dims).astype("float32") + np.float32(plus)
        covered = (coverage.broadcast_like(got) if set(coverage.dims) <= set(got.dims) else coverage.max()) > 0
        if set(coverage.dims) - set(got.dims):  # a static field: covered wherever any sample was
            covered = coverage.max([d for d in coverage.dims if d not in got.dims]) > 0
            covered = covered.broadcast_like(got)
        expected = np.where(covered.transpose(*got.dims).values, want.values, np.nan)
        assert got.dtype == np.float32
        np.testing.assert_array_equal(got.values, expected, err_msg=name)
        assert got.attrs == {k: v for k, v in source[name].attrs.items()}
    for name, coord in ds.coords.items():
        if name not in source.coords:
            continue
        np.testing.assert_array_equal(coord.values, source[name].values, err_msg=name)
        assert coord.dtype == source[name].dtype, name
        assert coord.attrs == source[name].attrs, name
        for key in ("units", "calendar"):  # (xarray may spell a midnight out, or not)
            got, want = (str(e.get(key)).removesuffix(" 00:00:00") for e in (coord.encoding, source[name].encoding))
            assert got == want, (name, key)


def plus_one(output: Path, split: str = "data"):
    """The output's records with every variable (and stack) + 1: a model that predicts the source + 1."""
    variables = {f.name for f in load_schema(str(output)).variable_features}
    for batch in Reader(str(output), split).iter_chunks():
        yield {name: values + 1 if name in variables else values for name, values in batch.items()}


@pytest.fixture(scope="module")
def era5(tmp_path_factory) -> Path:
    """A synthetic ERA5-like archive (lat 90 to -90, lon 0 to 345 every 15) with an invariants file."""
    directory = tmp_path_factory.mktemp("era5")
    write_archive(directory, ArchiveShape(num_files=3, steps_per_file=3, levels=3, lat=20, lon=24), invariants=True)
    return directory


@pytest.fixture(scope="module")
def era5_source(era5) -> xr.Dataset:
    source = load_virtual_dataset(sorted(era5.glob("era5_*.nc")), "time")
    return xr.merge([source, xr.open_dataset(era5 / "invariants.nc").load()], combine_attrs="override")


@pytest.fixture(scope="module")
def overlapping(era5, tmp_path_factory) -> Path:
    """Windows overlapping (stride < size), pairs along time, two splits, packed records, stacked winds."""
    tmp = tmp_path_factory.mktemp("overlapping")
    config = {
        "input": {"paths": str(era5 / "era5_*.nc"), "concat_dim": "time"},
        "variables": ["t", "u", "v"],
        "sample": {
            "window": {"lat": {"size": 8, "stride": 5}, "lon": {"size": 6, "stride": 4}},
            "offsets": {"time": [0, 1]},
            "keep": ["level"],
        },
        "splits": {"train": {"time": ["2020-01-01", "2020-01-01T18"]}, "valid": {"time": ["2020-01-02T00", None]}},
        "layout": {"stack": {"name": "wind", "variables": ["u", "v"], "axis": -1}},
        "output": {"path": str(tmp / "out"), "num_shards": 2, "examples_per_record": 3},
    }
    return build_quietly(config, tmp)


@pytest.mark.parametrize("split", ["train", "valid"])
def test_overlapping_pairs_packed_and_stacked_come_back_exactly(overlapping, era5_source, split):
    ds = schemas.reassemble(str(overlapping), split=split)
    assert set(ds.data_vars) == {"t", "u", "v", "coverage"}
    assert int(ds["coverage"].max()) > 1  # windows overlap, and pairs share steps
    assert int(ds["coverage"].min()) == 0  # lat 20 = windows at 0, 5, 10 of 8: rows 18, 19 are left out
    check_round_trip(ds, era5_source, ["t", "u", "v"])
    times = ds["time"].values
    schema = load_schema(str(overlapping))
    first, last = schema.sample["splits"][split]["first"], schema.sample["splits"][split]["last"]
    assert times[0] == np.datetime64(first) and times[-1] >= np.datetime64(last)


def test_predictions_plus_one_give_the_source_plus_one(overlapping, era5_source):
    ds = schemas.reassemble(str(overlapping), plus_one(overlapping, "train"), split="train")
    check_round_trip(ds, era5_source, ["t", "u", "v"], plus=1.0)


@pytest.mark.parametrize("blend", ["cosine", "gaussian"])
def test_blends_of_identical_overlapping_values_give_the_source(overlapping, era5_source, blend):
    ds = schemas.reassemble(str(overlapping), split="valid", blend=blend)
    covered = ds["coverage"] > 0
    source = era5_source.sel(time=ds["time"].values)
    for name in ("t", "u"):
        got = ds[name].where(covered)
        want = source[name].astype("float32").transpose(*got.dims).where(covered)
        np.testing.assert_allclose(got.values, want.values, rtol=2e-7, equal_nan=True)


def test_window_weights_are_positive_and_peak_in_the_middle():
    for blend in ("cosine", "gaussian"):
        weights = window_weights(9, blend)
        assert (weights > 0).all() and weights.argmax() == 4 and np.allclose(weights, weights[::-1])
    assert (window_weights(9, "mean") == 1).all()


def test_a_seam_crossing_selection_with_a_static_field_and_filled_nan(era5, era5_source, tmp_path):
    source = era5_source.copy(deep=True)
    holes = source["t"].values
    holes[:, :, 3:5, 20:22] = np.nan  # NaN where the box crosses the seam: filled, masked, put back as NaN
    directory = tmp_path / "holed"
    directory.mkdir()
    for i, path in enumerate(sorted(era5.glob("era5_*.nc"))):
        with xr.open_dataset(path) as part:
            part = part.load()
        part["t"].values[...] = holes[3 * i : 3 * i + 3]
        part.to_netcdf(directory / path.name)
    (directory / "invariants.nc").symlink_to(era5 / "invariants.nc")
    config = {
        "input": {"paths": str(directory / "*.nc")},
        "variables": ["t", "orography"],
        "select": {"lat": {"min": -50, "max": 50}, "lon": {"min": 300, "max": 60}},
        "sample": {"window": {"lat": 3, "lon": {"size": 3, "stride": 2}}, "keep": ["level"]},
        "nan_policy": "fill",
        "fill_value": 0.0,
        "nan_mask": True,
        "output": {"path": str(tmp_path / "o"), "num_shards": 2},
    }
    output = build_quietly(config, tmp_path)
    ds = schemas.reassemble(str(output))
    assert ds["orography"].dims == ("lat", "lon") and np.isnan(ds["t"].values).any()
    check_round_trip(ds, on_selected_grid(source, output), ["t", "orography"])
    assert ds["lon"].values.tolist()[:5] == [300, 315, 330, 345, 0]


def test_an_ensemble_comes_back_member_by_member(sample_file, tmp_path):
    from test_ensembles import PATTERN, TREFHT, write_ensemble

    reference = write_ensemble(sample_file(TREFHT), tmp_path / "ensemble", members=(57, 60))
    with xr.open_dataset(next((tmp_path / "ensemble").glob("*.nc"))) as written:  # time encoded as the files are
        reference["time"].encoding = dict(written["time"].encoding)
    config = {
        "input": {"paths": str(tmp_path / "ensemble" / "*.nc"), "new_dim": {"name": "member", "from": PATTERN}},
        "sample": {"window": {"lat": 16, "lon": {"size": 16, "stride": 12}}},
        "output": {"path": str(tmp_path / "o")},
    }
    output = build_quietly(config, tmp_path)
    ds = schemas.reassemble(str(output))
    assert ds["TREFHT"].dims == ("member", "time", "lat", "lon")
    check_round_trip(ds, reference, ["TREFHT"])


def test_a_curvilinear_grid_keeps_its_2d_coordinates_exactly(tmp_path):
    from test_coords import write_ocean

    directory = write_ocean(tmp_path / "ocean")
    config = {
        "input": {"paths": str(directory / "tos_*.nc")},
        "variables": ["tos"],
        "coords": ["lat", "lon", "step"],
        "sample": {"window": {"y": 4, "x": {"size": 4, "stride": 3}}},
        "output": {"path": str(tmp_path / "o")},
    }
    output = build_quietly(config, tmp_path)
    ds = schemas.reassemble(str(output))
    source = load_virtual_dataset(sorted(directory.glob("tos_*.nc")), "time")
    for name in ("lat", "lon"):
        assert ds[name].dims == ("y", "x") and ds[name].dtype == np.float64
        np.testing.assert_array_equal(ds[name].values, source[name].values)
        assert ds[name].attrs == source[name].attrs
    np.testing.assert_array_equal(ds["step"].values, source["step"].values)
    assert ds["depth"].item() == source["depth"].item()
    check_round_trip(ds, source.drop_vars(["lat", "lon"]), ["tos"])


CONFIGS = sorted(p.name for p in (REPO / "configs").glob("*.yaml"))


@pytest.fixture(scope="module")
def demo_like(tmp_path_factory) -> tuple[Path, xr.Dataset]:
    """The demo archive's layout, small: 8 daily files of 4 steps (the configs' splits reach 2020-01-08), invariants."""
    directory = tmp_path_factory.mktemp("demo_like")
    write_archive(directory, ArchiveShape(num_files=8, steps_per_file=4, levels=3, lat=20, lon=24), invariants=True)
    source = load_virtual_dataset(sorted(directory.glob("era5_*.nc")), "time")
    return directory, xr.merge([source, xr.open_dataset(directory / "invariants.nc").load()], combine_attrs="override")


@pytest.mark.parametrize("name", CONFIGS)
def test_every_shipped_config_round_trips(name, demo_like, sample_file, tmp_path):
    """Each config in configs/ as shipped, on a small archive (or the ERA-Interim file), reassembled per split."""
    config = yaml.safe_load((REPO / "configs" / name).read_text())
    config["output"] = {**config["output"], "path": str(tmp_path / "out")}
    if "eraint" in str(config["input"]["paths"]):
        config["input"]["paths"] = str(sample_file("eraint_uvz.nc"))
        with xr.open_dataset(config["input"]["paths"]) as ds:
            source = ds.load()
    else:
        wanted = set(config.get("variables") or [])
        directory, source = demo_like
        config["input"]["paths"] = str(directory / ("*.nc" if "orography" in wanted else "era5_*.nc"))
        config["sample"] = _fit(config["sample"])
    output = build_quietly(config, tmp_path)
    schema = load_schema(str(output))
    for split in schema.splits:
        ds = schemas.reassemble(str(output), split=split)
        names = [n for n in ds.data_vars if n != "coverage"]
        if schema.config.get("nan_policy") == "fill" and not schema.config.get("nan_mask"):
            source = source.fillna(schema.config["fill_value"])
        check_round_trip(ds, source, names)


def _fit(sample: dict) -> dict:
    """A config's windows made to fit the small archive (20 x 24): sizes at most 8."""
    window = {}
    for dim, spec in sample.get("window", {}).items():
        size = min(spec["size"], 8)
        window[dim] = {"size": size, "stride": min(spec.get("stride", size), size)}
    return {**sample, "window": window}


# ---- hostile ------------------------------------------------------------------------------------------------


def one_sample(output: Path, split: str = "train") -> dict:
    return next(iter(Reader(str(output), split)))


def test_duplicate_keys_are_one_line(overlapping):
    sample = one_sample(overlapping)
    with pytest.raises(UserError, match=r"was given twice") as error:
        schemas.reassemble(str(overlapping), [sample, sample], split="train")
    assert "\n" not in str(error.value)


def test_a_key_the_output_does_not_hold_is_one_line(overlapping):
    sample = dict(one_sample(overlapping), **{"index/lat": np.int64(3)})  # windows start at 0, 5, 10
    with pytest.raises(UserError, match=r"index/lat = 3 is not a sample of the output") as error:
        schemas.reassemble(str(overlapping), [sample], split="train")
    assert "\n" not in str(error.value)
    late = dict(one_sample(overlapping), **{"index/time": np.int64(6)})  # in the valid split, not train
    with pytest.raises(UserError, match=r"index/time = 6"):
        schemas.reassemble(str(overlapping), [late], split="train")


def test_a_wrong_shape_is_one_line(overlapping):
    sample = one_sample(overlapping)
    sample["t"] = sample["t"][..., :3]
    with pytest.raises(UserError, match=r"'t' has shape \(2, 3, 8, 3\) where the output's feature has") as error:
        schemas.reassemble(str(overlapping), [sample], split="train")
    assert "\n" not in str(error.value)
    odd = {k: v for k, v in one_sample(overlapping).items() if k.startswith("index/")}
    odd["pred"] = np.zeros((5, 5))
    with pytest.raises(UserError, match=r"'pred' has shape \(5, 5\), which fits no sample shape"):
        schemas.reassemble(str(overlapping), [odd], split="train")


def test_a_split_that_does_not_exist_is_one_line(overlapping):
    with pytest.raises(UserError, match=r"no split 'test'; it has: train, valid") as error:
        schemas.reassemble(str(overlapping), [], split="test")
    assert "\n" not in str(error.value)


def test_a_prediction_under_another_name_without_the_kept_dims(overlapping, era5_source):
    """A model predicting t at one level: its samples drop the level dim; reassembly says which dims it took."""

    def predictions():
        for sample in Reader(str(overlapping), "valid"):
            keys = {k: v for k, v in sample.items() if k.startswith("index/")}
            yield {**keys, "t500": sample["t"][:, 1]}

    ds = schemas.reassemble(str(overlapping), predictions(), split="valid")
    assert ds["t500"].dims == ("time", "lat", "lon")
    level = era5_source["level"].values[1]
    want = era5_source["t"].sel(level=level, time=ds["time"].values).astype("float32")
    covered = ds["coverage"] > 0
    np.testing.assert_array_equal(ds["t500"].where(covered).values, want.where(covered).values)


def test_pairs_as_forecasts_init_time_and_lead_time_with_area_weights(overlapping, era5_source):
    """WeatherBench-X's layout: each sample's index its init_time, its offsets x the step its lead_time."""
    ds = schemas.reassemble(str(overlapping), plus_one(overlapping, "valid"), split="valid", layout="forecast")
    assert ds["t"].dims == ("init_time", "lead_time", "level", "lat", "lon")
    assert ds["lead_time"].values.tolist() == [np.timedelta64(0, "ns"), np.timedelta64(6 * 3600 * 10**9, "ns")]
    np.testing.assert_array_equal(ds["valid_time"].values, (ds["init_time"] + ds["lead_time"]).values)
    covered = (ds["coverage"] > 0).values[:-1, None]  # (init_time, level, lat, lon), the last init aside
    for lead in range(2):
        valid = ds["valid_time"].isel(lead_time=lead).values[:-1]
        want = era5_source["t"].sel(time=valid).transpose("time", "level", "lat", "lon").values.astype("float32") + 1
        got = ds["t"].isel(lead_time=lead, init_time=slice(0, -1)).values
        np.testing.assert_array_equal(got, np.where(covered, want, np.nan))
    assert np.isnan(ds["t"].isel(init_time=-1)).all()  # the last step starts no pair
    weights = np.cos(np.deg2rad(era5_source["lat"].values.astype(np.float64)))
    np.testing.assert_allclose(ds["area_weight"].values, weights / weights.mean())


def test_the_forecast_layout_needs_offsets_along_the_concat_dim(era5, tmp_path):
    config = {
        "input": {"paths": str(era5 / "era5_*.nc")},
        "variables": ["t"],
        "sample": {"window": {"lat": 10, "lon": 12}, "keep": ["level"]},
        "output": {"path": str(tmp_path / "o")},
    }
    output = build_quietly(config, tmp_path)
    with pytest.raises(UserError, match=r"layout 'forecast' needs samples with offsets along 'time'") as error:
        schemas.reassemble(str(output), layout="forecast")
    assert "\n" not in str(error.value)
    with pytest.raises(UserError, match=r"blend: 'box' is not one of mean, cosine, gaussian"):
        schemas.reassemble(str(output), blend="box")


# ---- the command line ---------------------------------------------------------------------------------------


def reassemble_cli(*argv: str, capsys=None) -> tuple[int, str]:
    from pipelines.reassemble import main

    code = main([*argv, "--quiet"])
    err = capsys.readouterr().err if capsys is not None else ""
    return code, err


def write_predictions(output: Path, directory: Path, split: str) -> None:
    """Predictions = records + 1, as .npz batches and as TFRecords of tf.Example made by TensorFlow itself."""
    import tensorflow as tf

    directory.mkdir()
    batches = list(plus_one(output, split))
    half = len(batches) // 2 or 1
    for i, batch in enumerate(batches[:half]):
        keep = {k: v for k, v in batch.items() if k in ("t", "wind") or k.startswith("index/")}
        np.savez(directory / f"part-{i}.npz", **keep)
    with tf.io.TFRecordWriter(str(directory / "rest.tfrecord")) as writer:
        for batch in batches[half:]:
            for i in range(len(batch["t"])):
                feature = {
                    name: tf.train.Feature(int64_list=tf.train.Int64List(value=[int(batch[name][i])]))
                    if name.startswith("index/")
                    else tf.train.Feature(float_list=tf.train.FloatList(value=batch[name][i].reshape(-1)))
                    for name in ("t", "wind", *[k for k in batch if k.startswith("index/")])
                }
                writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())


@pytest.mark.parametrize("suffix", ["zarr", "nc"])
def test_the_command_line_writes_chunk_by_chunk_what_the_library_returns(overlapping, tmp_path, suffix, capsys):
    predictions = tmp_path / "predictions"
    write_predictions(overlapping, predictions, "valid")
    to = tmp_path / f"out.{suffix}"
    args = [str(overlapping), "--split", "valid", "--to", str(to), "--predictions", str(predictions)]
    code, err = reassemble_cli(*args, "--chunk_mb", "0.05", capsys=capsys)
    assert code == 0, err
    written = xr.open_dataset(to, engine="zarr" if suffix == "zarr" else None).load()
    want = schemas.reassemble(str(overlapping), plus_one(overlapping, "valid"), split="valid")
    for name in ("t", "u", "v", "coverage"):
        assert written[name].dtype == want[name].dtype
        np.testing.assert_array_equal(written[name].values, want[name].values, err_msg=name)
    np.testing.assert_array_equal(written["time"].values, want["time"].values)
    assert written["t"].attrs == want["t"].attrs and written["lat"].attrs == want["lat"].attrs
    if suffix == "zarr":  # chunks along time of the size the budget gave: several, one task each
        chunks = xr.open_zarr(to)["t"].encoding["chunks"]
        assert chunks[0] < written.sizes["time"] and chunks[1:] == written["t"].shape[1:]
    assert not (tmp_path / f"out.{suffix}.parts").exists() and not (tmp_path / "out.nc.zarr.tmp").exists()
    code, err = reassemble_cli(*args, capsys=capsys)  # it exists now
    assert code == 2 and err.strip().startswith("error: --to:") and "--overwrite" in err


def test_a_folder_beside_to_that_no_reassembly_made_is_never_removed(overlapping, tmp_path, capsys, monkeypatch):
    """The run works in PATH.parts and removes it at the end: a user's folder of that name is refused, untouched; a
    killed run's (its marker inside) is cleared; a .nc that fails to write leaves no half-written file."""
    from pipelines import reassemble as cli

    base = [str(overlapping), "--split", "valid"]
    mine = tmp_path / "out.nc.parts"
    mine.mkdir()
    (mine / "thesis.tex").write_text("years of work")
    code, err = reassemble_cli(*base, "--to", str(tmp_path / "out.nc"), capsys=capsys)
    assert code == 2 and err.count("\n") == 1 and "out.nc.parts exists and no reassembly made it" in err, err
    assert (mine / "thesis.tex").read_text() == "years of work" and not (tmp_path / "out.nc").exists()
    killed = tmp_path / "again.zarr.parts"
    killed.mkdir()
    (killed / cli.WORK_MARKER).write_text("")
    (killed / "chunk-000000-0.bucket").write_bytes(b"left by a killed run")
    assert reassemble_cli(*base, "--to", str(tmp_path / "again.zarr"), capsys=capsys)[0] == 0
    assert not killed.exists() and (tmp_path / "again.zarr").is_dir()

    def fail_midway(self, path, *args, **kwargs):
        with open(path, "wb") as stream:
            stream.write(b"CDF\x01 half")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(xr.Dataset, "to_netcdf", fail_midway)
    code, err = reassemble_cli(*base, "--to", str(tmp_path / "full.nc"), capsys=capsys)
    fix = "free some space, or write the output elsewhere (--to)"
    assert code == 1 and err == f"error: {tmp_path / 'full.nc'}: no space left on device; {fix}\n"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("full")) == []


@pytest.mark.parametrize("suffix", ["nc", "zarr"])
def test_overwrite_replaces_only_what_a_reassembly_wrote(overlapping, era5, tmp_path, suffix, capsys):
    """--overwrite removes --to only where a reassembly wrote it: a user's NetCDF file or Zarr store of that name
    (here the output's own input, and a text file) stays as it was, and the command says so in one line."""
    base = [str(overlapping), "--split", "valid"]
    ours = tmp_path / f"ours.{suffix}"
    assert reassemble_cli(*base, "--to", str(ours), capsys=capsys)[0] == 0
    assert reassemble_cli(*base, "--to", str(ours), "--overwrite", capsys=capsys)[0] == 0  # a rerun replaces it
    source = sorted(era5.glob("era5_*.nc"))[0]
    if suffix == "nc":
        theirs = [tmp_path / "input.nc", tmp_path / "notes.nc"]
        shutil.copyfile(source, theirs[0])
        theirs[1].write_text("my notes")
    else:
        theirs = [tmp_path / "input.zarr", tmp_path / "empty.zarr"]
        xr.open_dataset(source).to_zarr(theirs[0])
        theirs[1].mkdir()
    before = {
        path: sorted((p.relative_to(path), p.stat().st_size) for p in path.rglob("*"))
        if path.is_dir()
        else path.read_bytes()
        for path in theirs
    }
    for path in theirs:
        code, err = reassemble_cli(*base, "--to", str(path), "--overwrite", capsys=capsys)
        assert code == 2 and err.count("\n") == 1 and "exists and no reassembly wrote it" in err, err
    after = {
        path: sorted((p.relative_to(path), p.stat().st_size) for p in path.rglob("*"))
        if path.is_dir()
        else path.read_bytes()
        for path in theirs
    }
    assert after == before


def test_the_command_line_refuses_bad_predictions_in_one_line(overlapping, tmp_path, capsys):
    base = [str(overlapping), "--to", str(tmp_path / "x.zarr")]
    code, err = reassemble_cli(*base, "--split", "test", capsys=capsys)
    assert code == 2 and err.count("\n") == 1 and "no split 'test'; it has: train, valid" in err
    sample = {k: v[None] for k, v in one_sample(overlapping).items()}
    for name, change, message in (
        ("far", {"index/lat": np.array([3])}, "index/lat = 3 is not a sample of the output"),
        ("narrow", {"t": sample["t"][..., :3]}, "'t' has shape (2, 3, 8, 3) where the output's feature has"),
    ):
        folder = tmp_path / name
        folder.mkdir()
        np.savez(folder / "p.npz", **{**sample, **change})
        code, err = reassemble_cli(*base, "--split", "train", "--predictions", str(folder), capsys=capsys)
        assert code == 2 and err.count("\n") == 1 and message in err, err
        assert not (tmp_path / "x.zarr").exists()
    twice = tmp_path / "twice"
    twice.mkdir()
    np.savez(twice / "a.npz", **sample)
    np.savez(twice / "b.npz", **sample)
    code, err = reassemble_cli(*base, "--split", "train", "--predictions", str(twice), capsys=capsys)
    assert code == 2 and "was given twice" in err and err.count("\n") == 1


def test_bucket_files_round_trip_frame_by_frame_and_a_damaged_one_is_refused():
    import io

    from transforms.reassemble import _BUCKET_MAGIC, iter_bucket, write_frame

    arrays = {"t": np.arange(24, dtype=np.float32).reshape(2, 3, 4), "index/lat": np.array([0, 5])}
    stream = io.BytesIO()
    stream.write(_BUCKET_MAGIC)
    frames = [{k: v[:1] for k, v in arrays.items()}, {k: v[1:] for k, v in arrays.items()}]
    for frame in frames:
        write_frame(stream, frame)
    data = stream.getvalue()
    back = list(iter_bucket(io.BytesIO(data), "b"))
    assert len(back) == 2 and all(a.keys() == arrays.keys() for a in back)
    assert all(np.array_equal(b[k], f[k]) for b, f in zip(back, frames) for k in arrays)
    header = b'[["t", "<f4", [-1, 3, 4]]]'  # a negative size would read the rest of the file
    negative = _BUCKET_MAGIC + len(header).to_bytes(8, "little") + header + data[len(_BUCKET_MAGIC) :]
    for damaged, message in (
        (data[:-4], "b: cut short in index/lat"),
        (data + b"xx", "cut short in a frame's header"),
        (b"PK" + data, "not a bucket"),
        (negative, "not an array of numbers"),
    ):
        with pytest.raises(ValueError, match=message):
            list(iter_bucket(io.BytesIO(damaged), "b"))


def test_the_command_line_puts_back_masked_nan_and_a_static_field_as_the_library_does(era5, tmp_path, capsys):
    """A variable at a time: t with its mask (NaN put back), orography (no time dim: written once), coverage."""
    holed = tmp_path / "holed"
    holed.mkdir()
    for path in sorted(era5.glob("era5_*.nc")):
        with xr.open_dataset(path) as part:
            part = part.load()
        part["t"].values[:, :, 3:5, 2:4] = np.nan
        part.to_netcdf(holed / path.name)
    (holed / "invariants.nc").symlink_to(era5 / "invariants.nc")
    config = {
        "input": {"paths": str(holed / "*.nc")},
        "variables": ["t", "orography"],
        "sample": {"window": {"lat": 4, "lon": {"size": 4, "stride": 3}}, "keep": ["level"]},
        "nan_policy": "fill",
        "fill_value": 0.0,
        "nan_mask": True,
        "output": {"path": str(tmp_path / "o"), "num_shards": 2},
    }
    output = build_quietly(config, tmp_path)
    to = tmp_path / "back.zarr"
    code, err = reassemble_cli(str(output), "--to", str(to), "--chunk_mb", "0.1", capsys=capsys)
    assert code == 0, err
    written = xr.open_zarr(to).load()
    assert written["t"].encoding["chunks"][0] < written.sizes["time"]  # several chunks, several tasks
    want = schemas.reassemble(str(output))
    assert np.isnan(want["t"].values).any() and not np.isnan(want["orography"].values).all()
    for name in ("t", "orography", "coverage"):
        np.testing.assert_array_equal(written[name].values, want[name].values, err_msg=name)


def test_the_command_line_to_gs_reads_its_remote_buckets_a_variable_at_a_time(overlapping, gcs, capsys):
    """Bucket files in the bucket (beside --to): each chunk's task copies its own down, then reads them per variable."""
    to = "gs://xtf-test/reassembled/back.zarr"
    code, err = reassemble_cli(str(overlapping), "--split", "valid", "--to", to, "--chunk_mb", "0.05", capsys=capsys)
    assert code == 0, err
    written = xr.open_zarr(gcs.get_mapper(to)).load()
    want = schemas.reassemble(str(overlapping), split="valid")
    for name in ("t", "u", "v", "coverage"):
        np.testing.assert_array_equal(written[name].values, want[name].values, err_msg=name)
    assert not gcs.exists("xtf-test/reassembled/back.zarr.parts")


def test_keys_counted_once_then_a_variable_per_pass_give_what_one_pass_gives(overlapping):
    from schemas.reassembly import Reassembly

    schema = load_schema(str(overlapping))
    batches = list(plus_one(overlapping, "train"))
    want = schemas.reassemble(str(overlapping), iter(batches), split="train")
    assembly = Reassembly(schema, "train", where=str(overlapping))
    keys = [a.index_name for a in assembly.checked]
    for batch in batches:
        assembly.count({k: batch[k] for k in keys})
    groups = assembly.placed_groups(batches[0])
    assert ("t",) in groups and ("wind",) in groups  # (a stack: one array, two variables)
    assert not any(n.startswith(("index/", "coord/")) for group in groups for n in group)
    got = {}
    for group in groups:
        for batch in batches:
            assembly.place({k: batch[k] for k in [*keys, *group]})
        got.update({name: values for name, _, values in assembly.take_finished()})
    for name in ("t", "u", "v"):
        np.testing.assert_array_equal(got[name], want[name].values, err_msg=name)
    np.testing.assert_array_equal(assembly.coverage, want["coverage"].values)
    with pytest.raises(RuntimeError, match="placed again after it was finished"):
        assembly.place({k: batches[0][k] for k in [*keys, "t"]})
    with pytest.raises(UserError, match="was given twice"):
        assembly.count({k: batches[0][k] for k in keys})
