"""Test helpers: an independent reference for what each record must contain, readers, a benchmark script's run."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import sys
import uuid
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from schemas.reader import Reader
from schemas.schema import Schema

if TYPE_CHECKING:  # xarray is imported where used: the readers' tests use this module in an install without it
    import xarray as xr


def load_virtual_dataset(paths, concat_dim: str) -> xr.Dataset:
    """All files joined along concat_dim, ordered by its coordinate (the reference, via xarray)."""
    import xarray as xr

    with warnings.catch_warnings():
        # The ERA-Interim file's NaN _FillValue on int16 data, which xarray drops with a warning.
        warnings.simplefilter("ignore", xr.SerializationWarning)
        datasets = [xr.open_dataset(p).load() for p in paths]
    if concat_dim in datasets[0].coords:
        datasets.sort(key=lambda d: d[concat_dim].values[0])
    return xr.concat(datasets, dim=concat_dim) if len(datasets) > 1 else datasets[0]


def expected_feature(source: xr.Dataset, schema: Schema, name: str, record: dict) -> np.ndarray:
    """The slice of ``source`` a record's variable feature must equal, found from its index/* features.

    Written from the schema's description of each dim's role, independently of the sampling code.
    """
    feature = schema.feature(name)
    axes = {a["dim"]: a for a in schema.sample["axes"]}
    selection = {}
    for dim in source[name].dims:
        axis = axes[dim]
        if axis["role"] == "keep":
            continue
        start = int(np.asarray(record[f"index/{dim}"]).reshape(()))
        if axis["role"] == "iterate":
            selection[dim] = start
        elif axis["role"] == "window":
            selection[dim] = slice(start, start + axis["size"])
        else:  # offsets, relative to the sample's index
            selection[dim] = [start + offset for offset in axis["offsets"]]
    values = source[name].isel(selection).transpose(*feature.dims).values
    return values.astype(feature.dtype)


def assert_same(a: dict, b: dict) -> None:
    """Two samples (feature name: values) hold the same features, equal value for value."""
    assert a.keys() == b.keys()
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def import_generated_parser(output: Path):
    """Import an output's parser.py as a fresh module."""
    name = f"parser_{uuid.uuid4().hex}"
    spec = importlib.util.spec_from_file_location(name, Path(output) / "parser.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # AutoGraph looks its functions' module up here
    spec.loader.exec_module(module)
    return module


def read_all_records(output: Path, schema: Schema, split: str = "data") -> dict[str, np.ndarray]:
    """Every sample of a split decoded without TensorFlow, in file order, CRCs checked."""
    return Reader(str(output), split, schema=schema).read_all()


def parse_with_generated_parser(output: Path, split: str = "data") -> dict[str, np.ndarray]:
    """Every record of a split through the output's own parser.py (TensorFlow), concatenated."""
    parser = import_generated_parser(output)
    batches = list(parser.make_dataset(split, batch_size=256).as_numpy_iterator())
    return {name: np.concatenate([b[name] for b in batches]) for name in batches[0]}


def expected_progress(dates: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(year_progress, day_progress) of each date, float64, computed from the dates themselves: GraphCast's
    tropical-year fraction of the seconds since 1970 in the standard and proleptic Gregorian calendars (numpy
    datetimes too); elsewhere the day of year and time of day over that year's days, summed from cftime's own
    month lengths."""
    import cftime

    flat = np.asarray(dates).reshape(-1)
    if flat.dtype.kind == "M":
        seconds = (flat - np.datetime64("1970-01-01")) / np.timedelta64(1, "s")
        day = np.mod(seconds, 86400) / 86400
        return np.mod(seconds / (365.24219 * 86400), 1.0).reshape(np.shape(dates)), day.reshape(np.shape(dates))
    calendar = flat[0].calendar
    seconds = np.asarray(cftime.date2num(list(flat), "seconds since 1970-01-01", calendar=calendar), dtype=float)
    if calendar in ("standard", "gregorian", "proleptic_gregorian"):
        year = np.mod(seconds / (365.24219 * 86400), 1.0)
    else:
        year = []
        for d in flat:
            days = sum(cftime.datetime(d.year, m, 1, calendar=calendar).daysinmonth for m in range(1, 13))
            year.append((d.dayofyr - 1 + (d.hour * 3600 + d.minute * 60 + d.second) / 86400) / days)
        year = np.asarray(year)
    day = np.asarray([(d.hour * 3600 + d.minute * 60 + d.second) / 86400 for d in flat])
    return year.reshape(np.shape(dates)), day.reshape(np.shape(dates))


def stored_bytes(path: Path, box: dict[str, tuple[int, int]], names) -> int:
    """Bytes ``path`` stores for variables ``names`` over ``box``: the chunks holding it, or its elements.

    The least any reader must fetch: a chunk is read whole even where a box takes part of it.
    """
    import h5py
    import xarray as xr

    with warnings.catch_warnings(), xr.open_dataset(path, decode_times=False) as ds:
        warnings.simplefilter("ignore", xr.SerializationWarning)  # the ERA-Interim stand-in's NaN _FillValue
        dims = {name: ds[name].dims for name in names}
        itemsize = {name: ds[name].encoding["dtype"].itemsize for name in names}
    if not h5py.is_hdf5(path):
        return sum(itemsize[n] * int(np.prod([box[d][1] - box[d][0] for d in dims[n]])) for n in names)
    total = 0
    with h5py.File(path) as file:
        for name in names:
            dataset = file[name]
            low, high = np.array([box[d][0] for d in dims[name]]), np.array([box[d][1] for d in dims[name]])
            if dataset.chunks is None:
                total += dataset.dtype.itemsize * int(np.prod(high - low))
                continue
            for i in range(dataset.id.get_num_chunks()):
                info = dataset.id.get_chunk_info(i)
                start = np.array(info.chunk_offset)
                if np.all(start < high) and np.all(start + np.array(dataset.chunks) > low):
                    total += info.size
    return total


def split_along_time(source, directory, pieces: int, *, formats=("NETCDF4",), units=None, calendar=None) -> list[str]:
    """Write ``source`` as ``pieces`` files along time, cycling through ``formats``; per-file time units."""
    import xarray as xr

    paths = []
    with xr.open_dataset(source, decode_times=False) as ds:
        ds = ds.load()
    bounds = np.linspace(0, ds.sizes["time"], pieces + 1).astype(int)
    for i, (start, stop) in enumerate(zip(bounds[:-1], bounds[1:])):
        part = ds.isel(time=slice(start, stop)).copy()
        if units is not None:  # each file counts time from its own start, as many archives do
            offset = float(part["time"].values[0])
            part["time"] = part["time"] - offset
            part["time"].attrs.update(units=units.format(offset=int(offset)))
        if calendar is not None:
            part["time"].attrs["calendar"] = calendar
        path = directory / f"part{i:02d}.nc"
        part.to_netcdf(path, format=formats[i % len(formats)])
        paths.append(str(path))
    return paths


def build_quietly(config: dict, tmp_path: Path, name: str = "config.yaml") -> Path:
    """Build ``config`` (written to ``tmp_path/name``) with the command line; returns its output."""
    import yaml

    from pipelines.build import main

    path = tmp_path / name
    path.write_text(yaml.safe_dump(config))
    assert main(["--config", str(path), "--quiet"]) == 0
    return Path(config["output"]["path"])


def refused(config: dict, tmp_path: Path, capsys) -> str:
    """The one error line a build of ``config`` fails with (exit 2, no schema.json written)."""
    import yaml

    from pipelines.build import main

    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(config))
    assert main(["--config", str(path), "--quiet"]) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    assert not (Path(config["output"]["path"]) / "schema.json").exists()
    return lines[0]


def run_warm(command: list[str], *, cwd, env: dict[str, str] | None = None, timeout: float = 600):
    """``subprocess.run`` of a ``python -m``/``-c`` command, forked from this process's warmed fork server.

    For tests of what a command does, not of a fresh process (its imports, signals, packaging): a
    fresh interpreter pays about 3 s of imports (Beam, xarray) before it starts; the fork server
    pays them once per test worker (benchmarks.measure.WARM_MODULES). Anything else runs fresh.
    """
    repo = str(Path(__file__).resolve().parents[1])
    if repo not in sys.path:
        sys.path.append(repo)  # benchmarks/ is not an installed package
    from benchmarks.measure import run_captured

    return run_captured(command, str(cwd), env, timeout, warm=True)


def run_benchmark(module: str, *arguments: str, timeout: float = 600) -> str:
    """A benchmark script run end to end in its own process: its stdout, once it exited 0 (else its output's tail).

    As a smoke run (benchmarks.measure.smoke): the script and its competitors fork from warmed
    interpreters instead of paying their imports each; the test proves the script runs, it measures nothing.
    """
    import pytest

    pytest.importorskip("psutil", reason="the benchmarks measure memory with psutil (test extras)")
    repo = Path(__file__).resolve().parents[1]
    env = dict(os.environ, XTF_BENCH_SMOKE="1")
    result = run_warm([sys.executable, "-m", module, *arguments], cwd=repo, env=env, timeout=timeout)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout


def source_check(output: Path, samples: int = 10_000, *argv: str) -> tuple[int, str]:
    """``python -m pipelines.inspect OUTPUT --verify --source N`` in this process: (exit status, stderr)."""
    import io

    from pipelines.inspect import main

    errors, printed = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(errors), contextlib.redirect_stdout(printed):
        status = main([str(output), "--verify", "--source", str(samples), *argv])
    return status, errors.getvalue() + printed.getvalue()


def assert_matches_source(output: Path, samples: int = 10_000) -> str:
    """Every sampled record (``samples``: at most; by default all of a small output) equals its source re-read with
    plain xarray, bit for bit; returns the report."""
    status, report = source_check(output, samples)
    assert status == 0 and "equal their source bit for bit" in report, report
    return report


def tamper_record(output: Path, feature: str, split: str = "data", by: float = 0.5) -> tuple[int, np.ndarray]:
    """Alter the first value of ``feature`` in the first record of ``split`` consistently (by ``by``, an int's
    rounded): its CRCs recomputed, its size, and so the shard's index, unchanged. Returns (the sample's position,
    the altered values). Uncompressed shards, one sample a record."""
    from schemas.example_codec import entry_header, varint
    from schemas.tfrecord import frame, read_records

    reader = Reader(str(output), split)
    shard = reader.shards[0]
    value = np.asarray(next(reader.iter_examples([shard]))[feature]).reshape(-1)
    if value.dtype.kind == "f":
        changed = value.copy()
        changed[0] += np.float32(by)
        old, new = value.astype("<f4").tobytes(), changed.astype("<f4").tobytes()
        header = entry_header(feature.encode(), 2, len(old))
    else:
        changed = value + np.eye(1, len(value), dtype=value.dtype)[0] * max(1, round(by))
        old, new = b"".join(map(varint, value.tolist())), b"".join(map(varint, changed.tolist()))
        assert len(old) == len(new), "the altered int must keep its varint's length"
        header = entry_header(feature.encode(), 3, len(old))
    path = Path(output) / shard.file
    data = path.read_bytes()
    with open(path, "rb") as stream:
        record = next(read_records(stream))
    at = record.index(header + old) + len(header)
    altered = record[:at] + new + record[at + len(new) :]
    assert data.startswith(frame(record))
    path.write_bytes(frame(altered) + data[len(frame(record)) :])
    return 0, changed


#: The user docs whose code blocks the tests run: the README and every page of the site.
_REPO = Path(__file__).resolve().parents[1]
DOC_PAGES = (_REPO / "README.md", *sorted((_REPO / "docs").rglob("*.md")))


def doc_block(marker: str) -> str:
    """The code block the docs mark ``<!-- marker -->`` (the README's or a page's): exactly one must carry it."""
    found = [
        (page, match.group(1))
        for page in DOC_PAGES
        for match in re.finditer(rf"<!-- {re.escape(marker)} -->\n```\w*\n(.*?)```", page.read_text(), re.S)
    ]
    assert len(found) == 1, f"{len(found)} blocks of the docs are marked {marker}: {[str(p) for p, _ in found]}"
    return found[0][1]
