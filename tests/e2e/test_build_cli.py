"""End to end: the command line on real and synthetic NetCDF files, read back with TensorFlow."""

from __future__ import annotations

import filecmp
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
import xarray as xr
import yaml
from scipy import stats

from pipelines.build import main
from schemas import load_schema, load_stats

from conftest import REPO
from helpers import (
    assert_matches_source,
    expected_feature,
    load_virtual_dataset,
    parse_with_generated_parser,
    read_all_records,
    run_warm,
)


def build(config: dict, tmp_path: Path, *flags: str, name: str = "config.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(config))
    assert main(["--config", str(path), *flags]) == 0
    return Path(config["output"]["path"]) if "--output" not in flags else Path(flags[flags.index("--output") + 1])


def check_output(output: Path, sources: list[Path], concat_dim: str) -> dict[str, np.ndarray]:
    """Everything issue 2 promises about one output, checked against the source files."""
    schema = load_schema(str(output))
    parsed = parse_with_generated_parser(output)
    first = schema.features[0].name
    assert schema.num_records() == len(parsed[first]) == schema.sample["num_samples"] == schema.counts["samples_cut"]
    assert [s.records for s in schema.splits["data"]] == [
        sum(1 for _ in tf.data.TFRecordDataset(str(output / s.file))) for s in schema.splits["data"]
    ]
    # Our TensorFlow-free reader sees the same records (and checks every CRC); the parser
    # interleaves the shards, so compare them in position order.
    ours = read_all_records(output, schema)
    index_names = [f.name for f in schema.features if f.role == "index"]

    def by_position(records):
        order = np.lexsort([records[n] for n in index_names[::-1]])
        return {name: values[order] for name, values in records.items()}

    ours_sorted, parsed_sorted = by_position(ours), by_position(parsed)
    for name, values in parsed_sorted.items():
        np.testing.assert_array_equal(ours_sorted[name], values)
    # Each sample appears once, and equals exactly the slice of the sources its index/* names.
    positions = np.stack([parsed[n] for n in index_names], axis=1)
    assert len(np.unique(positions, axis=0)) == len(positions)
    source = load_virtual_dataset(sources, concat_dim)
    for i in range(len(positions)):
        record = {name: values[i] for name, values in parsed.items()}
        for feature in schema.variable_features:
            np.testing.assert_array_equal(record[feature.name], expected_feature(source, schema, feature.name, record))
    # Statistics equal numpy float64 over the written samples.
    written_stats = load_stats(str(output))["variables"]
    for feature in schema.variable_features:
        values = parsed[feature.name].astype(np.float64)
        finite = values[~np.isnan(values)]
        got = written_stats[feature.name]
        assert got["count"] == finite.size and got["nan_count"] == values.size - finite.size
        assert got["mean"] == pytest.approx(finite.mean(), rel=1e-9)
        assert got["variance"] == pytest.approx(finite.var(), rel=1e-9)
        assert (got["min"], got["max"]) == (finite.min(), finite.max())
    return parsed


def patch_config(paths, output, **sample) -> dict:
    return {
        "input": {"paths": [str(p) for p in paths], "concat_dim": "time"},
        "variables": ["t", "u", "v", "q", "z"],
        "sample": sample or {"window": {"lat": 9, "lon": 9}, "keep": ["level"]},
        "output": {"path": str(output), "num_shards": 3},
    }


@pytest.fixture(scope="module")
def patches(small_archive, tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("patches")
    return build(patch_config([small_archive / "*.nc"], tmp / "out"), tmp)


def test_demo_runs_from_a_fresh_directory(tmp_path):
    command = [sys.executable, "-m", "pipelines.build"]
    first = run_warm(command, cwd=tmp_path, timeout=300)  # what the command does, not its imports: forked warm
    assert first.returncode == 0, first.stderr
    assert "from schemas import load_dataset" in first.stdout
    output = tmp_path / "demo" / "patches"
    parsed = check_output(output, sorted((tmp_path / "demo" / "era5").glob("era5_*.nc")), "time")
    assert (tmp_path / "demo" / "era5" / "invariants.nc").exists()  # static fields for configs/training_ready.yaml
    assert parsed["t"].shape[1:] == (7, 9, 9)
    assert_matches_source(output, 100)  # its relative input.paths found from here too
    before = {p.name: p.read_bytes() for p in output.glob("*.tfrecord")}
    second = run_warm(command, cwd=tmp_path, timeout=300)
    assert second.returncode == 0, second.stderr  # the demo replaces its own output
    assert {p.name: p.read_bytes() for p in output.glob("*.tfrecord")} == before


def test_the_demo_never_empties_a_folder_of_someone_elses_files(tmp_path, monkeypatch, capsys):
    """demo/era5 holding files the demo does not write: refused in one line, untouched; its own files, one
    missing: completed, the others kept."""
    from pipelines.demo import archive_names, ensure_demo_data

    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "demo" / "era5"
    folder.mkdir(parents=True)
    (folder / "my_run_2019.nc").write_bytes(b"CDF\x01 a user's data")
    assert main([]) == 2
    err = capsys.readouterr().err
    assert err == (
        "error: demo/era5: holds my_run_2019.nc, which the demo did not write, where it writes its archive; "
        "move them, or run the demo from another folder\n"
    )
    assert sorted(p.name for p in folder.iterdir()) == ["my_run_2019.nc"]
    assert not (tmp_path / "demo" / "patches").exists()
    (folder / "my_run_2019.nc").unlink()
    files = ensure_demo_data()
    assert [p.name for p in files] == sorted(archive_names(invariants=True)) and files[-1].name == "invariants.nc"
    files[1].unlink()  # (a run stopped while it wrote the archive)
    assert ensure_demo_data() == files and all(p.exists() for p in files)
    written = [p.stat().st_mtime_ns for p in files]
    assert ensure_demo_data() == files and [p.stat().st_mtime_ns for p in files] == written  # complete: kept


def test_training_ready_config_on_the_demo_archive(tmp_path, monkeypatch):
    """configs/training_ready.yaml as shipped: splits by date, static fields, stacked winds, gzip."""
    from pipelines.demo import ensure_demo_data

    monkeypatch.chdir(tmp_path)
    files = ensure_demo_data()
    output = tmp_path / "training_ready"
    assert main(["--config", str(REPO / "configs" / "training_ready.yaml"), "--output", str(output), "--quiet"]) == 0
    source = load_virtual_dataset([p for p in files if p.name.startswith("era5_")], "time")
    source = xr.merge([source, xr.open_dataset(tmp_path / "demo" / "era5" / "invariants.nc").load()])
    schema = load_schema(str(output))
    days = source["time"].dt.floor("D")
    ranges = {
        "train": ("2020-01-01", "2020-01-06"),
        "valid": ("2020-01-07", "2020-01-07"),
        "test": ("2020-01-08", None),
    }
    patches = (source.sizes["lat"] // 8) * (source.sizes["lon"] // 8)
    for split, (first, last) in ranges.items():
        steps = int(((days >= np.datetime64(first)) & (days <= np.datetime64(last or "2100-01-01"))).sum())
        records = read_all_records(output, schema, split)
        assert len(records["t"]) == steps * patches
        assert all(shard.file.endswith(".tfrecord.gz") for shard in schema.splits[split])
        assert schema.feature("wind").shape == schema.feature("mask/wind").shape == (source.sizes["level"], 8, 8, 2)
        assert not records["mask/wind"].any() and not records["mask/t"].any()  # the demo has no NaN to fill
        for i in range(0, len(records["t"]), 17):
            record = {name: values[i] for name, values in records.items()}
            for name in ("t", "orography", "lsm"):
                np.testing.assert_array_equal(record[name], expected_feature(source, schema, name, record))
            at = {d: slice(int(record[f"index/{d}"]), int(record[f"index/{d}"]) + 8) for d in ("lat", "lon")}
            winds = source[["u", "v"]].isel(time=int(record["index/time"]), **at)
            np.testing.assert_array_equal(record["wind"], np.stack([winds["u"].values, winds["v"].values], axis=-1))
            assert first <= str(np.datetime64(int(record["coord/time"]), "s")) < (last or "2100") + "T24"
        if split == "train":  # statistics per level, from the train split, as normalize=True applies them
            normalization = load_stats(str(output))["normalization"]
            for name in ("t", "wind"):  # (level, lat, lon[, channel]): a mean per level [and channel]
                mean = np.squeeze(normalization[name]["mean"])
                np.testing.assert_allclose(mean, records[name].astype(np.float64).mean(axis=(0, 2, 3)), rtol=1e-9)
    assert_matches_source(output, 100)


def test_patches_from_a_multi_file_archive(patches, small_archive):
    parsed = check_output(patches, sorted(small_archive.glob("*.nc")), "time")
    schema = load_schema(str(patches))
    assert parsed["t"].shape[1:] == (3, 9, 9) and schema.feature("t").dims == ("level", "lat", "lon")
    assert schema.feature("t").source["attrs"]["units"] == "K"
    assert parsed["coord/time"].dtype == np.int64 and parsed["coord/lat"].shape[1:] == (9,)
    # Times are seconds since 1970: the first step of the archive is 2020-01-01T00.
    assert parsed["coord/time"].min() == np.datetime64("2020-01-01T00", "s").astype(np.int64)
    # Shuffled: written order is unrelated to archive order.
    assert abs(stats.spearmanr(np.arange(len(parsed["index/time"])), parsed["index/time"]).statistic) < 0.25
    assert len({s.records for s in schema.splits["data"]}) > 1 or len(schema.splits["data"]) == 1


def test_pairs_one_step_apart_span_file_boundaries(small_archive, tmp_path):
    config = patch_config(
        [small_archive / "*.nc"],
        tmp_path / "pairs",
        window={"lat": 9, "lon": 9},
        offsets={"time": [0, 1]},
        keep=["level"],
    )
    output = build(config, tmp_path)
    parsed = check_output(output, sorted(small_archive.glob("*.nc")), "time")
    assert parsed["t"].shape[1:] == (2, 3, 9, 9)
    # 12 steps in files of 4: pairs starting at steps 3 and 7 cross a file boundary.
    assert {3, 7} <= set(parsed["index/time"].tolist())
    assert np.all(np.diff(parsed["coord/time"], axis=1) == 6 * 3600)
    assert len(parsed["t"]) == 11 * 2 * 2


def split_along_time(path: Path, directory: Path, sizes: list[int]) -> list[Path]:
    directory.mkdir(parents=True)
    with xr.open_dataset(path) as ds:
        assert sum(sizes) == ds.sizes["time"]
        paths, start = [], 0
        for i, size in enumerate(sizes):
            part = directory / f"part{len(sizes) - i}.nc"  # names out of time order on purpose
            ds.isel(time=slice(start, start + size)).to_netcdf(part)
            paths.append(part)
            start += size
    return paths


def test_point_time_series_across_files_equals_one_file(tmp_path, sample_file):
    trefht = sample_file("TREFHT.B06.57.atm.1890-1999ANN.nc")
    parts = split_along_time(trefht, tmp_path / "parts", [30, 30, 27, 23])

    def config(paths, output):
        return {
            "input": {"paths": [str(p) for p in paths]},
            "sample": {"window": {"time": {"size": 16, "stride": 5}}},
            "output": {"path": str(output), "num_shards": 2},
        }

    whole = build(config([trefht], tmp_path / "whole"), tmp_path, name="a.yaml")
    split = build(config([tmp_path / "parts" / "*.nc"], tmp_path / "split"), tmp_path, name="b.yaml")
    schema = load_schema(str(split))
    assert schema.feature("TREFHT").shape == (16,) and schema.feature("TREFHT").dims == ("time",)
    assert schema.num_records() == ((110 - 16) // 5 + 1) * 64 * 128 == load_schema(str(whole)).num_records()
    # Same data, same seed: the same bytes, whether the data came in one file or four.
    for shard in schema.splits["data"]:
        assert filecmp.cmp(whole / shard.file, split / shard.file, shallow=False)
    parsed = parse_with_generated_parser(split)
    crossing = parsed["index/time"] == 25  # steps 25..40 span the first two files
    assert crossing.any()
    source = xr.open_dataset(trefht)
    for i in np.flatnonzero(crossing)[:50]:
        record = {name: values[i] for name, values in parsed.items()}
        np.testing.assert_array_equal(record["TREFHT"], expected_feature(source, schema, "TREFHT", record))
    assert sorted(p.name for p in parts) == ["part1.nc", "part2.nc", "part3.nc", "part4.nc"]


@pytest.mark.parametrize(
    ("name", "concat_dim", "sample", "variables", "shape"),
    [
        (
            "eraint_uvz.nc",
            "month",
            {"window": {"latitude": 9, "longitude": 9}, "keep": ["level"]},
            ["z", "u", "v"],
            (3, 9, 9),
        ),
        ("uvt.nc", "time", {"window": {"lat": 8, "lon": 8}, "keep": ["lev"]}, ["U", "V", "T"], (14, 8, 8)),
        (
            "nc4uvt.nc",
            "time",
            {"window": {"lat": 16, "lon": {"size": 16, "stride": 8}}, "keep": ["lev"]},
            ["T", "U", "V"],
            (14, 16, 16),
        ),
    ],
)
def test_real_files(tmp_path, sample_file, name, concat_dim, sample, variables, shape):
    path = sample_file(name)
    config = {
        "input": {"paths": str(path), "concat_dim": concat_dim},
        "sample": sample,
        "output": {"path": str(tmp_path / "o")},
    }
    output = build(config, tmp_path)
    schema = load_schema(str(output))
    # Default variables: every numeric data variable with all the sample dims (not uvt's gw or date).
    assert [f.name for f in schema.variable_features] == variables
    parsed = check_output(output, [path], concat_dim)
    assert parsed[variables[0]].shape[1:] == shape


def test_packed_era_interim_is_decoded_then_stored_as_float32(tmp_path, sample_file):
    config = yaml.safe_load((REPO / "configs" / "erainterim_patches.yaml").read_text())
    config["input"]["paths"] = str(sample_file("eraint_uvz.nc"))
    config["output"]["path"] = str(tmp_path / "eraint")
    output = build(config, tmp_path)
    z = load_schema(str(output)).feature("z")
    assert (z.source["dtype"], z.source["file_dtype"], z.dtype) == ("float64", "int16", "float32")
    assert "float32" in z.source["stored_as"]
    # 241 latitudes in windows of 9: 26 windows; 480 longitudes: 53; 2 months.
    assert load_schema(str(output)).num_records() == 2 * 26 * 53


def test_reruns_give_identical_bytes_and_seeds_reorder(patches, small_archive, tmp_path):
    """The runner modes (threads, processes, in memory) give identical bytes too: test_reproducible.py."""
    config = patch_config([small_archive / "*.nc"], tmp_path / "again")
    again = build(config, tmp_path)
    reseeded = build(config, tmp_path, "--output", str(tmp_path / "seed1"), "--seed", "1")
    names = [s.file for s in load_schema(str(patches)).splits["data"]]
    for name in names:
        assert (again / name).read_bytes() == (patches / name).read_bytes()
    a = read_all_records(patches, load_schema(str(patches)))
    b = read_all_records(reseeded, load_schema(str(reseeded)))
    key = ("index/time", "index/lat", "index/lon")
    order_a = [tuple(a[k][i] for k in key) for i in range(len(a["t"]))]
    order_b = [tuple(b[k][i] for k in key) for i in range(len(b["t"]))]
    assert sorted(order_a) == sorted(order_b) and order_a != order_b
    assert load_schema(str(reseeded)).seed == 1


def test_existing_output_is_refused_without_overwrite(patches, small_archive, tmp_path, capsys):
    config = patch_config([small_archive / "*.nc"], patches)
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(config))
    assert main(["--config", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"error: output: {patches} already exists; pass --overwrite to replace it, or choose another path"
    assert main(["--config", str(path), "--overwrite"]) == 0
    assert not (patches / "_tmp").exists()
    assert load_schema(str(patches)).num_records() == 12 * 2 * 2


def test_a_local_dry_run_plans_and_checks_the_graph_but_runs_and_writes_nothing(small_archive, tmp_path, capsys):
    output = tmp_path / "dry"
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(patch_config([small_archive / "*.nc"], output)))
    assert main(["--config", str(path), "--dry_run=True"]) == 0
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    assert lines[0] == "Dry run: the job graph for 48 samples was built and validated; nothing was run.", lines
    assert lines[1].startswith("  plan: data: 48 samples in 3 shard(s); ") and "from 3 file(s)" in lines[1], lines
    # The stages apart: the streamed graph's one combine would carry megabytes through the local runner's
    # GroupByKey, which its threads garble (pipelines.graph).
    assert lines[2] == "  graph: EnumerateUnits -> SpreadUnits -> CutSamples -> (WriteShards, ComputeStats) -> Finalize"
    assert not captured.err and not output.exists()


_REFUSED_AND_DRY = """
import sys
from pipelines.build import main
config = sys.argv[1]
codes = [main(["--config", config, "--quiet", "--input", sys.argv[2]])]  # refused by planning: no such file
codes.append(main(["--config", config, "--quiet", "--dry_run=True"]))
print(codes)
"""


def test_refused_and_dry_runs_leave_nothing_in_the_temp_directory(small_archive, tmp_path):
    """Beam makes a folder in the temp directory per pipeline that only its run removes: runs that end
    otherwise (refused, dry) must not leave one behind each time (thousands, on a shared machine)."""
    path, temp = tmp_path / "c.yaml", tmp_path / "temp"
    path.write_text(yaml.safe_dump(patch_config([small_archive / "*.nc"], tmp_path / "out")))
    temp.mkdir()
    run = subprocess.run(
        [sys.executable, "-c", _REFUSED_AND_DRY, str(path), str(tmp_path / "missing.nc")],
        cwd=REPO,
        env={**os.environ, "TMPDIR": str(temp)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0 and run.stdout.splitlines()[-1] == "[2, 0]", (run.stdout, run.stderr[-2000:])
    assert "missing.nc" in run.stderr
    left = sorted(p.name for p in temp.iterdir() if not p.name.startswith("xarray-tfrecords-locks-"))
    assert left == []


def test_duplicate_config_keys_are_refused_in_one_line(small_archive, tmp_path, capsys):
    path = tmp_path / "c.yaml"
    lines = yaml.safe_dump(patch_config([small_archive / "*.nc"], tmp_path / "out")).splitlines()
    path.write_text("\n".join([*lines, "output: {path: elsewhere}", ""]))
    assert main(["--config", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"error: {path}: duplicate key 'output' at line {len(lines) + 1}, column 1 "
        f"(first at line {lines.index('output:') + 1}); "
        "YAML would keep only the last: remove one"
    )


def test_two_outputs_load_side_by_side_in_one_process(patches, small_archive, tmp_path):
    """The summary's and the README's ways of loading cannot hand one output's data for another's."""
    import importlib.util

    from schemas import load_dataset

    config = patch_config([small_archive / "*.nc"], tmp_path / "other", window={"lat": 4, "lon": 6}, keep=["level"])
    other = build(config, tmp_path)
    shapes = {}
    for output in (patches, other):
        batch = next(iter(load_dataset(str(output), "data", batch_size=4)))
        spec = importlib.util.spec_from_file_location(f"parser_of_{output.parent.name}", output / "parser.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        alone = next(iter(module.make_dataset("data", batch_size=4)))
        assert alone["t"].shape == batch["t"].shape
        shapes[output] = tuple(batch["t"].shape)
    assert shapes == {patches: (4, 3, 9, 9), other: (4, 3, 4, 6)}


def test_an_output_path_with_spaces_is_written_and_read_back(small_archive, tmp_path):
    output = build(patch_config([small_archive / "*.nc"], tmp_path / "my outputs" / "run 1"), tmp_path)
    assert load_schema(str(output)).num_records() == 12 * 2 * 2


def test_progress_markers_are_written_only_for_a_progress_line_to_read(small_archive, tmp_path, monkeypatch):
    """A marker file for each unit and shard is what the live line sums up; with --quiet nothing reads them."""
    from planning.run import progress

    written = []
    write_marker = progress._write_text
    monkeypatch.setattr(progress, "_write_text", lambda path, text: (written.append(path), write_marker(path, text)))
    config = patch_config([small_archive / "*.nc"], tmp_path / "quiet")
    build(config, tmp_path, "--quiet")
    assert written == []
    config["output"]["path"] = str(tmp_path / "shown")
    build(config, tmp_path)
    schema = load_schema(str(tmp_path / "shown"))
    units = [path for path in written if os.path.basename(path).startswith("unit-")]
    assert len(units) >= 2 and len(written) == len(units) + len(schema.splits["data"])  # and one for each shard
    assert filecmp.cmp(
        tmp_path / "quiet" / schema.splits["data"][0].file,
        tmp_path / "shown" / schema.splits["data"][0].file,
        shallow=False,
    )
