"""The README stays true: its walkthrough runs as written, its config reference matches the code."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import yaml

from pipelines.build import main
from pipelines.config_reference import END, START, config_reference
from schemas import load_schema

from conftest import REPO
from helpers import run_warm

README = (REPO / "README.md").read_text()


def _block(marker: str) -> str:
    match = re.search(rf"<!-- {marker} -->\n```\w*\n(.*?)```", README, re.S)
    assert match, f"README has no block marked {marker}"
    return match.group(1)


def test_config_reference_is_generated_from_the_config_model():
    embedded = README.split(START, 1)[1].split(END, 1)[0]
    assert embedded.strip() == config_reference().strip(), "run: python -m pipelines.config_reference --write README.md"


def test_walkthrough_runs_as_written(tmp_path, sample_file):
    source = sample_file("eraint_uvz.nc")  # the real file when shared data has it, else the stand-in
    output = str(tmp_path / "erainterim")
    for line in _block("walkthrough:shell").strip().splitlines():
        command = line.replace("out/erainterim", output).split()
        assert command[:2] == ["python", "-m"]
        if command[2] == "pipelines.build":  # instead of the config's data/eraint_uvz.nc (see the next test)
            command += ["--input", str(source)]
        # Forked from a warmed interpreter (helpers.run_warm): the commands' work, not their imports;
        # the training script below, and test_imports_on_demand, run in fresh interpreters.
        result = run_warm([sys.executable, *command[1:]], cwd=REPO, timeout=600)
        assert result.returncode == 0, f"{line}\n{result.stdout}\n{result.stderr}"
    assert (tmp_path / "erainterim.png").stat().st_size > 50_000
    schema = load_schema(output)  # "1,378 patches each: 26 x 53 per month"
    assert {name: schema.num_examples(name) for name in schema.splits} == {"train": 1378, "valid": 1378}
    # Then the README's two ways to read an output with TensorFlow, on this one (its first split).
    reading = _block("reading:tensorflow").replace("out/patches", output).replace('"data"', '"train"')
    script = tmp_path / "walkthrough.py"
    script.write_text(_block("walkthrough:python").replace("out/erainterim", output) + reading + "\nprint('trained')\n")
    result = subprocess.run([sys.executable, str(script)], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0 and result.stdout.strip().endswith("trained"), result.stderr[-3000:]
    assert "AutoGraph could not transform" not in result.stderr, result.stderr[-3000:]


def _fake_python(tmp_path):
    """A `bin/` whose `python` is this interpreter, venv and all: what `python` in a block means."""
    (tmp_path / "bin").mkdir(exist_ok=True)
    python = tmp_path / "bin" / "python"
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    return f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}"


def test_walkthrough_standin_is_written_where_the_config_reads_it(tmp_path):
    """Offline: the command the walkthrough gives instead of the download writes the tests' stand-in."""
    from pipelines.demo import write_eraint_standin

    checkout = tmp_path / "checkout"
    checkout.mkdir()
    env = {**os.environ, "PATH": _fake_python(tmp_path), "PYTHONPATH": str(REPO)}
    for line in _block("walkthrough:standin").strip().splitlines():
        result = subprocess.run(["bash", "-c", line], cwd=checkout, env=env, capture_output=True, text=True)
        assert result.returncode == 0 and not result.stderr, f"{line}\n{result.stdout}\n{result.stderr}"
    written = (checkout / "data" / "eraint_uvz.nc").read_bytes()
    assert written == write_eraint_standin(tmp_path / "expected.nc").read_bytes()
    assert 'paths: "data/eraint_uvz.nc"' in (REPO / "configs" / "erainterim_patches.yaml").read_text()
    assert not list((checkout / "data").glob("*.tmp"))


def test_the_standin_command_refuses_an_unwritable_path_in_one_line(tmp_path, capsys):
    from pipelines.demo import main

    (tmp_path / "file").write_text("")
    assert main(["--eraint-standin", str(tmp_path / "file" / "eraint_uvz.nc")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {tmp_path / 'file' / 'eraint_uvz.nc'}: cannot write it") and err.count("\n") == 1


def test_the_standin_command_without_scipy_says_what_to_install(tmp_path, capsys, monkeypatch):
    from pipelines.demo import main

    monkeypatch.setitem(sys.modules, "scipy", None)  # as if scipy were not installed
    assert main(["--eraint-standin", str(tmp_path / "eraint_uvz.nc")]) == 2
    err = capsys.readouterr().err
    assert "pip install scipy" in err and err.count("\n") == 1
    assert not list(tmp_path.iterdir())


# Stands in for pooch (what xarray.tutorial downloads with): "downloads" the sample file into the cache.
FAKE_POOCH = """
import logging, os, shutil

def get_logger():
    return logging.getLogger("pooch")

def os_cache(project):
    return os.path.join(os.environ["FAKE_POOCH_CACHE"], project)

class HTTPDownloader:
    def __init__(self, **kwargs):
        pass

def retrieve(url, known_hash=None, path=None, downloader=None, **kwargs):
    assert url.endswith("/eraint_uvz.nc"), url
    os.makedirs(path, exist_ok=True)
    target = os.path.join(path, "0123abcd-eraint_uvz.nc")
    shutil.copyfile(os.environ["FAKE_POOCH_SOURCE"], target)
    return target
"""


def test_walkthrough_download_puts_the_file_where_the_config_reads_it(tmp_path, sample_file):
    """The download step works as written with the pinned xarray (offline: pooch is faked)."""
    source = sample_file("eraint_uvz.nc")
    (tmp_path / "fake").mkdir()
    (tmp_path / "fake" / "pooch.py").write_text(FAKE_POOCH)
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    env = {
        **os.environ,
        "PATH": _fake_python(tmp_path),
        "PYTHONPATH": str(tmp_path / "fake"),
        "FAKE_POOCH_CACHE": str(tmp_path / "cache"),
        "FAKE_POOCH_SOURCE": str(source),
    }
    for line in _block("walkthrough:download").strip().splitlines():
        if line == "pip install pooch":
            continue
        result = subprocess.run(["bash", "-c", line], cwd=checkout, env=env, capture_output=True, text=True)
        assert result.returncode == 0, f"{line}\n{result.stdout}\n{result.stderr}"
    config = (REPO / "configs" / "erainterim_patches.yaml").read_text()
    assert 'paths: "data/eraint_uvz.nc"' in config
    assert (checkout / "data" / "eraint_uvz.nc").read_bytes() == source.read_bytes()
    assert 'input: {paths: "data/eraint_uvz.nc"' in README  # the config as the README shows it


TREFHT = "TREFHT.B06.57.atm.1890-1999ANN.nc"  # CCSM annual means 1890-1999, 64 x 128: counts in noleap, says none


def _example_config(marker: str, tmp_path) -> dict:
    """The README's config block, its relative paths under tmp_path, with an output there."""
    config = yaml.safe_load(_block(marker))
    config["input"]["paths"] = str(tmp_path / config["input"]["paths"])
    return config | {"output": {"path": str(tmp_path / "out")}}


def _run(config: dict, tmp_path, capsys, *flags: str) -> str:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    assert main(["--config", str(path), "--quiet", *flags]) == 0
    captured = capsys.readouterr()
    assert not captured.err, captured.err
    return captured.out


def test_calendar_example_is_true_on_the_file_it_names(tmp_path, sample_file, capsys):
    cesm = tmp_path / "data" / "cesm"
    cesm.mkdir(parents=True)
    shutil.copy(sample_file(TREFHT), cesm)
    config = _example_config("calendars:config", tmp_path)
    out = _run(config, tmp_path, capsys)
    assert "times read in calendar" not in out
    schema = load_schema(config["output"]["path"])
    assert schema.sample["calendar"] == "noleap"
    # Steps on July 16 of each year: 80 years, 1970-1983 (1984-07-16 is after June), 1984-1999; 4 patches each.
    assert {name: schema.num_examples(name) for name in schema.splits} == {"train": 320, "valid": 56, "test": 64}
    # Without the key the file is read as standard (CF's default), and the summary says so (a dry run: planning).
    del config["input"]["calendar"]
    out = _run(config, tmp_path, capsys, "--dry_run=True")
    assert f"  times read in calendar 'standard' (CF's default), as {cesm / TREFHT} states none; " in out


def test_ensemble_example_is_true_on_the_files_it_names(tmp_path, sample_file, capsys):
    cesm = tmp_path / "data" / "cesm"
    cesm.mkdir(parents=True)
    for member in (57, 59, 60, 63):  # the members the README names
        shutil.copy(sample_file(TREFHT), cesm / TREFHT.replace(".57.", f".{member}."))
    out = _run(_example_config("ensembles:config", tmp_path), tmp_path, capsys, "--dry_run=True")
    plan = out.splitlines()[1]
    # 110 steps x 4 patches per member: 57, 59 and 60 train, 63 tests.
    assert plan.startswith("  plan: train: 1,320 samples in ") and ", test: 440 samples in " in plan, out
    assert f"as {cesm / TREFHT} and 3 other file(s) state none" in out


def test_cmip_example_is_true_on_an_archive_of_its_layout(tmp_path, sample_file, capsys):
    from test_cmip_layout import PERIODS, write_cmip_archive

    write_cmip_archive(sample_file(TREFHT), tmp_path / "data" / "cmip6")
    out = _run(_example_config("cmip:config", tmp_path), tmp_path, capsys, "--dry_run=True")
    # Two members, 110 steps, 2 x 4 patches of 32 x 32 (64 x 128 cells).
    assert out.splitlines()[1].startswith("  plan: data: 1,760 samples in "), out
    assert sum(len(p) for p in PERIODS.values()) * 2 == len(list((tmp_path / "data" / "cmip6").glob("*.nc")))


def test_grib_example_is_true_on_files_of_its_layout(tmp_path, capsys):
    from grib_like import grib_along_time

    grib_along_time(tmp_path / "data" / "ifs")
    config = _example_config("grib:config", tmp_path)
    _run(config, tmp_path, capsys)
    schema = load_schema(config["output"]["path"])
    # 6 forecasts of 2 x 3 patches (7 x 12 cells), each with its 2 steps and 2 levels.
    assert schema.sample["num_samples"] == 36
    assert {f.name: f.shape for f in schema.variable_features} == {"t": (2, 2, 3, 4), "z": (2, 2, 3, 4)}


def test_roles_example_is_true_on_an_archive_of_its_layout(tmp_path, sample_file, capsys):
    from test_cmip_layout import write_cmip_archive

    merged = write_cmip_archive(sample_file(TREFHT), tmp_path / "data" / "cmip6", members=("r1i1p1f1",))
    config = _example_config("roles:config", tmp_path)
    _run(config, tmp_path, capsys)
    schema = load_schema(config["output"]["path"])
    shapes = {f.name: f.shape for f in schema.features if "/" in f.name and f.role == "variable"}
    assert shapes == {
        "inputs/tas": (2, 16, 16),
        "inputs/uas": (2, 16, 16),
        "targets/tas": (1, 8, 8),
        "forcings/vas": (1, 16, 16),
    }
    assert schema.feature("time_features/day_progress_sin").shape == (3, 16)
    # The README's forecaster: its targets/tas back at their valid times, as xarray reads them from the source.
    import numpy as np
    import xarray as xr

    script = _block("reassemble:roles").replace("out/roles", config["output"]["path"])
    result = run_warm([sys.executable, "-c", script], cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    with xr.open_zarr(tmp_path / "forecast.zarr") as ds:
        assert ds["tas"].dims == ("time", "prediction_timedelta", "lat", "lon")
        ahead = ds["tas"].isel(prediction_timedelta=-1).load()
        held = ~np.isnan(ahead.values)
        rows = held.any(axis=(1, 2))
        assert held.sum() == 18 * 32 * 64  # each test sample's 8 x 8 of 16 x 16 windows, 18 steps
        source = merged["r1i1p1f1"]["tas"]
        now = source.sel(time=ds["time"].values[rows]).values.astype(np.float32)  # persistence: tas at the init
        np.testing.assert_array_equal(ahead.values[rows][held[rows]], now[held[rows]])
        step = source["time"].values[1] - source["time"].values[0]
        valid = ds["valid_time"].isel(prediction_timedelta=-1).values[rows]
        np.testing.assert_array_equal(valid, ds["time"].values[rows] + step)


def test_reassembly_examples_run_as_written(tmp_path):
    """The README's reassembly blocks, on a small output with a valid split: source + 1 comes back."""
    import numpy as np
    import xarray as xr

    from pipelines.demo import ArchiveShape, write_archive
    from schemas import Reader

    write_archive(tmp_path / "archive", ArchiveShape(num_files=2, steps_per_file=2, levels=2, lat=18, lon=18))
    config = {
        "input": {"paths": str(tmp_path / "archive" / "*.nc")},
        "variables": ["t", "u"],
        "sample": {"window": {"lat": 9, "lon": 9}, "keep": ["level"]},
        "splits": {"train": {"time": [None, "2020-01-01T06"]}, "valid": {"time": ["2020-01-01T12", None]}},
        "output": {"path": str(tmp_path / "patches")},
    }
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(config))
    assert main(["--config", str(tmp_path / "c.yaml"), "--quiet"]) == 0
    script = _block("reassemble:python").replace("out/patches", str(tmp_path / "patches"))
    result = run_warm([sys.executable, "-c", script], cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    source = xr.open_mfdataset(sorted((tmp_path / "archive").glob("*.nc"))).load()
    with xr.open_dataset(tmp_path / "valid_t.nc") as ds:
        stored = source["t"].sel(time=ds["time"].values).astype("float32").values
        np.testing.assert_array_equal(ds["t"].values, stored + np.float32(1))
        assert int(ds["coverage"].min()) == 1
    predictions = tmp_path / "predictions"
    predictions.mkdir()
    for i, batch in enumerate(Reader(str(tmp_path / "patches"), "valid").iter_batches(4)):
        np.savez(predictions / f"{i}.npz", **batch)
    command = _block("reassemble:shell").strip().replace("out/patches", str(tmp_path / "patches")).split()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = run_warm([sys.executable, *command[1:]], cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    with xr.open_zarr(tmp_path / "valid.zarr") as ds:
        np.testing.assert_array_equal(ds["t"].values, stored)
