"""The inventory cache is trusted only for files it still describes, and read only as it was written."""

from __future__ import annotations

import base64
import dataclasses
import json
import logging
import os
import zlib

import numpy as np
import pandas as pd
import pytest
import xarray as xr

from planning.config import parse_config
from planning.formats import sources
from planning.formats.sources import SourceFile, list_files, size_and_version
from planning.inputs import probe_cache
from planning.inputs.inventory import probe_files
from planning.inputs.probe_cache import load_probes, reuse_or_probe, save_probes
from planning.plan import make_plan
from planning.reads.direct_reads import read_direct
from planning.reads.slabs import _check_unchanged, read_selected
from schemas.errors import UserError


def _write(path, names, day: int, seed: int | None = None) -> None:
    """A file of plainly stored variables, defined in the order of ``names`` (so at offsets in that order)."""
    rng = np.random.default_rng(day if seed is None else seed)
    data = {name: (("time", "lat", "lon"), rng.normal(280, 5, (2, 3, 4)).astype("f4")) for name in names}
    times = pd.date_range("2000-01-01", periods=2, freq="D") + pd.Timedelta(days=2 * day)
    xr.Dataset(data, coords={"time": times, "lat": np.arange(3.0), "lon": np.arange(4.0)}).to_netcdf(path)


@pytest.fixture
def archive(tmp_path):
    directory = tmp_path / "in"
    directory.mkdir()
    for day in range(3):
        _write(directory / f"d{day}.nc", ["t", "u"], day)
    return directory


def _replace_keeping_times(path, names, day: int) -> None:
    """Replace a file by one of the same size and steps, new values, its times copied (as touch -r, cp -p,
    rsync -t leave them)."""
    before = os.stat(path)
    temporary = path.with_suffix(".tmp")
    _write(temporary, names, day, seed=7)
    assert os.path.getsize(temporary) == before.st_size
    os.replace(temporary, path)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))


def _config(archive, output):
    return parse_config(
        {
            "input": {"paths": str(archive / "*.nc")},
            "variables": ["t", "u"],
            "sample": {"window": {"lat": 3, "lon": 4}},
            "output": {"path": str(output)},
        }
    )


def _build(archive, output):
    """Plan as a build does (reusing and then replacing the output's cache), and read every unit's values."""
    cache = str(output / "_inventory.json")
    plan = make_plan(_config(archive, output), cached_probes=load_probes(cache, "time"))
    save_probes(cache, plan.concat_dim, plan.probes)
    parts: dict[str, list] = {}
    for unit in plan.units:
        values = read_selected(plan.sources, "time", plan.variables, plan.grid.source_box(unit), plan.selection)
        for name, array in values.values.items():
            parts.setdefault(name, []).append(array)
    return plan, {name: np.concatenate(arrays) for name, arrays in parts.items()}


def _expected(archive) -> dict[str, np.ndarray]:
    with xr.open_mfdataset(sorted(archive.glob("*.nc")), combine="nested", concat_dim="time") as ds:
        return {name: ds[name].values for name in ("t", "u")}


def _assert_read_right(values, archive) -> None:
    for name, expected in _expected(archive).items():
        np.testing.assert_array_equal(values[name], expected, err_msg=name)


def test_a_file_replaced_at_the_same_size_with_its_times_copied_is_probed_again_and_read_right(archive, tmp_path):
    output = tmp_path / "out"
    plan, values = _build(archive, output)
    assert (plan.sources.direct.offsets >= 0).all(), "t and u are read by offset"
    _assert_read_right(values, archive)
    # u first, then t: each at the other's offset; new values too.
    _replace_keeping_times(archive / "d1.nc", ["u", "t"], 1)
    listed = list_files([str(archive / "*.nc")])
    probed = []
    reuse_or_probe(listed, load_probes(str(output / "_inventory.json"), "time"), lambda m: probed.extend(m) or [None])
    assert [f.path for f in probed] == [str(archive / "d1.nc")]
    _, values = _build(archive, output)
    _assert_read_right(values, archive)


def test_where_the_filesystem_hides_a_replacement_the_reads_by_offset_refuse(archive, tmp_path, monkeypatch):
    # A filesystem whose inode and change time say nothing (some network and FUSE mounts): the
    # version is the modification time alone, which the replacement copied.
    monkeypatch.setattr(sources, "_local_version", lambda status: f"mtime_ns={status.st_mtime_ns}")
    output = tmp_path / "out"
    _build(archive, output)
    _replace_keeping_times(archive / "d1.nc", ["u", "t"], 1)
    with pytest.raises(UserError, match=r"d1\.nc: the bytes at the offset planned for 't' are not those probed"):
        _build(archive, output)


def _edit(cache, edit, keep_digest: bool = True) -> None:
    """Edit a cache's entries; keep_digest=False rewrites its digest too, as a cache that lies consistently."""
    document = json.loads(cache.read_text())
    files = json.loads(probe_cache._unpack(json.dumps(document["files"])))
    edit(files)
    _write_stored(cache, probe_cache._pack(json.dumps(files)), keep_digest)


def _write_stored(cache, stored: str, keep_digest: bool = False) -> None:
    """Write ``stored`` as a cache's files (as written: a JSON string of the compressed entries)."""
    document = json.loads(cache.read_text())
    digest = document["digest"] if keep_digest else probe_cache._digest(stored)
    cache.write_text(f"{probe_cache._head('time', digest)}{stored}}}")


def _compressed(data: bytes) -> str:
    return json.dumps(base64.b64encode(data).decode())


def _swap_offsets(files) -> None:
    layouts = files[1]["layouts"]
    layouts["t"][0], layouts["u"][0] = layouts["u"][0], layouts["t"][0]


def test_an_edited_cache_is_ignored_and_one_that_lies_consistently_is_caught_where_read(archive, tmp_path, caplog):
    output = tmp_path / "out"
    cache = output / "_inventory.json"
    _build(archive, output)
    _edit(cache, _swap_offsets)
    with caplog.at_level(logging.WARNING):
        _, values = _build(archive, output)
    assert f"ignoring the inventory cache {cache}" in caplog.text and "does not match its digest" in caplog.text
    _assert_read_right(values, archive)
    _edit(cache, _swap_offsets, keep_digest=False)
    assert len(load_probes(str(cache), "time")) == 3  # well-formed, and hashes to its digest
    with pytest.raises(UserError, match=r"d1\.nc: the bytes at the offset planned for 't' are not those probed"):
        _build(archive, output)


def _set(key, value):
    def edit(files):
        files[0][key] = value

    return edit


def _set_layout(index, value):
    def edit(files):
        files[0]["layouts"]["t"][index] = value

    return edit


MALFORMED = {
    "not JSON": lambda cache: cache.write_text("{not json"),
    "a list": lambda cache: cache.write_text("[]"),
    "no files": lambda cache: cache.write_text(probe_cache._head("time", probe_cache._digest("")) + "}"),
    "missing key": lambda cache: _edit(cache, lambda files: files[0].pop("sizes"), keep_digest=False),
    "extra key": lambda cache: _edit(cache, _set("offsets", [1]), keep_digest=False),
    "size as text": lambda cache: _edit(cache, _set("nbytes", "9272"), keep_digest=False),
    "sizes not a map": lambda cache: _edit(cache, _set("sizes", [2, 3, 4]), keep_digest=False),
    "bool for a number": lambda cache: _edit(cache, _set("bytes_read", True), keep_digest=False),
    "negative offset": lambda cache: _edit(cache, _set_layout(0, -8), keep_digest=False),
    "offset past the end": lambda cache: _edit(cache, _set_layout(0, 10**9), keep_digest=False),
    "shape past the end": lambda cache: _edit(cache, _set_layout(1, [2, 3, 10**6]), keep_digest=False),
    "bad dtype": lambda cache: _edit(cache, _set_layout(2, "<nonsense"), keep_digest=False),
    "check past int64": lambda cache: _edit(cache, _set_layout(3, 2**64), keep_digest=False),
    "layout too short": lambda cache: _edit(cache, lambda f: f[0]["layouts"]["t"].pop(), keep_digest=False),
    "raw of text": lambda cache: _edit(
        cache, _set("concat_raw", {"dtype": "<U3", "values": [1, 2]}), keep_digest=False
    ),
    "raw too long": lambda cache: _edit(
        cache, _set("concat_raw", {"dtype": "<i8", "values": [1, 2, 3]}), keep_digest=False
    ),
    "raw overflows": lambda cache: _edit(
        cache, _set("concat_raw", {"dtype": "|i1", "values": [1, 999]}), keep_digest=False
    ),
    "an entry not a map": lambda cache: _edit(cache, lambda files: files.append(3), keep_digest=False),
    "entries not compressed": lambda cache: _write_stored(cache, json.dumps([])),
    "entries a number": lambda cache: _write_stored(cache, "3"),
    "not base64": lambda cache: _write_stored(cache, json.dumps("eJ*not base64")),
    "not zlib": lambda cache: _write_stored(cache, _compressed(b"[]")),
    "compressed data cut short": lambda cache: _write_stored(cache, _compressed(zlib.compress(b"[]" * 100)[:-6])),
    "compressed data and more": lambda cache: _write_stored(cache, _compressed(zlib.compress(b"[]") + b"more")),
    "not UTF-8": lambda cache: _write_stored(cache, _compressed(zlib.compress(b'["\xff"]'))),
}


def test_malformed_caches_are_ignored_with_a_warning_naming_them(archive, tmp_path, caplog):
    listed = list_files([str(archive / "*.nc")])
    cache = tmp_path / "out" / "_inventory.json"
    for name, spoil in MALFORMED.items():
        save_probes(str(cache), "time", zip(listed, probe_files(listed, "time")))
        assert len(load_probes(str(cache), "time")) == 3
        spoil(cache)
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            assert load_probes(str(cache), "time") == {}, name
        assert f"ignoring the inventory cache {cache} (every file is probed again)" in caplog.text, name
        assert len(caplog.records) == 1 and "\n" not in caplog.records[0].getMessage(), name


def test_a_malformed_cache_is_probed_again_to_the_right_values(archive, tmp_path, caplog):
    output = tmp_path / "out"
    _build(archive, output)
    _edit(output / "_inventory.json", _set("sizes", None), keep_digest=False)
    with caplog.at_level(logging.WARNING):
        _, values = _build(archive, output)
    assert "d0.nc: sizes: Input should be an object" in caplog.text
    _assert_read_right(values, archive)
    assert len(load_probes(str(output / "_inventory.json"), "time")) == 3  # written anew


def test_another_versions_cache_or_another_dim_is_ignored_quietly(archive, tmp_path, caplog):
    cache = tmp_path / "_inventory.json"
    listed = list_files([str(archive / "*.nc")])
    save_probes(str(cache), "time", zip(listed, probe_files(listed, "time")))
    with caplog.at_level(logging.WARNING):
        assert load_probes(str(cache), "lat") == {}
        cache.write_text(json.dumps({"format": "xarray-tfrecords-inventory/3", "concat_dim": "time", "files": []}))
        assert load_probes(str(cache), "time") == {}
        four = {"format": "xarray-tfrecords-inventory/4", "concat_dim": "time", "digest": "sha256:0", "files": []}
        cache.write_text(json.dumps(four))  # entries as plain JSON, before they were compressed
        assert load_probes(str(cache), "time") == {}
    assert not caplog.records


def test_a_cache_that_inflates_beyond_the_limit_is_not_read(archive, tmp_path, monkeypatch, caplog):
    cache = tmp_path / "_inventory.json"
    listed = list_files([str(archive / "*.nc")])
    save_probes(str(cache), "time", zip(listed, probe_files(listed, "time")))
    assert len(load_probes(str(cache), "time")) == 3
    assert len(cache.read_text()) < 0.5 * len(probe_cache._unpack(cache.read_text().rsplit('"files": ', 1)[1][:-1]))
    monkeypatch.setattr(probe_cache, "MAX_ENTRIES_BYTES", 1000)  # a bomb: a little data, inflating a lot
    with caplog.at_level(logging.WARNING):
        assert load_probes(str(cache), "time") == {}
    assert "files: more than 1,000 bytes decompressed" in caplog.text


def test_a_read_of_part_of_a_file_checks_the_bytes_it_did_not_read(archive, tmp_path):
    plan, _ = _build(archive, tmp_path / "out")
    source = plan.sources[0]
    box = {"time": (0, 1), "lat": (0, 3), "lon": (0, 4)}  # the checked bytes are in the second step
    with xr.open_dataset(source.path) as ds:
        np.testing.assert_array_equal(read_direct(source, plan.variables, box, "time")["t"], ds["t"].values[:1])
    (t, t_shape, t_check), (u, u_shape, u_check) = source.layouts["t"], source.layouts["u"]
    swapped = dataclasses.replace(source, layouts={"t": (u, t_shape, t_check), "u": (t, u_shape, u_check)})
    with pytest.raises(UserError, match="the bytes at the offset planned for 't' are not those probed"):
        read_direct(swapped, plan.variables, box, "time")


def test_a_worker_that_numbers_inodes_its_own_way_still_reads(tmp_path):
    """A worker's mount may give the planner's file another inode (gcsfuse per node): not a changed file."""
    path = tmp_path / "a.nc"
    path.write_bytes(b"0123456789")
    nbytes, version = size_and_version(str(path))
    elsewhere = ";".join("ino=1" if part.startswith("ino=") else part for part in version.split(";"))
    _check_unchanged(SourceFile(str(path), 0, 1, nbytes, elsewhere))
    with pytest.raises(UserError, match="changed since the build was planned"):
        _check_unchanged(SourceFile(str(path), 0, 1, nbytes, elsewhere.replace("mtime_ns=", "mtime_ns=1")))
