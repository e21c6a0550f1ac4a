"""NetCDF-4 boxes read through h5py's low-level API equal xarray's, and files unlike the first are refused."""

from __future__ import annotations

import warnings
from pathlib import Path

import fsspec
import netCDF4
import numpy as np
import pytest
import xarray as xr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planning.config import parse_config
from planning.formats.hdf5_reads import prefetched, read_box
from planning.formats.remote_files import RemoteFile
from planning.formats.sources import SourceFile
from planning.inputs.local_probe import probe_local, probe_local_files
from planning.plan import make_plan
from planning.reads.slabs import read_slabs
from planning.run.variables import VariablePlan
from planning.specs import cut_spec
from schemas.errors import UserError
from transforms.cut import cut_pieces, read_unit

DIMS = ("time", "y", "x")
SHAPE = (6, 5, 7)


def _write(path: Path, variables: dict, fmt: str = "NETCDF4", time_values=None, unlimited: bool = True) -> Path:
    """A NetCDF-4 file of ``variables`` {name: (dtype, attrs, codes, create options)} on (time, y, x).

    ``unlimited``: time an unlimited dim, which makes every variable chunked; else those without a
    filter are stored contiguously.
    """
    with netCDF4.Dataset(path, "w", format=fmt) as nc:
        for dim, size in zip(DIMS, (None if unlimited else SHAPE[0], *SHAPE[1:])):
            nc.createDimension(dim, size)
        if time_values is not None:
            time = nc.createVariable("time", "f8", ("time",))
            time.units = "hours since 2000-01-01"
            time[:] = time_values
        for name, (dtype, attrs, codes, options) in variables.items():
            attrs = dict(attrs)
            var = nc.createVariable(name, dtype, DIMS, fill_value=attrs.pop("_FillValue", None), **options)
            var.setncatts(attrs)
            var.set_auto_maskandscale(False)  # store the codes as given
            var[:] = codes
    return path


def _codes(dtype: str, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    info = np.iinfo(dtype) if np.dtype(dtype).kind in "iu" else None
    values = rng.integers(info.min, info.max, SHAPE, endpoint=True) if info else rng.normal(0, 50, SHAPE)
    return values.astype(dtype)


def _packed(dtype: str, **attrs):
    return (dtype, attrs, _codes(dtype), {})


#: Every encoding xarray decodes on opening: packing, fills, missing values, unsigned bytes, booleans.
ENCODINGS = {
    "plain_f4": ("f4", {}, _codes("f4"), {}),
    "nan_fill_f4": ("f4", {"_FillValue": np.float32(np.nan)}, _codes("f4"), {}),
    "fill_f8": ("f8", {"_FillValue": -9.0, "missing_value": 1e20}, np.where(_codes("f8") > 40, -9.0, _codes("f8")), {}),
    "packed_i2": _packed(
        "i2", scale_factor=np.float32(0.01), add_offset=np.float32(273.15), _FillValue=np.int16(-32767)
    ),
    "packed_f8_scale": _packed("i2", scale_factor=0.5, add_offset=-3.0),
    "fill_on_int": _packed("i2", _FillValue=np.int16(7), scale_factor=np.float32(2.0)),
    "unsigned_i1": _packed("i1", _Unsigned="true", _FillValue=np.int8(-1)),
    "native_u2": _packed("u2", missing_value=np.uint16(65535)),
    "boolean": ("i1", {"dtype": "bool"}, (_codes("i1") > 0).astype("i1"), {}),
    "chunked_zlib": ("f4", {"_FillValue": np.float32(-1.0)}, _codes("f4"), {"zlib": True, "chunksizes": (2, 3, 4)}),
    "shuffled_i4": ("i4", {"scale_factor": np.float32(1e-3)}, _codes("i4"), {"zlib": True, "shuffle": True}),
    "big_endian": (">f4", {}, _codes(">f4"), {"endian": "big"}),
}


@pytest.fixture(scope="module")
def encoded_file(tmp_path_factory) -> Path:
    return _write(tmp_path_factory.mktemp("hdf5") / "encodings.nc", ENCODINGS)


@pytest.fixture(scope="module")
def contiguous_file(tmp_path_factory) -> Path:
    """The encodings on fixed dims: those without a filter stored contiguously."""
    return _write(tmp_path_factory.mktemp("hdf5") / "contiguous.nc", ENCODINGS, unlimited=False)


@pytest.fixture(scope="module")
def remote_encoded(contiguous_file) -> str:
    """The contiguous file as a remote worker reads it: through fsspec, by byte ranges (a memory:// file)."""
    url = "memory://hdf5-reads/contiguous.nc"
    fsspec.filesystem("memory").pipe(url, contiguous_file.read_bytes())
    yield url
    fsspec.filesystem("memory").rm(url)


def _xarray(path: Path, name: str, box: dict) -> np.ndarray:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", xr.SerializationWarning)
        with xr.open_dataset(path, decode_times=False) as ds:
            return ds[name].isel({d: slice(*r) for d, r in box.items()}).values


def _plan(name: str, dtype: str) -> VariablePlan:
    return VariablePlan(name, DIMS, dtype, feature=None)


def _box(draw_range) -> dict:
    return {d: draw_range(n) for d, n in zip(DIMS, SHAPE)}


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_box_of_any_encoding_equals_xarray_bit_for_bit(encoded_file, contiguous_file, remote_encoded, data):
    name = data.draw(st.sampled_from(sorted(ENCODINGS)))
    remote = data.draw(st.booleans())  # a remote file's contiguous boxes are copied from its prefetched bytes
    if remote:
        encoded_file = contiguous_file

    def draw_range(n):
        start = data.draw(st.integers(0, n - 1))
        return start, data.draw(st.integers(start, n))  # empty boxes too

    box = _box(draw_range)
    expected = _xarray(encoded_file, name, box)
    plans = [_plan(name, str(expected.dtype))]
    if remote:
        got = read_box(prefetched(RemoteFile(remote_encoded), plans, box), plans, box, remote_encoded)
    else:
        got = read_box(str(encoded_file), plans, box)
    if name == "big_endian":
        assert got is None  # left to xarray, which swaps the bytes as it likes
        return
    assert got is not None, name
    value = got[name]
    assert (value.dtype, value.shape) == (expected.dtype, expected.shape), name
    assert value.tobytes() == expected.tobytes(), name  # NaN positions and payloads too


def test_what_h5py_cannot_read_is_left_to_xarray(encoded_file, tmp_path):
    box = {d: (0, n) for d, n in zip(DIMS, SHAPE)}
    assert read_box(str(encoded_file), [_plan("absent", "f4")], box) is None
    assert read_box(str(encoded_file), [_plan("plain_f4", "f4")], {**box, "x": (0, SHAPE[2] + 1)}) is None
    classic = _write(tmp_path / "classic.nc", {"v": ENCODINGS["plain_f4"]}, fmt="NETCDF3_CLASSIC")
    assert read_box(str(classic), [_plan("v", "f4")], box) is None


def _archive(directory: Path, dtypes: list[str], shapes=None) -> list[SourceFile]:
    files, start = [], 0
    for index, dtype in enumerate(dtypes):
        codes = _codes("f8", index).astype(dtype)
        if shapes and shapes[index] != SHAPE:
            codes = np.zeros(shapes[index], dtype)
        path = directory / f"part{index}.nc"
        with netCDF4.Dataset(path, "w") as nc:
            for dim, size in zip(DIMS, (None, *codes.shape[1:])):
                nc.createDimension(dim, size)
            nc.createVariable("t", dtype, DIMS)[:] = codes
        files.append(SourceFile(str(path), start, start + SHAPE[0], path.stat().st_size))
        start += SHAPE[0]
    return files


def test_a_file_whose_variable_decodes_to_another_dtype_is_refused_in_one_line(tmp_path):
    files = _archive(tmp_path, ["f4", "f4", "f8"])
    box = {"time": (0, 18), "y": (0, 5), "x": (0, 7)}
    with pytest.raises(UserError) as error:
        read_slabs(files, "time", [_plan("t", "float32")], box)
    message = str(error.value)
    assert "\n" not in message and "part2.nc" in message and "'t'" in message and "float64" in message
    # The same files up to the odd one read fine, and equal xarray's values.
    got = read_slabs(files[:2], "time", [_plan("t", "float32")], {**box, "time": (0, 12)}).values["t"]
    with xr.open_mfdataset([f.path for f in files[:2]], combine="nested", concat_dim="time") as ds:
        np.testing.assert_array_equal(got, ds.t.values)


def test_a_file_whose_variable_has_other_sizes_is_refused_in_one_line(tmp_path):
    files = _archive(tmp_path, ["f4", "f4"], shapes=[SHAPE, (SHAPE[0], 4, 7)])
    with pytest.raises(UserError) as error:
        read_slabs(files, "time", [_plan("t", "float32")], {"time": (0, 12), "y": (0, 5), "x": (0, 7)})
    assert "part1.nc" in str(error.value) and "(6, 4, 7)" in str(error.value)


def _steps(directory: Path, count: int, **variables) -> list[tuple[str, int]]:
    paths = []
    for index in range(count):
        path = _write(
            directory / f"step{index:04d}.nc",
            variables or {"t": ENCODINGS["plain_f4"]},
            time_values=np.arange(6) + 6 * index,
        )
        paths.append((str(path), path.stat().st_size))
    return paths


def test_the_local_probe_reads_the_concat_coordinate_and_tells_grids_apart(tmp_path):
    (a, size_a), (b, size_b) = _steps(tmp_path, 2)
    first, second = probe_local(a, size_a, "time"), probe_local(b, size_b, "time")
    assert first.fingerprint == second.fingerprint and first.sizes == {"time": 6, "y": 5, "x": 7}
    np.testing.assert_array_equal(second.concat_raw, np.arange(6) + 6.0)
    assert second.concat_attrs == {"units": "hours since 2000-01-01"}
    # A dim without a coordinate variable is no coordinate (its dimension scale holds no values).
    assert probe_local(a, size_a, "y").concat_raw is None
    # Another grid (a y coordinate with other values) is another structure.
    other = tmp_path / "other.nc"
    with netCDF4.Dataset(other, "w") as nc:
        for dim, size in zip(DIMS, (None, *SHAPE[1:])):
            nc.createDimension(dim, size)
        nc.createVariable("y", "f8", ("y",))[:] = np.arange(5) * 2.0
        nc.createVariable("t", "f4", DIMS)[:] = _codes("f4")
    again = tmp_path / "again.nc"
    with netCDF4.Dataset(again, "w") as nc:
        for dim, size in zip(DIMS, (None, *SHAPE[1:])):
            nc.createDimension(dim, size)
        nc.createVariable("y", "f8", ("y",))[:] = np.arange(5) * 3.0
        nc.createVariable("t", "f4", DIMS)[:] = _codes("f4")
    fingerprints = {probe_local(str(p), p.stat().st_size, "time").fingerprint for p in (other, again)}
    assert len(fingerprints) == 2


def test_a_grouped_file_is_left_to_the_full_look(tmp_path):
    path = tmp_path / "grouped.nc"
    with netCDF4.Dataset(path, "w") as nc:
        nc.createGroup("inner").createDimension("time", 3)
    assert probe_local_files([(str(path), path.stat().st_size)], "time") == [None]


def test_units_hold_whole_netcdf4_chunks_and_cut_the_samples_of_a_contiguous_copy(tmp_path):
    """A variable chunked 4 along y: units start and end only where chunks do, whatever the budget, and are cut
    in pieces on the worker; the samples are those a contiguous copy of the file gives."""
    values = np.random.default_rng(0).normal(size=(3, 16, 8)).astype("f4")
    plans = {}
    for name, options in (("chunked", {"chunksizes": (1, 4, 8)}), ("contiguous", {"contiguous": True})):
        directory = tmp_path / name
        directory.mkdir()
        with netCDF4.Dataset(directory / "a.nc", "w") as nc:
            for dim, size in zip(DIMS, (3, 16, 8)):
                nc.createDimension(dim, size)
            nc.createVariable("time", "f8", ("time",))[:] = np.arange(3)
            nc["time"].units = "hours since 2000-01-01"
            nc.createVariable("v", "f4", DIMS, **options)[:] = values
        config = parse_config(
            {
                "input": {"paths": str(directory / "*.nc")},
                "variables": ["v"],
                "sample": {"window": {"y": {"size": 2, "stride": 2}, "x": 8}},
                "output": {"path": str(tmp_path / "out")},
            }
        )
        plans[name] = make_plan(config, unit_budget_bytes=300)  # under one chunk: 1 KB a step
    chunked, contiguous = plans["chunked"], plans["contiguous"]
    assert {u.ranges[1] for u in chunked.units} == {(0, 2), (2, 4), (4, 6), (6, 8)}  # y positions 2p: 4 a chunk
    assert chunked.pieces and not contiguous.pieces and len(contiguous.units) > len(chunked.units)
    blocks = {}
    for name, plan in plans.items():
        spec = cut_spec(plan)
        found = [
            b.samples.to_dataset() for u in plan.units for b in cut_pieces(spec, u, read_unit(spec, plan.sources, u))
        ]
        blocks[name] = xr.concat(found, "sample").sortby("sample_id")
    xr.testing.assert_identical(blocks["chunked"], blocks["contiguous"])


def test_dimension_scales_read_by_offset_equal_hdf5_reads(tmp_path):
    """Plainly stored scales are read by offset, others through HDF5: the values are HDF5's either way,
    also big-endian and behind a user block (offsets count from the file's start)."""
    import functools
    import os

    import h5py

    from planning.inputs.local_probe import _contiguous_layout, _scale_values, stored_offset

    path = tmp_path / "scales.h5"
    values = np.linspace(-90, 90, 11)
    with h5py.File(path, "w", userblock_size=512) as file:
        file.create_dataset("plain", data=values)
        file.create_dataset("big_endian", data=values.astype(">f4"))
        file.create_dataset("ints", data=np.arange(7, dtype="<i8"))
        file.create_dataset("compressed", data=values, chunks=(4,), compression="gzip")
        file.create_dataset("unwritten", shape=(3,), dtype="f8", fillvalue=-1.0)
    with h5py.File(path, "r") as file, open(path, "rb", buffering=0) as stream:
        read_at = functools.partial(os.pread, stream.fileno())
        for name in ("plain", "big_endian", "ints", "compressed", "unwritten"):
            expected = file[name][()]
            got = _scale_values(file[name].id, read_at)
            assert got.dtype == expected.dtype and np.array_equal(got, expected), name
        assert stored_offset(file["plain"].id) >= 512  # the user block is counted: a read by offset lands right
        # Never written: no offset (HDF5 gives the user block's size less one), so no read by offset.
        assert stored_offset(file["unwritten"].id) is None
        assert _contiguous_layout(file.id, b"unwritten", read_at) is None
        assert _contiguous_layout(file.id, b"plain", read_at)[0] == stored_offset(file["plain"].id)


def test_a_remote_contiguous_box_is_copied_from_its_prefetched_bytes(contiguous_file, remote_encoded, monkeypatch):
    import planning.formats.hdf5_reads as hdf5_reads

    box = {"time": (1, 5), "y": (1, 4), "x": (2, 6)}

    def read(name):
        plans = [_plan(name, str(_xarray(contiguous_file, name, box).dtype))]
        return read_box(prefetched(RemoteFile(remote_encoded), plans, box), plans, box, remote_encoded)[name]

    def h5py_read(*args):
        raise AssertionError("read through h5py")

    monkeypatch.setattr(hdf5_reads, "_read_stored", h5py_read)
    for name in ("plain_f4", "packed_i2", "unsigned_i1", "boolean"):  # contiguous: never through h5py
        assert read(name).tobytes() == _xarray(contiguous_file, name, box).tobytes(), name
    with pytest.raises(AssertionError, match="through h5py"):
        read("chunked_zlib")  # chunked (when no unit's chunk ledger is open): h5py decodes its chunks
