"""Config validation: each mistake gives one line naming the key and the fix."""

from __future__ import annotations

import pytest
import yaml

from pipelines.demo import DEMO_CONFIG
from planning.config import load_config, parse_config, read_yaml, with_absolute_paths
from schemas.errors import UserError

from conftest import REPO

BASE = {"input": {"paths": "x/*.nc"}, "output": {"path": "out"}}


def _error(data) -> str:
    with pytest.raises(UserError) as info:
        parse_config(data, "c.yaml")
    message = str(info.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"sampel": {}}, "c.yaml: sampel: unknown key"),
        (
            {"sample": {"window": {"lat": {"size": 0}}}},
            "sample.window.lat.size: Input should be greater than 0 (got 0)",
        ),
        ({"sample": {"window": {"lat": {"size": 3, "stride": -1}}}}, "sample.window.lat.stride"),
        ({"sample": {"window": {"lat": 9}, "keep": ["lat"]}}, "dim 'lat' is in both sample.window and sample.keep"),
        ({"sample": {"offsets": {"time": [0, 1], "lat": [0, 1]}}}, "offsets are allowed along one dim only"),
        ({"sample": {"offsets": {"time": [0, 0]}}}, "offsets [0, 0] repeat a step"),
        ({"shuffle": {"seed": "abc"}}, "shuffle.seed"),
        ({"shuffle": {"mode": "both"}}, "shuffle.mode: Input should be 'write' or 'read' (got 'both')"),
        (
            {"shuffle": {"mode": "read"}, "output": {"path": "o", "compression": "gzip"}},
            "shuffle.mode: read needs each shard's record index for the readers' global order, and a gzip shard has "
            "none; drop output.compression, or use shuffle.mode: write",
        ),
        (
            {"shuffle": {"mode": "read"}, "output": {"path": "o", "examples_per_record": 8}},
            "shuffle.mode: read needs one sample a record",
        ),
        ({"variables": []}, "variables: Value error"),
        ({"output": {}}, "output.path: required key is missing"),
        ({"output": {"path": "o", "dtype": "float16"}}, "holds floats as float32 only, so float16 cannot be stored"),
        ({"output": {"path": "o", "examples_per_record": 0}}, "output.examples_per_record"),
        ({"output": {"path": "o", "compression": "zstd"}}, "output.compression"),
        ({"nan_policy": "fill"}, "nan_policy: fill needs a fill_value"),
        ({"fill_value": 0}, "fill_value is set but nan_policy is keep"),
        ({"nan_mask": True}, "nan_mask marks the values nan_policy: fill filled, but nan_policy is keep"),
        ({"nan_policy": "drop", "nan_mask": ["t"]}, "but nan_policy is drop: set nan_policy: fill"),
        ({"splits": {"train": {"lat": [0, 10]}}}, "splits.train: give one range along 'time'"),
        ({"splits": {"a-b": {"time": ["2000", "2001"]}}}, "'a-b' is not a plain name"),
        ({"splits": {"train": {"time": ["2000"]}}}, "splits.train.time: give [start, end]"),
        ({"layout": {"stack": [{"name": "x", "variables": ["t"]}, {"name": "y", "variables": ["t"]}]}}, "once"),
        ({"layout": {"stack": {"name": "x", "variables": ["t"], "axis": 2}}}, "layout.stack.0.axis"),
        ({"layout": {"stack": {"name": "", "variables": ["t"]}}}, "c.yaml: layout.stack.name: empty name"),
        ({"variables": ["t", " "]}, "c.yaml: variables.1: empty name"),
        ({"shuffle": {"seed": 2**64}}, "shuffle.seed: Input should be less than 18446744073709551616"),
        ({"output": {"path": "out/a::b"}}, "output.path: '::' chains URLs in fsspec"),
        ({"output": {"path": "out/g[1]"}}, "output.path: *, ?, [ and ] are glob patterns"),
        ({"input": {"paths": "x", "calendar": "365_days"}}, "input.calendar: unknown calendar '365_days'"),
        (
            {"input": {"paths": "x", "calendar": "noleap", "decode_times": False}},
            "input: calendar is only used to decode times: drop it, or set decode_times: true",
        ),
        ({"sample": {"offsets": {"lev": [14, 16]}}}, "offsets [14, 16] do not include 0; they are steps relative"),
        ({"select": {"lat": {}}}, "select: lat: give min, max or both"),
        ({"select": {"lat": {"min": 1, "mx": 2}}}, "select: lat: mx: unknown key"),
        ({"select": {"level": []}}, "select: level: an empty list selects nothing"),
        ({"select": {"level": [500, 500]}}, "select: level: a value is listed twice"),
        ({"input": {"paths": "x", "coord_tolerance": -1}}, "input.coord_tolerance: give float32 (the default), or a"),
        ({"input": {"paths": "x", "coord_tolerance": "float64"}}, "input.coord_tolerance: give float32"),
        ({"input": {"paths": "x", "coord_tolerance": float("inf")}}, "input.coord_tolerance: give float32 (the de"),
        (
            {"input": {"paths": "x", "coord_tolerance": float("nan")}},
            "coord_tolerance: give float32 (the default), or a",
        ),
    ],
)
def test_mistakes_name_the_key(change, expected):
    message = _error({**BASE, **change})
    assert expected.replace("Value error", "") in message


def test_split_dates_yaml_reads_as_dates_stay_the_text_written():
    text = "splits: {train: {time: [1890-01-01, 1969-12-31T12:00:00]}, test: {time: [1970, null]}}"
    config = parse_config({**BASE, **yaml.safe_load(text)})
    assert config.splits == {"train": {"time": ["1890-01-01", "1969-12-31T12:00:00"]}, "test": {"time": [1970, None]}}


@pytest.mark.parametrize("calendar", ["noleap", "365_day", "360_day", "NoLeap", "julian", "all_leap", "standard"])
def test_every_cftime_calendar_is_accepted(calendar):
    config = parse_config({**BASE, "input": {"paths": "x", "calendar": calendar}})
    assert (config.input.calendar, config.input.decode_times) == (calendar, True)


def test_window_size_shorthand_and_default_stride():
    config = parse_config({**BASE, "sample": {"window": {"lat": 9, "time": {"size": 4, "stride": 2}}}})
    assert (config.sample.window["lat"].size, config.sample.window["lat"].step) == (9, 9)
    assert config.sample.window["time"].step == 2
    assert config.input.paths == ["x/*.nc"]


def test_command_line_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(BASE))
    config = load_config(path, input=["a.nc", "b.nc"], output="elsewhere", seed=5)
    assert (config.input.paths, config.output.path, config.shuffle.seed) == (["a.nc", "b.nc"], "elsewhere", 5)


def test_yaml_syntax_error_names_the_line(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("input:\n  paths: [a\noutput: {path: o}\n")
    with pytest.raises(UserError, match=r"bad.yaml: YAML syntax error at line 3"):
        load_config(path)


def test_a_yaml_alias_bomb_is_refused_before_it_expands(tmp_path):
    """600 bytes that expand to 9**9 values: refused in one short line, quickly, in little memory."""
    levels = ["a: &a [x, x, x, x, x, x, x, x, x]"]
    for level in "bcdefghi":
        previous = levels[-1].split("&")[1][0]
        levels.append(f"{level}: &{level} [{', '.join(['*' + previous] * 9)}]")
    path = tmp_path / "bomb.yaml"
    path.write_text("\n".join([*levels, "variables: *i", "input: {paths: x.nc}", "output: {path: o}"]) + "\n")
    with pytest.raises(UserError) as info:
        load_config(path)
    assert str(info.value) == (
        f"{path}: expands to more than 100,000 values through YAML aliases (*name); write the values out"
    )


def test_coord_tolerance_from_yaml_must_be_finite(tmp_path):
    path = tmp_path / "c.yaml"
    for text in (".inf", ".nan", "-.inf"):
        path.write_text(f"input: {{paths: x.nc, coord_tolerance: {text}}}\noutput: {{path: o}}\n")
        with pytest.raises(
            UserError, match=r"c.yaml: input.coord_tolerance: give float32 \(the default\), or a finite"
        ):
            load_config(path)
    path.write_text("input: {paths: x.nc, coord_tolerance: 1.0e-3}\noutput: {path: o}\n")
    assert load_config(path).input.coord_tolerance == 1e-3


def test_duplicate_yaml_keys_are_refused_naming_the_key_and_both_lines(tmp_path):
    path = tmp_path / "dup.yaml"
    path.write_text("input: {paths: a.nc}\noutput: {path: o}\ninput:\n  paths: b.nc\n")
    with pytest.raises(UserError) as info:
        load_config(path)
    assert str(info.value) == (
        f"{path}: duplicate key 'input' at line 3, column 1 (first at line 1); "
        "YAML would keep only the last: remove one"
    )
    path.write_text("input: {paths: a.nc}\noutput:\n  path: o\n  path: p\n")
    with pytest.raises(UserError, match=r"duplicate key 'path' at line 4, column 3 \(first at line 3\)"):
        load_config(path)


def test_yaml_merge_keys_may_be_overridden(tmp_path):
    path = tmp_path / "merge.yaml"
    path.write_text("base: &b {paths: a.nc, concat_dim: month}\ninput: {<<: *b, paths: b.nc}\n")
    assert read_yaml(path)["input"] == {"paths": "b.nc", "concat_dim": "month"}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("x: " + "[" * 3000 + "]" * 3000, "nested more than 100 levels deep at line 1, column 103"),
        ("x: " + "{a: " * 3000 + "1" + "}" * 3000, "nested more than 100 levels deep at line 1, column 397"),
        # Aliases repeat their anchor's depth: two of 60 levels nest 120 deep.
        ("a: &a " + "[" * 60 + "1" + "]" * 60 + "\nb: " + "[" * 60 + "*a" + "]" * 60, "at line 2, column 64"),
        ("a: &a [1, *a]", "YAML alias *a at line 1, column 11 is inside the value it names"),
    ],
)
def test_deep_or_endless_yaml_is_refused_in_one_line(tmp_path, text, expected):
    path = tmp_path / "deep.yaml"
    path.write_text(text + "\n")
    with pytest.raises(UserError) as info:
        load_config(path)
    assert expected in str(info.value) and str(info.value).startswith(f"{path}: ")
    assert "\n" not in str(info.value)


def test_a_config_that_is_not_utf8_or_too_large_is_refused_in_one_line(tmp_path):
    latin = tmp_path / "latin.yaml"
    latin.write_bytes("input: {paths: caf\xe9.nc}\noutput: {path: o}\n".encode("latin-1"))
    with pytest.raises(UserError, match=r"latin.yaml: not UTF-8 text \(byte 0xe9 at offset 18\); save it as UTF-8"):
        load_config(latin)
    huge = tmp_path / "huge.yaml"
    huge.write_text("# " + "x" * 2_000_000 + "\n")
    with pytest.raises(UserError, match=r"huge.yaml: 2,000,003 bytes is too large for a config"):
        load_config(huge)


def test_a_home_relative_path_means_the_home_directory(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    config = parse_config({"input": {"paths": "~/era5/*.nc"}, "output": {"path": "~"}})
    assert (config.input.paths, config.output.path) == ([f"{tmp_path}/era5/*.nc"], str(tmp_path))
    spaced = parse_config({"input": {"paths": "x.nc"}, "output": {"path": "my outputs/run 1"}})
    assert spaced.output.path == "my outputs/run 1"


def test_yaml_is_loaded_safely(tmp_path):
    path = tmp_path / "evil.yaml"
    path.write_text("input: !!python/object/apply:os.system ['echo pwned']\noutput: {path: o}\n")
    with pytest.raises(UserError, match=r"evil\.yaml: YAML"):
        load_config(path)


@pytest.mark.parametrize("name", sorted(p.name for p in (REPO / "configs").glob("*.yaml")))
def test_shipped_configs_are_valid(name):
    load_config(REPO / "configs" / name)


def test_demo_yaml_is_the_built_in_demo():
    assert yaml.safe_load((REPO / "configs" / "demo.yaml").read_text()) == DEMO_CONFIG


def test_relative_local_paths_become_absolute_for_cluster_workers(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    data = {"input": {"paths": ["in/*.nc", "gs://b/x/*.nc", "/abs/*.nc"]}, "output": {"path": "out"}}
    config = with_absolute_paths(parse_config(data))
    assert config.input.paths == [f"{tmp_path}/in/*.nc", "gs://b/x/*.nc", "/abs/*.nc"]
    assert config.output.path == f"{tmp_path}/out"
    assert with_absolute_paths(parse_config({**data, "output": {"path": "gs://b/out"}})).output.path == "gs://b/out"


def test_select_forms_and_tolerance():
    import datetime

    select = {"level": 500, "lat": {"min": 30}, "time": {"min": datetime.date(2000, 1, 1), "max": 2010}}
    config = parse_config({**BASE, "select": select, "input": {"paths": "x", "coord_tolerance": 0}})
    assert config.select["level"] == [500]  # one value is a list of one
    assert (config.select["lat"].min, config.select["lat"].max) == (30, None)
    assert (config.select["time"].min, config.select["time"].max) == ("2000-01-01", 2010)  # YAML's dates as text
    assert config.input.coord_tolerance == 0 and parse_config(BASE).input.coord_tolerance == "float32"
    assert parse_config({**BASE, "sample": {"offsets": {"time": [-1, 0]}}}).sample.offsets == {"time": [-1, 0]}


@pytest.mark.parametrize(
    ("names", "expected"),
    [
        (["u"], "nan_mask: 'u' is not a float variable or stack of the records; it is stacked in 'wind': list 'wind'"),
        (["cls"], "'cls' is not a float variable or stack of the records; it holds integers, which are never NaN"),
        (["index/time"], "the float variables and stacks are: t, wind"),
    ],
)
def test_nan_mask_names_a_float_feature(names, expected):
    from planning.features import mask_features
    from planning.run.variables import StackPlan
    from schemas.schema import Feature

    def variable(name, dtype="float32"):
        return Feature(name, dtype, (2,), ("x",), "variable")

    wind = StackPlan(Feature("wind", "float32", (2, 2), ("x", "channel"), "variable"), ("u", "v"), -1)
    features = [variable("t"), wind.feature, variable("cls", "int64"), Feature("index/time", "int64", (), (), "index")]
    config = parse_config({**BASE, "nan_policy": "fill", "fill_value": 0.0, "nan_mask": names}, "c.yaml")
    with pytest.raises(UserError) as info:
        mask_features(config, features, [wind])
    assert expected in str(info.value) and str(info.value).startswith("nan_mask: ")
    every = mask_features(
        parse_config({**BASE, "nan_policy": "fill", "fill_value": 0.0, "nan_mask": True}), features, [wind]
    )
    assert [(f.name, f.shape, f.dtype, f.role) for f in every] == [
        ("mask/t", (2,), "int64", "mask"),
        ("mask/wind", (2, 2), "int64", "mask"),
    ]
