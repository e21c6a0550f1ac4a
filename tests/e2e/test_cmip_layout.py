"""Variables from separate files: a CMIP-layout archive (one variable per file, split in periods, members) builds.

The archive is made from the real CCSM file TREFHT.B06.57: ``tas`` is its TREFHT, ``uas`` and
``vas`` are it perturbed, each variable in its own files with its own period boundaries, in
classic NetCDF and NetCDF-4, with CF bounds variables (``time_bnds``, ``lat_bnds``, ``lon_bnds``)
as CMOR writes them. Every record is compared with the xarray slice its index/* features name on
the variables merged by xarray.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

from schemas import load_schema

from helpers import build_quietly, expected_feature, parse_with_generated_parser, read_all_records, refused

TREFHT = "TREFHT.B06.57.atm.1890-1999ANN.nc"
#: each variable's periods (years, and steps of the 110 yearly steps): no two variables split alike
PERIODS = {
    "tas": (("1890-1944", slice(0, 55)), ("1945-1999", slice(55, 110))),
    "uas": (("1890-1919", slice(0, 30)), ("1920-1969", slice(30, 80)), ("1970-1999", slice(80, 110))),
    "vas": (("1890-1999", slice(0, 110)),),
}
MEMBERS = ("r1i1p1f1", "r2i1p1f1")


def _with_bounds(ds: xr.Dataset) -> xr.Dataset:
    """CF bounds for time, lat and lon, named by the coordinates' ``bounds`` attributes (as CMOR writes them)."""
    out = ds.copy()
    for dim in ("time", "lat", "lon"):
        values = ds[dim].values
        if dim == "time":
            bounds = np.stack([values, values], axis=1)
        else:
            step = np.diff(values).mean() if len(values) > 1 else 1.0
            bounds = np.stack([values - step / 2, values + step / 2], axis=1)
        out[f"{dim}_bnds"] = ((dim, "bnds"), bounds)
        out[dim].attrs["bounds"] = f"{dim}_bnds"
    return out


def write_cmip_archive(source_path: Path, directory: Path, members=MEMBERS, periods=PERIODS) -> dict[str, xr.Dataset]:
    """Each variable of each member in its own files; returns each member's variables merged by xarray."""
    directory.mkdir(parents=True, exist_ok=True)
    with xr.open_dataset(source_path) as ds:
        trefht = ds["TREFHT"].load()
    merged = {}
    for m, member in enumerate(members):
        fields = {}
        for v, name in enumerate(periods):
            values = trefht + np.float32(v * 3 + m) / 2 if v or m else trefht
            fields[name] = values.roll(lon=v * 7 + m, roll_coords=False).rename(name)
            data = _with_bounds(fields[name].to_dataset())
            data["time"].encoding["dtype"] = "float64"  # as the source stores it (fractional days)
            for i, (years, steps) in enumerate(periods[name]):
                file_format = ("NETCDF3_64BIT", "NETCDF4")[(i + v) % 2]
                path = directory / f"{name}_Amon_CCSM_historical_{member}_gn_{years}.nc"
                data.isel(time=steps).to_netcdf(path, format=file_format)
        merged[member] = xr.merge(fields.values())
    return merged


@pytest.fixture(scope="module")
def cmip(sample_file, tmp_path_factory) -> tuple[Path, dict[str, xr.Dataset]]:
    directory = tmp_path_factory.mktemp("cmip")
    return directory, write_cmip_archive(sample_file(TREFHT), directory)


def _check(records: dict, schema, reference: xr.Dataset, names=tuple(PERIODS)) -> None:
    count = len(records[names[0]])
    assert count > 0
    for i in range(count):
        record = {name: values[i] for name, values in records.items()}
        for name in names:
            np.testing.assert_array_equal(record[name], expected_feature(reference, schema, name, record))


def test_one_variable_per_file_joins_by_variable(cmip, tmp_path):
    directory, merged = cmip
    member = MEMBERS[0]
    config = {
        "input": {"paths": str(directory / f"*_{member}_*.nc")},
        "sample": {"window": {"lat": 32, "lon": 64}},
        "splits": {"train": {"time": ["1890", "1979"]}, "test": {"time": ["1980", "1999"]}},
        "output": {"path": str(tmp_path / "out")},
    }
    output = build_quietly(config, tmp_path)
    schema = load_schema(str(output))
    assert sorted(f.name for f in schema.variable_features) == ["tas", "uas", "vas"]  # not the bounds
    groups = schema.sources["variable_groups"]
    assert groups == [{"variables": [n], "files": len(PERIODS[n])} for n in ("tas", "uas", "vas")]
    assert schema.num_examples("train") == 90 * 4 and schema.num_examples("test") == 20 * 4
    for split in ("train", "test"):
        _check(parse_with_generated_parser(output, split), schema, merged[member])  # TensorFlow's own parser
    stats = json.loads((output / "stats.json").read_text())
    for name in PERIODS:
        train = merged[member][name].sel(time=slice("1890", "1979")).values.astype(np.float64)
        assert stats["variables"][name]["mean"] == pytest.approx(train.mean(), rel=1e-9)


def test_members_of_a_cmip_archive_with_a_selection(cmip, tmp_path):
    directory, merged = cmip
    config = {
        "input": {"paths": str(directory / "*.nc"), "new_dim": {"name": "member", "from": r"_(r\d+i\d+p\d+f\d+)_"}},
        "variables": ["uas", "vas"],
        # across the seam; steps from inside one uas period to inside the next
        "select": {"lon": {"min": 300, "max": 60}, "time": {"min": "1900", "max": "1960"}},
        "sample": {"window": {"time": {"size": 3, "stride": 2}, "lat": 16, "lon": 16}},
        "output": {"path": str(tmp_path / "out")},
    }
    output = build_quietly(config, tmp_path)
    schema = load_schema(str(output))
    reference = xr.concat(list(merged.values()), dim=xr.DataArray(list(MEMBERS), dims="member", name="member"))
    lon = reference["lon"].values
    east, west = np.flatnonzero(lon >= 300), np.flatnonzero(lon <= 60)
    reference = reference.isel(lon=np.concatenate([east, west])).sel(time=slice("1900", "1960"))
    records = read_all_records(output, schema)
    assert schema.sample["new_dim"]["values"] == list(MEMBERS)
    assert sorted(set(records["index/member"].tolist())) == [0, 1]
    _check(records, schema, reference, names=("uas", "vas"))


def test_variables_covering_different_steps_are_refused(cmip, tmp_path, capsys):
    directory, _ = cmip
    member = MEMBERS[0]
    paths = sorted(str(p) for p in directory.glob(f"*_{member}_*.nc") if "uas" not in p.name or "1970" not in p.name)
    message = refused({"input": {"paths": paths}, "output": {"path": str(tmp_path / "out")}}, tmp_path, capsys)
    assert "uas_Amon" in message and "'uas'" in message and "80 steps where 'tas' has 110" in message
    assert "add the missing files" in message


def test_files_sharing_some_variables_are_one_run_checked_for_the_variables_taken(cmip, tmp_path, capsys):
    """Not a join by variable: a file lacking a variable is refused where that variable is taken, not otherwise."""
    directory, merged = cmip
    both = directory.parent / "both"
    both.mkdir(exist_ok=True)
    ds = merged[MEMBERS[0]]
    ds[["tas", "uas"]].isel(time=slice(0, 55)).to_netcdf(both / "a.nc")
    ds[["tas"]].isel(time=slice(55, 110)).to_netcdf(both / "b.nc")
    config = {"input": {"paths": str(both / "*.nc")}, "output": {"path": str(tmp_path / "o")}}
    assert "b.nc: variable 'uas' is missing" in refused(config, tmp_path, capsys)
    whole = {"variables": ["tas"], "sample": {"window": {"lat": 64, "lon": 128}}}
    output = build_quietly(config | whole, tmp_path)
    assert load_schema(str(output)).num_examples("data") == 110


def test_a_member_without_a_variable_is_refused(cmip, tmp_path, capsys):
    directory, _ = cmip
    paths = sorted(str(p) for p in directory.glob("*.nc") if not (p.name.startswith("vas") and MEMBERS[1] in p.name))
    config = {
        "input": {"paths": paths, "new_dim": {"name": "member", "from": r"_(r\d+i\d+p\d+f\d+)_"}},
        "output": {"path": str(tmp_path / "out")},
    }
    message = refused(config, tmp_path, capsys)
    assert f"member {MEMBERS[1]}" in message and "'vas'" in message and "the same variables" in message


def test_a_cmip_archive_on_gs_builds_as_it_does_locally(cmip, gcs, tmp_path):
    """Remote planning (ranged probes) groups the files by variable as local planning does: the same shards."""
    from conftest import BUCKET

    directory, _ = cmip
    files = sorted(directory.glob(f"*_{MEMBERS[0]}_*.nc"))
    for path in files:
        gcs.put(str(path), f"{BUCKET}/cmip/{path.name}")
    outputs = {}
    for where, paths in (("local", [str(p) for p in files]), ("gs", f"gs://{BUCKET}/cmip/*.nc")):
        config = {
            "input": {"paths": paths},
            "sample": {"window": {"lat": 32, "lon": 32}},
            "output": {"path": str(tmp_path / where), "num_shards": 2},
        }
        outputs[where] = build_quietly(config, tmp_path, f"{where}.yaml")
    schema = load_schema(str(outputs["gs"]))
    assert schema.sources["variable_groups"] == load_schema(str(outputs["local"])).sources["variable_groups"]
    for shard in schema.splits["data"]:
        assert (outputs["gs"] / shard.file).read_bytes() == (outputs["local"] / shard.file).read_bytes()
