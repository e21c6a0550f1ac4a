"""The docs stay true: the walkthrough runs as written, the generated references match the code, links resolve."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pipelines.build import main
from pipelines.config_reference import END, START, config_reference
from schemas import load_schema

from conftest import REPO
from helpers import DOC_PAGES, doc_block, run_warm

_block = doc_block


def _embedded(page: str, start: str, end: str) -> str:
    return (REPO / page).read_text().split(start, 1)[1].split(end, 1)[0]


def test_config_reference_is_generated_from_the_config_model():
    embedded = _embedded("docs/reference/config.md", START, END)
    assert embedded.strip() == config_reference().strip(), (
        "run: python -m pipelines.config_reference --write docs/reference/config.md"
    )


def test_cli_reference_is_generated_from_the_commands_parsers():
    from pipelines import cli_reference

    embedded = _embedded("docs/reference/cli.md", cli_reference.START, cli_reference.END)
    assert embedded.strip() == cli_reference.cli_reference().strip(), (
        "run: python -m pipelines.cli_reference --write docs/reference/cli.md"
    )


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
    # Then the docs' two ways to read an output with TensorFlow, on this one (its first split).
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
    assert 'input: {paths: "data/eraint_uvz.nc"' in (REPO / "docs" / "getting-started.md").read_text()  # as shown


TREFHT = "TREFHT.B06.57.atm.1890-1999ANN.nc"  # CCSM annual means 1890-1999, 64 x 128: counts in noleap, says none


def _example_config(marker: str, tmp_path) -> dict:
    """The docs' config block, its relative paths under tmp_path, with an output there."""
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
    for member in (57, 59, 60, 63):  # the members the docs name
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
    """The docs' reassembly blocks, on a small output with a valid split: source + 1 comes back."""
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


def _code_blocks(language: str) -> list[tuple[Path, str]]:
    """Every ``language`` code block of the README and the docs' pages, with its page."""
    return [
        (page, match.group(1))
        for page in DOC_PAGES
        for match in re.finditer(rf"^```{language}\n(.*?)^```", page.read_text(), re.S | re.M)
    ]


def test_every_yaml_block_of_the_docs_is_a_valid_config():
    """A config a page shows (whole, or the keys it is about) passes the config model as written."""
    from planning.config.loading import parse_config

    blocks = _code_blocks("yaml")
    assert len(blocks) >= 10
    for page, text in blocks:
        data = yaml.safe_load(text)
        base = {"input": {"paths": "data/*.nc"}, "output": {"path": "out/x"}}
        for key, value in data.items():  # a fragment's keys over a minimal config
            base[key] = {**base[key], **value} if key in ("input", "output") else value
        try:
            parse_config(base, source=str(page.relative_to(REPO)))
        except Exception as error:
            where = page.relative_to(REPO)
            raise AssertionError(f"{where}: a yaml block is not a valid config: {error}\n{text}") from None


def test_every_python_block_of_the_docs_is_valid_python():
    import ast

    blocks = _code_blocks("python")
    assert len(blocks) >= 8
    for page, text in blocks:
        ast.parse(text, filename=str(page.relative_to(REPO)))


def test_every_command_the_docs_show_exists():
    """`python -m X` in a shell block names a module of the project (or of the benchmarks)."""
    import importlib.util

    modules = {
        match.group(1)
        for _, text in _code_blocks("bash")
        for match in re.finditer(r"python -m ((?:pipelines|benchmarks)\.\w+)", text)
    }
    assert {"pipelines.build", "pipelines.inspect", "pipelines.reassemble", "benchmarks.run"} <= modules
    for module in modules:
        assert importlib.util.find_spec(module), f"the docs run python -m {module}, which does not exist"


def test_relative_links_of_the_readme_and_guides_resolve():
    """What mkdocs checks on the site, for the files it does not build: README.md and CONTRIBUTING.md."""
    for name in ("README.md", "CONTRIBUTING.md"):
        text = (REPO / name).read_text()
        links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
        local = [link for link in links if "://" not in link]
        assert local, name
        for link in local:
            assert (REPO / link).exists(), f"{name} links to {link}, which is not in the repository"


def test_the_readme_is_short_and_its_quick_start_is_two_commands():
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    quick_start = text.split("## Quick start", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    commands = [line.split("#", 1)[0].split() for line in quick_start.strip().splitlines()]
    assert commands == [
        ["pip", "install", "-c", "constraints.txt", "-e", '".[build]"', "&&", "python", "-m", "pipelines.build"],
        ["pip", "install", "-c", "constraints.txt", "-e", '".[test]"', "&&", "pytest"],
    ]


#: A run log in user docs: when a run was made (a date with its clock time, "measured" on a day, a date alone in
#: brackets), load averages, clock times. Dates as data (`2000-02-30` in 360_day) are not runs.
RUN_LOG = re.compile(
    r"\b20\d\d-\d\d-\d\d(?: \d\d:\d\d| evening| morning| at load)|measured (?:on )?20\d\d|\(20\d\d-\d\d-\d\d\)"
    r"|\bload (?:average )?~?\d|(?<!:)\b\d\d:\d\d\b(?!:)"
)


def test_the_user_docs_hold_no_run_log():
    for page in (REPO / "README.md", REPO / "CONTRIBUTING.md", *(REPO / "docs").rglob("*.md")):
        for number, line in enumerate(page.read_text().splitlines(), 1):
            assert not RUN_LOG.search(line), f"{page.relative_to(REPO)}:{number}: {line}"


def test_the_console_script_runs_each_command(capsys):
    from pipelines import console

    with pytest.raises(SystemExit) as exit_:
        console.main(["inspect", "--help"])
    assert exit_.value.code == 0 and "usage: python -m pipelines.inspect" in capsys.readouterr().out
    assert console.main(["nonsense"]) == 2
    assert "'nonsense' is not a command" in capsys.readouterr().err
    assert console.main([]) == 2


#: Python blocks of the docs that no test can run here, each with why (a cluster to start, a hub to ask).
NOT_RUN = {
    "from dask_jobqueue import SLURMCluster": "starts SLURM jobs",
    "from dask_gateway import Gateway": "asks a dask-gateway hub for a cluster",
}
#: Blocks that other tests run, on outputs of their own (the walkthrough's, a split named valid).
RUN_ELSEWHERE = ("walkthrough:python", "reading:tensorflow", "reassemble:python", "reassemble:roles")

RUN_BLOCKS = """
import json, os, sys, traceback
failures = []
for where, code in json.load(open(sys.argv[1])):
    try:
        exec(compile(code, where, "exec"), {"__name__": "__docs__"})
    except Exception:
        failures.append(where + ":\\n" + traceback.format_exc(limit=3))
print(json.dumps(failures))
"""


@pytest.fixture(scope="module")
def docs_folder(tmp_path_factory) -> Path:
    """A folder where the outputs the docs' blocks name exist: the demo's as demo/patches and out/patches, and the
    demo split by time as out/my_patches (train and valid)."""
    folder = tmp_path_factory.mktemp("docs")
    result = run_warm([sys.executable, "-m", "pipelines.build", "--quiet"], cwd=folder)
    assert result.returncode == 0, result.stderr[-3000:]
    (folder / "out").mkdir()
    (folder / "out" / "patches").symlink_to(folder / "demo" / "patches")
    config = yaml.safe_load((REPO / "configs" / "demo.yaml").read_text())
    config["input"]["paths"] = str(folder / "demo" / "era5" / "*.nc")
    config["splits"] = {"train": {"time": [None, "2020-01-01T06"]}, "valid": {"time": ["2020-01-01T12", None]}}
    config["output"] = {"path": str(folder / "out" / "my_patches")}
    (folder / "split.yaml").write_text(yaml.safe_dump(config))
    result = run_warm([sys.executable, "-m", "pipelines.build", "--config", "split.yaml", "--quiet"], cwd=folder)
    assert result.returncode == 0, result.stderr[-3000:]
    return folder


def _python_blocks(with_torch: bool) -> list[tuple[str, str]]:
    """The docs' python blocks that no other test runs and that can run here: with or without PyTorch."""
    marked_elsewhere = {doc_block(marker) for marker in RUN_ELSEWHERE}
    blocks = []
    for page, code in _code_blocks("python"):
        if code in marked_elsewhere or any(code.startswith(start) for start in NOT_RUN):
            continue
        if ("import torch" in code or "from torch" in code) == with_torch:
            blocks.append((str(page.relative_to(REPO)), code))
    return blocks


def _run_blocks(blocks: list[tuple[str, str]], folder: Path, tmp_path: Path) -> None:
    """Each block in turn, in one fresh interpreter, in ``folder``, as a user would paste it; every failure named."""
    import json

    (tmp_path / "blocks.json").write_text(json.dumps(blocks))
    script = tmp_path / "run_blocks.py"
    script.write_text(RUN_BLOCKS)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    command = [sys.executable, str(script), str(tmp_path / "blocks.json")]
    result = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    failures = json.loads(result.stdout.strip().splitlines()[-1])
    assert not failures, "\n".join(failures)


def test_every_python_block_of_the_docs_runs(docs_folder, tmp_path):
    blocks = _python_blocks(with_torch=False)
    assert len(blocks) >= 6
    _run_blocks(blocks, docs_folder, tmp_path)


@pytest.mark.torch
def test_the_docs_pytorch_blocks_run(docs_folder, tmp_path):
    pytest.importorskip("torch")
    blocks = _python_blocks(with_torch=True)
    assert blocks
    _run_blocks(blocks, docs_folder, tmp_path)
