"""End to end: ``python -m pipelines.inspect`` describes, verifies and plots outputs the build wrote."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import fsspec
import pytest
import yaml

from pipelines.build import main as build_main
from pipelines.inspect import main
from schemas import load_schema

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def build(tmp: Path, config: dict) -> Path:
    path = tmp / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    assert build_main(["--config", str(path)]) == 0
    return Path(config["output"]["path"])


@pytest.fixture(scope="module")
def patches(small_archive, tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("inspect_patches")
    config = {
        "input": {"paths": str(small_archive / "*.nc"), "concat_dim": "time"},
        "variables": ["t", "u", "z"],
        "sample": {"window": {"lat": 9, "lon": 9}, "keep": ["level"]},
        "output": {"path": str(tmp / "out"), "num_shards": 3},
    }
    return build(tmp, config)


@pytest.fixture(scope="module")
def series(small_archive, tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("inspect_series")
    config = {
        "input": {"paths": str(small_archive / "*.nc"), "concat_dim": "time"},
        "variables": ["t"],
        "sample": {"window": {"time": {"size": 6, "stride": 3}}},
        "output": {"path": str(tmp / "out"), "num_shards": 2},
    }
    return build(tmp, config)


@pytest.fixture
def damaged(patches, tmp_path) -> Path:
    """A copy of the patches output to break."""
    return Path(shutil.copytree(patches, tmp_path / "copy"))


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_summary_names_every_feature_split_and_statistic(patches, capsys):
    code, out, err = run(capsys, str(patches))
    assert code == 0 and err == ""
    schema = load_schema(str(patches))
    for feature in schema.features:
        assert f"\n  {feature.name} " in out
    assert f"data: {schema.num_examples()} samples in 3 shard(s)" in out
    assert "shuffle seed 0" in out and "level: kept whole (3)" in out and "Config (resolved, as built)" in out
    statistics = out.split("Statistics (stats.json")[1]
    for name in ("t", "u", "z"):
        assert f"\n  {name} " in statistics
    assert " K " in out  # units of t


def test_verify_passes_on_a_complete_output(patches, series, capsys):
    for output in (patches, series):
        code, out, err = run(capsys, str(output), "--verify")
        assert code == 0 and err == ""
        assert out.startswith(f"OK: {output}: ") and out.count("\n") == 1


def _first_shard(output: Path) -> Path:
    return output / load_schema(str(output)).splits["data"][0].file


def _first_count(output: Path) -> int:
    return load_schema(str(output)).splits["data"][0].records


def _truncate(output: Path) -> str:
    shard = _first_shard(output)
    shard.write_bytes(shard.read_bytes()[:-100])
    return f"{shard}: record {_first_count(output) - 1}: truncated data"


def _delete(output: Path) -> str:
    shard = _first_shard(output)
    shard.unlink()
    return f"{shard}: missing, but schema.json lists it"


def _extra_file(output: Path) -> str:
    extra = output / "data-00007-of-00008.tfrecord"
    shutil.copy(_first_shard(output), extra)
    return f"{extra}: shard file not listed in schema.json"


def _extra_wide_file(output: Path) -> str:
    """A stray shard of a generation of 100,000 shards or more: its numbers are wider than five digits."""
    extra = output / "data-123456-of-200000.tfrecord"
    shutil.copy(_first_shard(output), extra)
    return f"{extra}: shard file not listed in schema.json"


def _extra_record(output: Path) -> str:
    shard = _first_shard(output)
    data, n = shard.read_bytes(), _first_count(output)
    first = 12 + int.from_bytes(data[:8], "little") + 4  # header, data, footer of the first record
    shard.write_bytes(data + data[:first])
    return f"{shard}: {n + 1} records, but schema.json says {n}"


def _count_in_schema(output: Path) -> str:
    from synthetic_output import rewrite_counts

    n = _first_count(output)
    rewrite_counts(output, lambda counts: counts["records"].__setitem__(0, n + 1))  # (schema.json's totals too)
    return f"{_first_shard(output)}: {n} records, but schema.json says {n + 1}"


def _flip_a_byte(output: Path) -> str:
    shard = _first_shard(output)
    data = bytearray(shard.read_bytes())
    data[5000] ^= 0xFF
    shard.write_bytes(bytes(data))
    return f"{shard}: record "


def _edit_feature(output: Path, **change) -> dict:
    path = output / "schema.json"
    schema = json.loads(path.read_text())
    feature = next(f for f in schema["features"] if f["name"] == "t")
    feature.update(change)
    path.write_text(json.dumps(schema))
    return feature


def _shape_in_schema(output: Path) -> str:
    """The same number of values (3 x 9 x 9), so records still decode: only the sample's axes tell."""
    _edit_feature(output, shape=[3, 27, 3])
    return f"{output / 'schema.json'}: feature 't' is 27 long along 'lat' (shape [3, 27, 3]), but sample.axes (window)"


def _iterated_dim_in_schema(output: Path) -> str:
    _edit_feature(output, dims=["time", "lat", "lon"])
    return f"{output / 'schema.json'}: feature 't' has dim 'time', which sample.axes iterates"


def _shape_without_dims(output: Path) -> str:
    _edit_feature(output, shape=[3, 81])
    return f"{output / 'schema.json'}: not a valid schema (feature 't': shape (3, 81) does not match dims"


@pytest.mark.parametrize(
    "damage",
    [
        _truncate,
        _delete,
        _extra_file,
        _extra_wide_file,
        _extra_record,
        _count_in_schema,
        _flip_a_byte,
        _shape_in_schema,
        _iterated_dim_in_schema,
        _shape_without_dims,
    ],
)
def test_verify_fails_with_one_line_naming_the_shard(damaged, capsys, damage):
    expected = damage(damaged)
    code, out, err = run(capsys, str(damaged), "--verify")
    assert code == 1 and out == ""
    assert err.startswith(f"error: {expected}") and err.endswith("\n") and err.count("\n") == 1, err
    assert "build the output again" in err or "--overwrite" in err


def test_plots_patches_with_map_and_time_series(patches, series, tmp_path, capsys):
    for output, extra in (
        (patches, ["--map", "--samples", "2"]),
        (series, ["--map", "--samples", "2"]),
        (series, ["--samples", "1"]),
    ):
        png = tmp_path / f"{output.parent.name}{len(extra)}.png"
        code, out, err = run(capsys, str(output), "--plot", str(png), *extra)
        assert code == 0 and err == "" and out == f"Wrote {png}\n"
        data = png.read_bytes()
        assert data.startswith(PNG_SIGNATURE) and len(data) > 20_000


def test_errors_are_one_line_with_the_path_and_the_fix(tmp_path, patches, capsys):
    code, _, err = run(capsys, str(tmp_path / "nothing"))
    assert code == 2 and err.count("\n") == 1
    assert err.startswith(f"error: {tmp_path / 'nothing'}: no schema.json") and "build it again" in err
    code, _, err = run(capsys, str(patches), "--split", "train")
    assert code == 2 and err == f"error: {patches}: no split 'train'; it has: data; choose one of those\n"


def test_help_is_fast_because_heavy_modules_load_lazily():
    check = "import sys, pipelines.inspect; print(sorted({'numpy', 'matplotlib', 'apache_beam'} & set(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "[]", result.stderr


def test_summary_and_verify_go_through_fsspec(patches, capsys):
    memory = fsspec.filesystem("memory")
    for path in patches.iterdir():
        memory.pipe(f"/xtf-inspect/{path.name}", path.read_bytes())
    try:
        code, out, _ = run(capsys, "memory://xtf-inspect", "--verify")
        assert code == 0 and out.startswith("OK: memory://xtf-inspect: ")
        code, out, _ = run(capsys, "memory://xtf-inspect")
        assert code == 0 and "t  " in out and "Statistics (stats.json, split data" in out
        memory.rm(f"/xtf-inspect/{load_schema(str(patches)).splits['data'][1].file}")
        code, _, err = run(capsys, "memory://xtf-inspect", "--verify")
        assert code == 1 and err.startswith("error: memory://xtf-inspect/data-00001-of-00003.tfrecord: missing")
    finally:
        memory.rm("/xtf-inspect", recursive=True)


def test_plots_names_and_units_with_dollar_signs(tmp_path, capsys):
    """A "$" is TeX to matplotlib; names and units are drawn as written."""
    import numpy as np
    import pandas as pd
    import xarray as xr

    time = pd.date_range("2000-01-01", periods=4, freq="D")
    values = np.random.default_rng(0).normal(size=(4, 6, 6)).astype("f4")
    price = xr.DataArray(values, dims=("time", "lat", "lon"), attrs={"units": "$$ per MWh", "long_name": "cost in $"})
    xr.Dataset({"price$": price}, coords={"time": time}).to_netcdf(tmp_path / "prices.nc")
    output = build(
        tmp_path,
        {
            "input": {"paths": str(tmp_path / "prices.nc")},
            "sample": {"window": {"lat": 3, "lon": 3}},
            "output": {"path": str(tmp_path / "out")},
        },
    )
    capsys.readouterr()  # the build's summary
    png = tmp_path / "prices.png"
    code, out, err = run(capsys, str(output), "--plot", str(png), "--samples", "2")
    assert code == 0 and err == "" and out == f"Wrote {png}\n"
    assert png.read_bytes().startswith(PNG_SIGNATURE)


def test_summary_escapes_control_characters_from_the_files(damaged, capsys):
    """Attributes come from the input files: an escape sequence would clear the screen or forge a line."""
    path = damaged / "schema.json"
    schema = json.loads(path.read_text())
    hostile = "Temperature\x1b[2J\x1b]0;title\x07\nerror: forged line\r\u202eevil"
    schema["features"][0]["source"]["attrs"].update(long_name=hostile, units="K\x9b31m")
    path.write_text(json.dumps(schema))
    code, out, err = run(capsys, str(damaged))
    assert code == 0 and err == ""
    assert not [ch for ch in out if ch != "\n" and (ord(ch) < 32 or 0x7F <= ord(ch) < 0xA0 or ch == "\u202e")]
    assert "Temperature\\x1b[2J\\x1b]0;title\\x07\\nerror: forged line\\r\\u202eevil" in out
    assert "K\\x9b31m" in out
    assert "\nerror: forged line" not in out
