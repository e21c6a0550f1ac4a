"""Classic NetCDF read by byte ranges from the header gives xarray's values bit for bit, for any box."""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import netCDF4
import numpy as np
import pytest
import xarray as xr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planning.formats.byte_ranges import merge_ranges
from planning.formats.classic_reads import read_box, variable_runs
from planning.formats.netcdf3 import expected_size, read_header
from planning.formats.remote_files import HEADER_BYTES, RemoteFile

FORMATS = {"cdf1": "NETCDF3_CLASSIC", "cdf2": "NETCDF3_64BIT_OFFSET", "cdf5": "NETCDF3_64BIT_DATA"}


def _write_records(path: Path, file_format: str) -> Path:
    """Record variables of many types, packed and with fill and missing values that occur in the data."""
    rng = np.random.default_rng(3)
    shape = (6, 5, 7)
    codes = rng.integers(-3000, 3000, shape).astype("i2")
    codes[0, 0, :3] = -32767
    orography = rng.normal(500, 100, (5, 7)).astype("f4")
    orography[2, 3] = np.nan
    # name: (dtype, dims, stored values, attributes)
    variables = {
        "packed": (
            "i2",
            ("time", "y", "x"),
            codes,
            {"_FillValue": np.int16(-32767), "scale_factor": np.float32(0.01), "add_offset": np.float32(273.15)},
        ),
        # int32 packed by float64: decodes to float64
        "wide": (
            "i4",
            ("time", "y", "x"),
            np.where(rng.random(shape) < 0.2, 7, rng.integers(-1000, 1000, shape)),
            {"scale_factor": 0.5, "add_offset": -10.0, "missing_value": np.int32(7)},
        ),
        "temp": (
            "f4",
            ("time", "y", "x"),
            np.where(rng.random(shape) < 0.2, -999.0, rng.normal(280, 10, shape)),
            {"missing_value": np.float32(-999.0)},
        ),
        "flag": (
            "i1",
            ("time", "pair"),
            rng.integers(-128, 128, (6, 3)),
            {"_FillValue": np.int8(-1), "_Unsigned": "true"},
        ),
        "odd": ("i2", ("time", "pair"), rng.integers(-100, 100, (6, 3)), {}),  # 6 bytes, padded to 8 per record
        "stamp": ("f8", ("time",), np.arange(6) * 0.25, {}),
        "orography": ("f4", ("y", "x"), orography, {"_FillValue": np.float32(np.nan)}),
    }
    if file_format == "NETCDF3_64BIT_DATA":  # CDF-5 adds unsigned and 64-bit integers
        variables["count"] = ("u2", ("time", "x"), rng.integers(0, 65535, (6, 7)), {})
        variables["big"] = ("i8", ("y", "x"), rng.integers(-(2**62), 2**62, (5, 7)), {})
    with netCDF4.Dataset(path, "w", format=file_format) as nc:
        for dim, size in [("time", None), ("y", 5), ("x", 7), ("pair", 3)]:
            nc.createDimension(dim, size)
        for name, (dtype, dims, values, attrs) in variables.items():
            var = nc.createVariable(name, dtype, dims, fill_value=attrs.pop("_FillValue", None))
            var.setncatts(attrs)
            var.set_auto_maskandscale(False)  # store the codes as given
            var[:] = np.asarray(values).astype(dtype)
    return path


def _write_lone_record(path: Path) -> Path:
    """A single record variable of 3 shorts: records are 6 bytes apart, not padded to 8."""
    with netCDF4.Dataset(path, "w", format="NETCDF3_CLASSIC") as nc:
        nc.createDimension("time", None)
        nc.createDimension("pair", 3)
        nc.createVariable("odd", "i2", ("time", "pair"))[:] = np.arange(27, dtype="i2").reshape(9, 3) - 13
    return path


@pytest.fixture(scope="module")
def classic_files(tmp_path_factory, sample_file) -> dict[str, Path]:
    directory = tmp_path_factory.mktemp("classic")
    files = {name: _write_records(directory / f"records_{name}.nc", fmt) for name, fmt in FORMATS.items()}
    files["lone_record"] = _write_lone_record(directory / "lone_record.nc")
    files["uvt"] = sample_file("uvt.nc")
    files["eraint"] = sample_file("eraint_uvz.nc")
    files["trefht"] = sample_file("TREFHT.B06.57.atm.1890-1999ANN.nc")
    return files


def _xarray_values(path: Path, name: str, box: list[tuple[int, int]]) -> np.ndarray:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", xr.SerializationWarning)  # the stand-in's NaN _FillValue on int16
        with xr.open_dataset(path, decode_times=False) as ds:
            selection = {d: slice(*r) for d, r in zip(ds[name].dims, box)}
            return ds[name].isel(selection).values


def _assert_identical(got: np.ndarray, expected: np.ndarray) -> None:
    assert got.dtype == expected.dtype and got.shape == expected.shape
    assert got.tobytes() == expected.tobytes()  # bit for bit: NaN positions and payloads too


def _boxes(shape: tuple[int, ...]):
    def one(n: int):
        return st.tuples(st.integers(0, n - 1), st.integers(1, n)).map(lambda r: (min(r), max(r[1], min(r) + 1)))

    return st.tuples(*[st.one_of(st.just((0, n)), one(n)) for n in shape]).map(list)


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_box_of_any_variable_equals_xarray(classic_files, data):
    name = data.draw(st.sampled_from(sorted(classic_files)))
    path = classic_files[name]
    header = read_header(path.open("rb"))
    variable = header.variables[data.draw(st.sampled_from(sorted(header.variables)))]
    box = data.draw(_boxes(variable.shape))
    remote = RemoteFile(str(path))
    _assert_identical(
        read_box(remote.fetch, variable, header.record_size, box), _xarray_values(path, variable.name, box)
    )
    assert remote.bytes_read <= 1.25 * variable.dtype.itemsize * math.prod(b - a for a, b in box)


@pytest.mark.parametrize("name", ["cdf1", "cdf2", "cdf5", "lone_record", "uvt", "eraint", "trefht"])
def test_every_variable_whole_and_in_boxes_across_records(classic_files, name):
    path = classic_files[name]
    header = read_header(path.open("rb"))
    for variable in header.variables.values():
        shape = variable.shape
        boxes = [
            [(0, n) for n in shape],
            [(n - 1, n) for n in shape],  # the last element (of the last record)
            [(n // 3, max(n // 3 + 1, n - 1)) for n in shape],  # cut on every dim: runs inside records
        ]
        if variable.is_record:
            boxes.append([(1, shape[0]), *[(0, n) for n in shape[1:]]])  # whole records, crossing many
        for box in boxes:
            got = read_box(RemoteFile(str(path)).fetch, variable, header.record_size, box)
            _assert_identical(got, _xarray_values(path, variable.name, box))


def test_fill_and_missing_values_become_nan_where_xarray_puts_them(classic_files):
    path = classic_files["cdf2"]
    header = read_header(path.open("rb"))
    for name, dtype in [("packed", "float32"), ("wide", "float64"), ("temp", "float32"), ("orography", "float32")]:
        variable = header.variables[name]
        box = [(0, n) for n in variable.shape]
        got = read_box(RemoteFile(str(path)).fetch, variable, header.record_size, box)
        assert str(got.dtype) == dtype and np.isnan(got).any()
        _assert_identical(got, _xarray_values(path, name, box))
    flag = header.variables["flag"]  # _Unsigned bytes with a fill value: decoded to float32 with NaN
    got = read_box(RemoteFile(str(path)).fetch, flag, header.record_size, [(0, n) for n in flag.shape])
    assert got.dtype == np.float32 and np.nanmax(got) > 127


def test_rows_spanning_the_inner_dims_are_read_without_a_wasted_byte(classic_files):
    path = classic_files["uvt"]
    header = read_header(path.open("rb"))
    variable = header.variables["T"]  # (time, lev, lat, lon), fixed size
    box = [(0, 1), (2, 9), (10, 30), (0, 128)]
    starts, length = variable_runs(variable, header.record_size, box)
    assert len(starts) == 7 and length == 20 * 128 * 4  # one run per level
    assert len(merge_ranges(starts, starts + length)) == 7  # the gaps (44 rows) are longer than the runs
    remote = RemoteFile(str(path))
    read_box(remote.fetch, variable, header.record_size, box)
    assert remote.bytes_read == 4 * math.prod(b - a for a, b in box)


def test_small_gaps_between_records_are_bridged(classic_files):
    header = read_header(classic_files["trefht"].open("rb"))
    variable = header.variables["TREFHT"]  # each record also holds the 8-byte time value
    starts, length = variable_runs(variable, header.record_size, [(3, 40), (0, 64), (0, 128)])
    assert len(starts) == 37
    (only,) = merge_ranges(starts, starts + length)
    assert only[1] - only[0] == 37 * length + 36 * 8


def test_the_lone_record_variable_is_not_padded(classic_files):
    header = read_header(classic_files["lone_record"].open("rb"))
    assert header.record_size == 6
    records = read_header(classic_files["cdf1"].open("rb"))
    odd, flag = records.variables["odd"], records.variables["flag"]
    assert odd.is_record and flag.is_record and records.record_size % 4 == 0


@pytest.mark.parametrize("name", ["cdf1", "cdf2", "cdf5", "lone_record", "uvt", "eraint", "trefht"])
def test_expected_size_is_the_file_size(classic_files, name):
    path = classic_files[name]
    # netCDF-C may pad the last record; scipy (the stand-in) writes exactly what the header needs.
    assert 0 <= path.stat().st_size - expected_size(path.open("rb")) < 8


def test_a_header_larger_than_the_first_read_is_read_whole(tmp_path):
    path = tmp_path / "long_header.nc"
    with netCDF4.Dataset(path, "w", format="NETCDF3_CLASSIC") as nc:
        nc.history = "x" * (3 * HEADER_BYTES)
        nc.createDimension("x", 4)
        nc.createVariable("v", "f4", ("x",))[:] = np.arange(4)
    remote = RemoteFile(str(path))
    header = remote.classic_header()
    assert header.variables["v"].begin > 3 * HEADER_BYTES
    assert read_box(remote.fetch, header.variables["v"], header.record_size, [(1, 3)]).tolist() == [1.0, 2.0]


def test_a_netcdf4_file_has_no_classic_header(sample_file):
    assert RemoteFile(str(sample_file("nc4uvt.nc"))).classic_header() is None
