"""Training-ready outputs: splits, missing data, per-level statistics and normalisation, stacked
channels, static and surface fields, packed records and gzip, each end to end."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import xarray as xr
import yaml

from pipelines.build import main
from schemas import load_dataset, load_schema, load_stats
from schemas.reader import Reader

from helpers import expected_feature, import_generated_parser, parse_with_generated_parser, read_all_records

LEVELS = [1000, 850, 500]


@pytest.fixture(scope="module")
def archive(tmp_path_factory) -> Path:
    """4 daily-split files of 6-hourly data (t on levels, t2m at the surface with masked points) and invariants."""
    directory = tmp_path_factory.mktemp("training")
    rng = np.random.default_rng(7)
    lat, lon = np.linspace(60, 30, 12), np.linspace(0, 27, 10)
    for day in range(4):
        time = pd.date_range(f"2021-01-0{day + 1}", periods=4, freq="6h")
        t = 280 - 30 * (1 - np.array(LEVELS) / 1000)[None, :, None, None] + rng.normal(0, 2, (4, 3, 12, 10))
        u = rng.normal(10, 5, (4, 3, 12, 10))
        t2m = 285 + rng.normal(0, 3, (4, 12, 10))
        t2m[rng.random(t2m.shape) < 0.01] = np.nan  # masked on disk with _FillValue
        xr.Dataset(
            {
                "t": (("time", "level", "lat", "lon"), t.astype("f4"), {"units": "K"}),
                "u": (("time", "level", "lat", "lon"), u.astype("f4"), {"units": "m s-1"}),
                "t2m": (("time", "lat", "lon"), t2m.astype("f4"), {"units": "K"}),
            },
            coords={"time": time, "level": LEVELS, "lat": lat, "lon": lon},
        ).to_netcdf(directory / f"day{day}.nc", encoding={"t2m": {"_FillValue": -9999.0}})
    orography = 500 + 400 * np.sin(np.arange(120) / 9).reshape(12, 10)
    xr.Dataset(
        {"orog": (("lat", "lon"), orography.astype("f4"), {"units": "m"})}, coords={"lat": lat, "lon": lon}
    ).to_netcdf(directory / "invariants.nc")
    return directory


def source(archive: Path) -> xr.Dataset:
    days = xr.concat([xr.open_dataset(p) for p in sorted(archive.glob("day*.nc"))], dim="time")
    return xr.merge([days, xr.open_dataset(archive / "invariants.nc")])


def build(tmp_path: Path, config: dict) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    assert main(["--config", str(path)]) == 0
    return Path(config["output"]["path"])


def base(archive: Path, output: Path, **extra) -> dict:
    return {
        "input": {"paths": str(archive / "*.nc")},
        "variables": ["t", "u"],
        "sample": {"window": {"lat": 4, "lon": 5}, "keep": ["level"]},
        "output": {"path": str(output), "num_shards": 2},
        **extra,
    }


SPLITS = {
    "train": {"time": ["2021-01-01", "2021-01-02"]},
    "valid": {"time": ["2021-01-03T00", "2021-01-03T12"]},
    "test": {"time": ["2021-01-04", None]},
}


def test_splits_never_share_or_straddle(archive, tmp_path):
    config = base(archive, tmp_path / "out", splits=SPLITS)
    config["sample"]["offsets"] = {"time": [0, 1]}
    output = build(tmp_path, config)
    schema = load_schema(str(output))
    assert list(schema.splits) == ["train", "valid", "test"]
    assert all(s.file.startswith(f"{name}-") for name, shards in schema.splits.items() for s in shards)
    per_time = 3 * 2  # 12 lats / 4, 10 lons / 5
    # pairs (t, t+1) inside each range: train 8 steps -> 7, valid 3 -> 2, test 4 -> 3; the rest straddle.
    assert [schema.num_examples(n) for n in ("train", "valid", "test")] == [7 * per_time, 2 * per_time, 3 * per_time]
    assert schema.counts["samples_outside_splits"] == (15 - 12) * per_time
    bounds = {
        "train": ("2021-01-01T00", "2021-01-02T18"),
        "valid": ("2021-01-03T00", "2021-01-03T12"),
        "test": ("2021-01-04T00", "2021-01-04T18"),
    }
    seen = set()
    for name, (first, last) in bounds.items():
        records = parse_with_generated_parser(output, name)
        times = records["coord/time"]
        low, high = (np.datetime64(v, "s").astype(np.int64) for v in (first, last))
        assert times.min() >= low and times.max() <= high  # no pair reaches across a boundary
        keys = set(zip(records["index/time"].tolist(), records["index/lat"].tolist(), records["index/lon"].tolist()))
        assert len(keys) == len(times) and not keys & seen
        seen |= keys
        assert not np.all(np.diff(records["index/time"]) >= 0)  # each split is shuffled
    stats = load_stats(str(output))
    assert stats["reference_split"] == "train" and set(stats["splits"]) == {"train", "valid", "test"}
    train = parse_with_generated_parser(output, "train")["t"].astype(np.float64)
    assert stats["variables"]["t"]["mean"] == pytest.approx(train.mean(), rel=1e-9)
    assert stats["variables"]["t"]["variance"] == pytest.approx(train.var(), rel=1e-9)
    test = parse_with_generated_parser(output, "test")["t"].astype(np.float64)
    assert stats["splits"]["test"]["variables"]["t"]["mean"] == pytest.approx(test.mean(), rel=1e-9)


@pytest.mark.parametrize("policy", ["keep", "drop", "fill"])
def test_nan_policy(archive, tmp_path, capsys, policy):
    config = base(archive, tmp_path / policy, nan_policy=policy, variables=["t", "t2m"])
    if policy == "fill":
        config["fill_value"] = -1.0
    output = build(tmp_path, config)
    summary = capsys.readouterr().out
    schema = load_schema(str(output))
    records = read_all_records(output, schema)
    src = source(archive)
    per_time, steps = 6, 16
    with_nan = [
        np.isnan(src["t2m"].isel(time=i, lat=slice(4 * y, 4 * y + 4), lon=slice(5 * x, 5 * x + 5)).values).any()
        for i in range(steps)
        for y in range(3)
        for x in range(2)
    ]
    expected_nan = sum(with_nan)
    assert 0 < expected_nan < steps * per_time
    assert schema.counts["samples_with_nan"] == expected_nan
    said = {
        "keep": f"{expected_nan:,} samples hold NaN (nan_policy: keep",
        "drop": f"dropped: {expected_nan:,} with NaN (nan_policy: drop)",
        "fill": f"filled NaN with -1.0 in {expected_nan:,} samples",
    }
    assert said[policy] in summary
    t2m = records["t2m"]
    if policy == "drop":
        assert schema.num_examples() == steps * per_time - expected_nan == len(t2m)
        assert schema.counts["samples_dropped_nan"] == expected_nan and not np.isnan(t2m).any()
    elif policy == "fill":
        assert len(t2m) == steps * per_time and not np.isnan(t2m).any()
        assert (t2m == -1.0).sum() == int(np.isnan(src["t2m"].values[:, :12, :10]).sum())
    else:
        assert np.isnan(t2m).any(axis=(1, 2)).sum() == expected_nan
        assert load_stats(str(output))["variables"]["t2m"]["nan_count"] == int(np.isnan(t2m).sum())
    for i in range(len(t2m)):
        record = {name: values[i] for name, values in records.items()}
        expected = expected_feature(src, schema, "t2m", record)
        if policy == "fill":
            expected = np.where(np.isnan(expected), -1.0, expected)
        np.testing.assert_array_equal(record["t2m"], expected)


@pytest.mark.torch  # also reads through the PyTorch dataset (skipped there without torch)
def test_per_level_statistics_and_normalisation(archive, tmp_path):
    output = build(tmp_path, base(archive, tmp_path / "out", stats={"per": ["level"]}, splits=SPLITS))
    stats = load_stats(str(output))
    t = parse_with_generated_parser(output, "train")["t"].astype(np.float64)  # (n, level, lat, lon)
    assert stats["variables"]["t"]["dims"] == ["level"]
    np.testing.assert_allclose(stats["variables"]["t"]["mean"], t.mean(axis=(0, 2, 3)), rtol=1e-9)
    np.testing.assert_allclose(stats["variables"]["t"]["std"], t.std(axis=(0, 2, 3)), rtol=1e-9)
    parser = import_generated_parser(output)
    normalized = np.concatenate(
        [b["t"] for b in parser.make_dataset("train", batch_size=64, normalize=True).as_numpy_iterator()]
    )
    np.testing.assert_allclose(normalized.mean(axis=(0, 2, 3)), 0, atol=1e-4)
    np.testing.assert_allclose(normalized.std(axis=(0, 2, 3)), 1, atol=1e-4)
    through_package = np.concatenate(
        [b["t"] for b in load_dataset(str(output), "train", batch_size=64, normalize=True).as_numpy_iterator()]
    )
    np.testing.assert_array_equal(through_package, normalized)
    # The TensorFlow-free readers normalise alike (compared in sample order: shards interleave).
    batches = list(parser.make_dataset("train", batch_size=64, normalize=True).as_numpy_iterator())
    by_tensorflow = {name: np.concatenate([b[name] for b in batches]) for name in batches[0]}
    ours = Reader(str(output), "train", normalize=True).read_all()
    np.testing.assert_array_equal(_in_sample_order(ours)["t"], _in_sample_order(by_tensorflow)["t"])
    assert not np.array_equal(ours["t"], Reader(str(output), "train").read_all()["t"])
    torch = pytest.importorskip("torch")
    from schemas.torch_dataset import SplitDataset

    tensors = list(SplitDataset(str(output), "train", batch_size=64, normalize=True))
    with torch.no_grad():
        through_torch = {name: np.concatenate([t[name].numpy() for t in tensors]) for name in tensors[0]}
    np.testing.assert_array_equal(_in_sample_order(through_torch)["t"], _in_sample_order(ours)["t"])


def _in_sample_order(records: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    keys = sorted(name for name in records if name.startswith("index/"))
    order = np.lexsort([records[name] for name in keys[::-1]])
    return {name: values[order] for name, values in records.items()}


@pytest.mark.parametrize("axis", [-1, 0])
def test_stacked_channels(archive, tmp_path, axis):
    config = base(
        archive, tmp_path / f"stack{axis}", layout={"stack": {"name": "x", "variables": ["u", "t"], "axis": axis}}
    )
    output = build(tmp_path, config)
    schema = load_schema(str(output))
    x = schema.feature("x")
    assert x.source["channels"] == ["u", "t"]
    assert x.shape == ((3, 4, 5, 2) if axis == -1 else (2, 3, 4, 5))
    assert {f.name for f in schema.variable_features} == {"x"}
    records = parse_with_generated_parser(output)
    src = source(archive)
    for i in range(0, len(records["x"]), 7):
        record = {name: values[i] for name, values in records.items()}
        for channel, name in enumerate(["u", "t"]):
            values = record["x"][..., channel] if axis == -1 else record["x"][channel]
            reference = src[name].isel(
                time=int(record["index/time"]),
                lat=slice(int(record["index/lat"]), int(record["index/lat"]) + 4),
                lon=slice(int(record["index/lon"]), int(record["index/lon"]) + 5),
            )
            np.testing.assert_array_equal(values, reference.transpose("level", "lat", "lon").values)
    normalized = next(iter(load_dataset(str(output), batch_size=500, normalize=True)))["x"].numpy()
    channel_axis = normalized.ndim - 1 if axis == -1 else 1
    other = tuple(a for a in range(normalized.ndim) if a != channel_axis)
    assert np.all(np.abs(normalized.mean(axis=other)) < 1e-3)


def test_static_and_surface_fields_come_with_every_patch(archive, tmp_path):
    output = build(
        tmp_path, base(archive, tmp_path / "out", variables=["t", "t2m", "orog"], nan_policy="fill", fill_value=0.0)
    )
    schema = load_schema(str(output))
    assert schema.feature("t").shape == (3, 4, 5)
    assert (schema.feature("t2m").shape, schema.feature("t2m").dims) == ((4, 5), ("lat", "lon"))
    assert (schema.feature("orog").shape, schema.feature("orog").dims) == ((4, 5), ("lat", "lon"))
    assert schema.feature("orog").source["static"] is True
    records = parse_with_generated_parser(output)
    src = source(archive)
    for i in range(len(records["t"])):
        record = {name: values[i] for name, values in records.items()}
        for name in ("t", "orog"):
            np.testing.assert_array_equal(record[name], expected_feature(src, schema, name, record))
    assert len(records["orog"]) == 16 * 6


def test_packed_records_and_gzip_give_the_same_samples(archive, tmp_path):
    config = base(archive, tmp_path / "plain")
    config["sample"] = {"window": {"time": 5}}  # small samples: 5 steps at a point and level
    plain = build(tmp_path, config)
    config["output"] = {
        "path": str(tmp_path / "packed"),
        "num_shards": 2,
        "examples_per_record": 16,
        "compression": "gzip",
    }
    packed = build(tmp_path, config)
    schema = load_schema(str(packed))
    assert all(s.file.endswith(".tfrecord.gz") for s in schema.splits["data"])
    assert schema.num_examples() == load_schema(str(plain)).num_examples() == 3 * 3 * 12 * 10  # 3 windows of 16 steps
    assert schema.num_records() == sum(-(-s.examples // 16) for s in schema.splits["data"])
    a, b = parse_with_generated_parser(plain), parse_with_generated_parser(packed)
    assert {k: v.shape for k, v in a.items()} == {k: v.shape for k, v in b.items()}

    def by_position(records):
        order = np.lexsort([records[f"index/{d}"] for d in ("lon", "lat", "level", "time")])
        return {name: values[order] for name, values in records.items()}

    for name, values in by_position(a).items():
        np.testing.assert_array_equal(by_position(b)[name], values)
    # The same samples in the same shuffled order, shard by shard: packing only groups consecutive records.
    in_file_order = [read_all_records(out, load_schema(str(out))) for out in (plain, packed)]
    for name in ("index/time", "index/lat", "t"):
        np.testing.assert_array_equal(in_file_order[0][name], in_file_order[1][name])


def test_integer_variables_are_stored_as_int64_exactly(tmp_path):
    """Integers are varint-encoded, so their records cannot be laid out before the data is read."""
    rng = np.random.default_rng(3)
    lat, lon = np.arange(6.0), np.arange(8.0)
    for day in range(2):
        classes = rng.integers(-(2**31), 2**31 - 1, (3, 6, 8), dtype=np.int64).astype(np.int32)
        xr.Dataset(
            {"cls": (("time", "lat", "lon"), classes), "t": (("time", "lat", "lon"), rng.normal(size=(3, 6, 8)))},
            coords={"time": pd.date_range(f"2021-01-0{day + 1}", periods=3, freq="8h"), "lat": lat, "lon": lon},
        ).to_netcdf(tmp_path / f"day{day}.nc")
    xr.Dataset({"soil": (("lat", "lon"), rng.integers(0, 9, (6, 8), dtype=np.int8))}).to_netcdf(tmp_path / "static.nc")
    config = {
        "input": {"paths": str(tmp_path / "*.nc")},
        "variables": ["cls", "t", "soil"],
        "sample": {"window": {"lat": 3, "lon": 4}},
        "output": {"path": str(tmp_path / "out"), "num_shards": 2},
    }
    output = build(tmp_path, config)
    schema = load_schema(str(output))
    assert [(schema.feature(n).dtype, schema.feature(n).source["dtype"]) for n in ("cls", "soil")] == [
        ("int64", "int32"),
        ("int64", "int8"),
    ]
    days = xr.concat([xr.open_dataset(tmp_path / f"day{d}.nc") for d in range(2)], "time")
    src = xr.merge([days, xr.open_dataset(tmp_path / "static.nc")])
    records = parse_with_generated_parser(output)
    assert len(records["cls"]) == 6 * 2 * 2
    for i in range(len(records["cls"])):
        record = {name: values[i] for name, values in records.items()}
        for name in ("cls", "t", "soil"):
            np.testing.assert_array_equal(record[name], expected_feature(src, schema, name, record))


def test_nan_policy_drop_when_a_whole_unit_is_nan(tmp_path, monkeypatch):
    """Units that keep no sample write nothing: the build goes on with the others."""
    import functools

    import pipelines.graph as graph
    from planning.plan import make_plan

    time = pd.date_range("2000-01-01", periods=8, freq="6h")
    values = np.random.default_rng(0).normal(size=(8, 6, 6)).astype("f4")
    values[:4] = np.nan  # the first four steps: every sample of their units is NaN
    source = xr.Dataset(
        {"t": (("time", "lat", "lon"), values)}, coords={"time": time, "lat": np.arange(6.0), "lon": np.arange(6.0)}
    )
    source.to_netcdf(tmp_path / "half_nan.nc")
    monkeypatch.setattr(graph, "make_plan", functools.partial(make_plan, unit_budget_bytes=300))
    config = {
        "input": {"paths": str(tmp_path / "half_nan.nc")},
        "sample": {"window": {"lat": 3, "lon": 3}},
        "nan_policy": "drop",
        "output": {"path": str(tmp_path / "out"), "num_shards": 2},
    }
    output = build(tmp_path, config)
    schema = load_schema(str(output))
    assert schema.counts["samples_dropped_nan"] == 4 * 4 and schema.num_records() == 4 * 4
    records = read_all_records(output, schema)
    assert not np.isnan(records["t"]).any() and sorted(set(records["index/time"].tolist())) == [4, 5, 6, 7]


@pytest.fixture(scope="module")
def coast(tmp_path_factory) -> Path:
    """An ocean with land (NaN on disk): sst far from 0, sea ice whose real values include 0."""
    directory = tmp_path_factory.mktemp("coast")
    rng = np.random.default_rng(11)
    land = np.zeros((12, 10), dtype=bool)
    land[:, :4] = True
    land[:3, 4:7] = True
    sst = 283 + rng.normal(0, 10, (8, 12, 10))
    ice = np.clip(rng.normal(0.2, 0.4, (8, 12, 10)), 0, 1)  # many real zeros
    sst[:, land], ice[:, land] = np.nan, np.nan
    sst[5, 8, 8] = np.nan  # a gap in the ocean too
    xr.Dataset(
        {"sst": (("time", "lat", "lon"), sst.astype("f4")), "ice": (("time", "lat", "lon"), ice.astype("f4"))},
        coords={
            "time": pd.date_range("2021-01-01", periods=8, freq="6h"),
            "lat": np.arange(12.0),
            "lon": np.arange(10.0),
        },
    ).to_netcdf(directory / "coast.nc", encoding={"sst": {"_FillValue": -9999.0}})
    return directory


def _coast_config(coast: Path, output: Path, **extra) -> dict:
    return {
        "input": {"paths": str(coast / "coast.nc")},
        "sample": {"window": {"lat": 4, "lon": 5}},  # no overlap: every point in one sample
        "nan_policy": "fill",
        "fill_value": 0.0,
        "output": {"path": str(output), "num_shards": 2},
        **extra,
    }


def test_filled_points_stay_out_of_statistics_and_normalise_to_zero(coast, tmp_path, capsys):
    output = build(tmp_path, _coast_config(coast, tmp_path / "masked", nan_mask=["ice"]))
    assert "cannot tell" not in capsys.readouterr().out
    src = xr.open_dataset(coast / "coast.nc").load()
    schema = load_schema(str(output))
    stats = load_stats(str(output))
    for name in ("sst", "ice"):
        real = src[name].values.astype(np.float64)
        s = stats["variables"][name]
        assert s["mean"] == pytest.approx(np.nanmean(real), rel=1e-9)  # the ocean's, not dragged to 0 by land
        assert s["std"] == pytest.approx(np.nanstd(real), rel=1e-9)
        assert (s["count"], s["filled_count"], s["nan_count"]) == (
            int((~np.isnan(real)).sum()),
            int(np.isnan(real).sum()),
            0,
        )
    mask = schema.feature("mask/ice")
    assert (mask.dtype, mask.shape, mask.role, mask.source["of"]) == ("int64", (4, 5), "mask", "ice")
    assert [f.name for f in schema.features if f.role == "mask"] == ["mask/ice"]
    records = parse_with_generated_parser(output)  # TensorFlow's own parser
    expected = {
        name: np.stack(
            [
                expected_feature(src, schema, name, {k: v[i] for k, v in records.items()})
                for i in range(len(records["sst"]))
            ]
        )
        for name in ("sst", "ice")
    }
    np.testing.assert_array_equal(records["mask/ice"], np.isnan(expected["ice"]).astype(np.int64))
    normalization = stats["normalization"]
    assert normalization["ice"]["filled"] == {"mask": "mask/ice"}
    assert normalization["sst"]["filled"]["equal_to"] == 0.0  # no real sst is 0: found by value, exactly
    parser = import_generated_parser(output)
    batches = list(parser.make_dataset(batch_size=500, normalize=True).as_numpy_iterator())
    normalized = {name: np.concatenate([b[name] for b in batches]) for name in batches[0]}
    np.testing.assert_array_equal(normalized["index/time"], records["index/time"])
    for name in ("sst", "ice"):
        filled = np.isnan(expected[name])
        assert np.all(normalized[name][filled] == 0.0)
        assert normalized[name][~filled].mean() == pytest.approx(0, abs=1e-5)
        assert normalized[name][~filled].std() == pytest.approx(1, abs=1e-5)
    # Real zeros of ice are data: they normalise like any value, though they equal the fill.
    real_zeros = expected["ice"] == 0
    assert real_zeros.sum() > 10
    assert np.all(normalized["ice"][real_zeros] < -0.1)
    chosen = next(iter(load_dataset(str(output), batch_size=500, normalize=True, normalized_fill=-5.0)))
    assert np.all(chosen["sst"].numpy()[np.isnan(expected["sst"])] == -5.0)
    ours = Reader(str(output), normalize=True).read_all()  # numpy and torch readers: the same, bit for bit
    for name in ("sst", "ice"):
        np.testing.assert_array_equal(_in_sample_order(ours)[name], _in_sample_order(normalized)[name])


def test_without_a_mask_a_fill_among_the_real_values_is_not_guessed(coast, tmp_path, capsys):
    """ice's real values include the fill value 0: without nan_mask, which zeros were filled is unknowable."""
    output = build(tmp_path, _coast_config(coast, tmp_path / "plain"))
    assert "cannot tell the filled points of ice from data" in capsys.readouterr().out
    schema = load_schema(str(output))
    assert not [f for f in schema.features if f.role == "mask"]
    normalization = load_stats(str(output))["normalization"]
    assert "filled" not in normalization["ice"] and normalization["sst"]["filled"]["equal_to"] == 0.0
    raw = Reader(str(output)).read_all()
    ours = Reader(str(output), normalize=True).read_all()
    mean, std = (np.float32(normalization["ice"][k]) for k in ("mean", "std"))
    np.testing.assert_array_equal(ours["ice"], (raw["ice"] - mean) / std)  # every zero alike, none set
    assert np.all(ours["sst"][raw["sst"] == 0] == 0) and np.any(raw["sst"] == 0)
