"""Planning's quick probe of a file gives what the full look through xarray gives."""

from __future__ import annotations

import errno
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

from planning.formats.sources import list_files
from planning.inputs.inventory import inspect_files, probe_files, take_inventory
from planning.inputs.metadata import inspect_file
from planning.inputs.probe_cache import load_probes, reuse_or_probe, save_probes
from planning.inputs.time_decoding import TimeDecoding
from schemas.errors import UserError

from helpers import split_along_time


def _assert_same(probed, full, concat_dim="time"):
    assert [i.path for i in probed] == [i.path for i in full]
    for got, want in zip(probed, full):
        assert (got.nbytes, got.sizes, got.variables) == (want.nbytes, want.sizes, want.variables), got.path
        assert got.coords.keys() == want.coords.keys()
        for dim, values in want.coords.items():
            assert got.coords[dim].dtype == values.dtype, (got.path, dim)
            np.testing.assert_array_equal(got.coords[dim], values)
        others = {d: a for d, a in want.coord_attrs.items() if d != concat_dim}
        assert {d: a for d, a in got.coord_attrs.items() if d != concat_dim} == others


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"formats": ("NETCDF3_CLASSIC", "NETCDF3_64BIT", "NETCDF4_CLASSIC", "NETCDF4")},
        {"units": "days since 1870-03-01 00:00:00 +{offset} days"},
        {"calendar": "noleap"},
        {"calendar": "360_day", "formats": ("NETCDF3_64BIT",)},
    ],
    ids=["netcdf4", "mixed-formats", "units-per-file", "noleap", "360_day"],
)
def test_probed_files_equal_the_full_look(sample_file, tmp_path, options):
    source = sample_file("TREFHT.B06.57.atm.1890-1999ANN.nc")
    paths = split_along_time(source, tmp_path, 11, **options)
    probes = probe_files(list_files(paths), "time")
    assert all(probes), "every file here can be probed"
    # One full look per format at most: the other files are probed, not opened through xarray.
    assert len({p.fingerprint for p in probes}) <= len(options.get("formats", ("NETCDF4",)))
    probed = inspect_files(list_files(paths), "time")
    _assert_same(probed, [inspect_file(p) for p in paths])


def test_the_synthetic_archive_probes_like_the_full_look(small_archive):
    paths = sorted(str(p) for p in small_archive.glob("*.nc"))
    _assert_same(inspect_files(list_files(paths), "time"), [inspect_file(p) for p in paths])


def test_a_different_grid_gets_its_own_full_look(sample_file, tmp_path):
    source = sample_file("TREFHT.B06.57.atm.1890-1999ANN.nc")
    paths = split_along_time(source, tmp_path, 3)
    with xr.open_dataset(paths[2], decode_times=False) as ds:
        shifted = ds.load().assign_coords(lat=ds["lat"] + np.float32(1e-3))
    shifted.to_netcdf(tmp_path / "shifted.nc")
    paths[2] = str(tmp_path / "shifted.nc")
    probed = inspect_files(list_files(paths), "time")
    np.testing.assert_array_equal(probed[2].coords["lat"], shifted["lat"].values)
    assert not np.array_equal(probed[2].coords["lat"], probed[0].coords["lat"])


def test_a_truncated_classic_file_is_refused_though_probed(sample_file, tmp_path):
    source = sample_file("TREFHT.B06.57.atm.1890-1999ANN.nc")
    paths = split_along_time(source, tmp_path, 3, formats=("NETCDF3_64BIT",))
    data = Path(paths[1]).read_bytes()
    Path(paths[1]).write_bytes(data[: len(data) - 1000])
    with pytest.raises(UserError, match="truncated"):
        inspect_files(list_files(paths), "time")


def test_a_rerun_reuses_the_cached_probes_of_unchanged_files_only(sample_file, tmp_path):
    source = sample_file("TREFHT.B06.57.atm.1890-1999ANN.nc")
    paths = split_along_time(source, tmp_path, 4, formats=("NETCDF4", "NETCDF3_64BIT"))
    listed = list_files(paths)
    cache = str(tmp_path / "out" / "_inventory.json")
    save_probes(cache, "time", zip(listed, probe_files(listed, "time")))
    cached = load_probes(cache, "time")
    assert len(cached) == 4
    for probe, again in zip(probe_files(listed, "time"), cached.values()):
        assert (probe.path, probe.fingerprint, probe.sizes) == (again.path, again.fingerprint, again.sizes)
        assert repr(probe.concat_attrs) == repr(again.concat_attrs)  # repr: _FillValue is NaN
        np.testing.assert_array_equal(probe.concat_raw, again.concat_raw)
        assert probe.concat_raw.dtype == again.concat_raw.dtype

    def must_not_probe(missing):
        raise AssertionError(f"probed again: {missing}")

    assert None not in reuse_or_probe(listed, cached, must_not_probe)
    with xr.open_dataset(paths[1], decode_times=False) as ds:
        shorter = ds.load().isel(time=slice(1, None))
    shorter.to_netcdf(paths[1], format="NETCDF3_64BIT")  # rewritten: another size and modification time
    probed = []
    reuse_or_probe(list_files(paths), cached, lambda missing: probed.extend(missing) or [None] * len(missing))
    assert [f.path for f in probed] == [paths[1]]
    assert load_probes(cache, "lat") == {}  # planned along another dim: not reused


def test_a_cache_that_cannot_be_written_leaves_no_temporary(tmp_path, monkeypatch, caplog):
    """A full disk while the cache is written: a temporary left behind would be met by every rerun."""
    from fsspec.implementations.local import LocalFileSystem

    def full_disk(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(LocalFileSystem, "mv", full_disk)
    save_probes(str(tmp_path / "out" / "_inventory.json"), "time", [])
    assert list((tmp_path / "out").iterdir()) == [] and "No space left" in caplog.text


# Calendars: the files along the concat dim must share one, under whatever name each states it.


def _halves(source, tmp_path: Path, first: str, second: str) -> list[str]:
    """The first half of ``source`` in calendar ``first``, the second in ``second`` (one file each)."""
    halves = []
    for index, (name, calendar) in enumerate((("a", first), ("b", second))):
        (tmp_path / name).mkdir()
        halves.append(split_along_time(source, tmp_path / name, 2, calendar=calendar)[index])
    return halves


@pytest.mark.parametrize(
    ("first", "second"), [("standard", "gregorian"), ("standard", "proleptic_gregorian"), ("noleap", "365_day")]
)
def test_one_calendar_under_two_names_joins(sample_file, tmp_path, first, second):
    paths = _halves(sample_file("TREFHT.B06.57.atm.1890-1999ANN.nc"), tmp_path, first, second)
    inventory = take_inventory(paths, "time")
    expected = []
    for path in paths:
        with xr.open_dataset(path) as ds:
            expected.append(ds["time"].values)
    np.testing.assert_array_equal(inventory.concat_values, np.concatenate(expected))


@pytest.mark.parametrize(("first", "second"), [("noleap", "standard"), ("360_day", "noleap"), ("standard", "julian")])
def test_files_in_two_calendars_are_refused_in_one_line_naming_both(sample_file, tmp_path, first, second):
    a, b = _halves(sample_file("TREFHT.B06.57.atm.1890-1999ANN.nc"), tmp_path, first, second)
    with pytest.raises(UserError) as info:
        take_inventory([a, b], "time")
    message = str(info.value)
    assert message.startswith(f"input: {a} uses calendar '{first}' but {b} uses '{second}'; "), message
    assert "input.calendar" in message and "\n" not in message


def test_gregorian_files_either_side_of_1582_join_as_cftime_dates(tmp_path):
    """xarray decodes standard-calendar dates before 1582 to cftime, later ones to numpy: both compare."""
    paths = []
    for name, units in (("early.nc", "days since 1500-01-01"), ("late.nc", "days since 1600-01-01")):
        time = xr.Variable("time", [0.0, 365.0, 730.0], {"units": units, "calendar": "standard"})
        xr.Dataset({"t": (("time", "lat"), np.ones((3, 2), "f4"))}, {"time": time, "lat": [0.0, 1.0]}).to_netcdf(
            tmp_path / name
        )
        paths.append(str(tmp_path / name))
    inventory = take_inventory(paths, "time")
    expected = []
    for path in paths:
        with xr.open_dataset(path, decode_times=xr.coders.CFDatetimeCoder(use_cftime=True)) as ds:
            expected.append(ds["time"].values)
    assert all(value.calendar == "standard" for value in inventory.concat_values)
    np.testing.assert_array_equal(inventory.concat_values, np.concatenate(expected))


def test_undecoded_times_must_count_in_one_unit(sample_file, tmp_path):
    source = sample_file("TREFHT.B06.57.atm.1890-1999ANN.nc")
    paths = split_along_time(source, tmp_path, 3, units="days since 1870-03-01 00:00:00 +{offset} days")
    (tmp_path / "same").mkdir()
    with pytest.raises(UserError, match=r"input: .*part00.nc counts time in 'days since .* but .*part01.nc in"):
        take_inventory(paths, "time", decoding=TimeDecoding(enabled=False))
    same = split_along_time(source, tmp_path / "same", 3)
    undecoded = take_inventory(same, "time", decoding=TimeDecoding(enabled=False))
    with xr.open_dataset(source, decode_times=False) as ds:
        np.testing.assert_array_equal(undecoded.concat_values, ds["time"].values)


def _dated(path: Path, start: str, issued_units: str, calendar: str) -> Path:
    """A file with a data variable of dates ("issued", in its own units and calendar) beside temperatures in K."""
    time = np.array([np.datetime64(start) + np.timedelta64(6 * i, "h") for i in range(2)])
    ds = xr.Dataset(
        {
            "t": (("time", "lat"), np.full((2, 3), 280.0, np.float32), {"units": "K"}),
            "issued": (("time",), np.array([1.0, 2.0]), {"units": issued_units, "calendar": calendar}),
        },
        coords={"time": time, "lat": [0.0, 1.0, 2.0]},
    )
    ds.to_netcdf(path)
    return path


def test_what_values_mean_must_agree_between_files_but_not_how_they_are_stored(tmp_path):
    """Dates: their calendar must agree (CF's aliases are one calendar), their units need not (each file's decode
    applies its own); numbers: their units must agree."""
    from planning.inputs.inventory import check_variables_agree
    from schemas.errors import UserError

    def agree(*files):
        inventory = take_inventory([str(f) for f in files], "time")
        check_variables_agree(inventory, list(inventory.variables.values()))

    a = _dated(tmp_path / "a.nc", "2020-01-01", "days since 2000-01-01", "noleap")
    agree(a, _dated(tmp_path / "b.nc", "2020-01-02", "hours since 1990-01-01", "365_day"))
    (tmp_path / "b.nc").unlink()
    b = _dated(tmp_path / "b.nc", "2020-01-02", "days since 2000-01-01", "360_day")
    with pytest.raises(UserError, match=r"b\.nc: variable 'issued' has calendar '360_day' but 'noleap' in .*a\.nc"):
        agree(a, b)
    a, b = (
        _dated(tmp_path / f"{n}s.nc", s, u, "standard")
        for n, s, u in (("a", "2020-01-01", "days since 2000-01-01"), ("b", "2020-01-02", "hours since 2019-01-01"))
    )
    agree(a, b)  # numpy dates: decoded alike whatever their units
