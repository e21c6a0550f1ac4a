"""input.new_dim: members read from file names, ordered as numbers where every name gives one."""

from __future__ import annotations

import pytest

from planning.inputs.input_config import NewDimConfig
from planning.inputs.members import group_by_member
from planning.inputs.metadata import FileInfo
from schemas.errors import UserError


def _files(*names: str) -> list[FileInfo]:
    return [FileInfo(f"gs://bucket/run/{name}", 1, {"time": 1}, {}, {}, {}) for name in names]


def _grouped(pattern: str, *names: str) -> list[tuple[object, list[str]]]:
    groups = group_by_member(_files(*names), NewDimConfig(name="member", pattern=pattern))
    return [(value, [f.path.rsplit("/", 1)[1] for f in files]) for value, files in groups]


def test_numbers_order_as_numbers_and_a_member_keeps_its_files_in_listed_order():
    grouped = _grouped(r"\.(-?\d+)\.", "r.10.a.nc", "r.9.a.nc", "r.10.b.nc", "r.-1.a.nc")
    assert grouped == [(-1, ["r.-1.a.nc"]), (9, ["r.9.a.nc"]), (10, ["r.10.a.nc", "r.10.b.nc"])]
    assert all(isinstance(value, int) for value, _ in grouped)


def test_names_that_are_not_all_numbers_stay_text():
    assert _grouped(r"_(r\d+i1p1)_", "tas_r10i1p1_.nc", "tas_r2i1p1_.nc") == [
        ("r10i1p1", ["tas_r10i1p1_.nc"]),
        ("r2i1p1", ["tas_r2i1p1_.nc"]),
    ]


def test_the_pattern_is_searched_in_the_name_not_the_directory():
    files = [FileInfo("/data/ens.7/tas.nc", 1, {}, {}, {}, {})]
    with pytest.raises(UserError, match=r"^/data/ens.7/tas.nc: its name does not match input.new_dim.from"):
        group_by_member(files, NewDimConfig(name="member", pattern=r"ens\.(\d+)"))


def test_an_optional_group_that_matched_nothing_is_no_value():
    with pytest.raises(UserError, match="its name does not match"):
        _grouped(r"tas(\d+)?\.nc", "tas1.nc", "tas.nc")


def test_the_config_key_is_from():
    config = NewDimConfig.model_validate({"name": "member", "from": r"(\d+)"})
    assert config.pattern == r"(\d+)" and config.model_dump(by_alias=True) == {"name": "member", "from": r"(\d+)"}


def test_a_pattern_that_backtracks_without_end_is_stopped_in_one_line():
    """(a|aa)+ before a digit tries every way to split 40 a's at every start: hours with re, bounded here."""
    with pytest.raises(UserError) as refused:
        _grouped(r"(?:a|aa)+(\d)", "a" * 40 + "_x.nc")
    assert str(refused.value).startswith(
        rf"input.new_dim.from: '(?:a|aa)+(\\d)' takes over 0.5 s to search the file name '{'a' * 40}_x.nc'"
    ), refused.value


def test_a_pattern_that_searches_quickly_is_not_stopped():
    assert _grouped(r"(?:a|aa)+_(\d)", "a" * 40 + "_1.nc") == [(1, ["a" * 40 + "_1.nc"])]
