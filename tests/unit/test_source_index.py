"""The files' index: bisection finds exactly the files a range needs, and it survives its byte form."""

from __future__ import annotations

import dataclasses
import pickle

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from planning.config import parse_config
from planning.formats.sources import SourceFile
from planning.plan import make_plan
from planning.reads import slabs
from planning.reads.slabs import read_selected
from planning.reads.source_index import SourceIndex
from planning.specs import cut_spec, run_files


def _index(lengths: list[int]) -> SourceIndex:
    files, start = [], 0
    for i, length in enumerate(lengths):
        files.append(SourceFile(f"gs://bucket/f{i:03d}.nc", start, start + length, 1000 + i))
        start += length
    return SourceIndex.of(files)


@given(st.lists(st.integers(1, 5), min_size=1, max_size=30), st.data())
def test_overlapping_finds_exactly_the_files_a_range_reads(lengths, data):
    index = _index(lengths)
    total = sum(lengths)
    begin = data.draw(st.integers(0, total - 1))
    end = data.draw(st.integers(begin + 1, total))
    expected = [f for f in index if f.start < end and f.stop > begin]
    assert index.overlapping(begin, end) == expected


def test_with_members_each_member_finds_its_own_files():
    """input.new_dim: members cover the same steps with their own files (here split differently)."""
    files = []
    for member, lengths in enumerate([[4, 4], [2, 6], [8]]):
        start = 0
        for i, length in enumerate(lengths):
            files.append(SourceFile(f"m{member}-{i}.nc", start, start + length, 10, "", member))
            start += length
    index = SourceIndex.of(files, "member")
    assert [f.path for f in index.overlapping(3, 5, 0)] == ["m0-0.nc", "m0-1.nc"]
    assert [f.path for f in index.overlapping(3, 5, 1)] == ["m1-1.nc"]
    assert [f.path for f in index.overlapping(0, 8, 2)] == ["m2-0.nc"]
    again = SourceIndex.from_bytes(index.to_bytes())
    assert list(again) == files and again.member_dim == "member"
    assert again.fingerprint() == index.fingerprint()
    moved = [dataclasses.replace(f, member=1 - f.member) if f.member < 2 else f for f in files]
    assert SourceIndex.of(sorted(moved, key=lambda f: f.member), "member").fingerprint() != index.fingerprint()


def test_with_variable_groups_each_member_and_group_finds_its_own_files():
    """Variables from separate files: within each member, each group of variables has its own files."""
    names = (("tas",), ("uas", "vas"))
    files = []
    for member in range(2):
        for group, lengths in enumerate([[5, 3], [2, 2, 4]]):
            start = 0
            for i, length in enumerate(lengths):
                path = f"m{member}-g{group}-{i}.nc"
                files.append(SourceFile(path, start, start + length, 10, "", member, group=group))
                start += length
    index = SourceIndex.of(files, "member", group_names=names)
    assert [index.group_of(n) for n in ("tas", "uas", "vas", "time_bnds")] == [0, 1, 1, 0]
    assert [f.path for f in index.overlapping(3, 6, 0, 0)] == ["m0-g0-0.nc", "m0-g0-1.nc"]
    assert [f.path for f in index.overlapping(3, 6, 0, 1)] == ["m0-g1-1.nc", "m0-g1-2.nc"]
    assert [f.path for f in index.overlapping(0, 2, 1, 1)] == ["m1-g1-0.nc"]
    again = SourceIndex.from_bytes(index.to_bytes())
    assert list(again) == files and again.group_names == names
    assert again.fingerprint() == index.fingerprint()
    regrouped = SourceIndex.of(files, "member", group_names=(("tas",), ("uas",)))
    assert regrouped.fingerprint() != index.fingerprint()


def test_byte_form_round_trips():
    index = _index([3, 1, 4, 1, 5])
    again = SourceIndex.from_bytes(index.to_bytes())
    assert list(again) == list(index)
    assert again.fingerprint() == index.fingerprint()
    assert _index([3, 1, 4, 1, 6]).fingerprint() != index.fingerprint()


def _plan(directory, files: int, steps: int, output):
    from pipelines.demo import ArchiveShape, write_archive

    write_archive(directory, ArchiveShape(num_files=files, steps_per_file=steps, levels=2, lat=9, lon=9), seed=0)
    config = {"input": {"paths": str(directory / "*.nc")}, "variables": ["t"], "output": {"path": str(output)}}
    return make_plan(parse_config(config))


def test_the_job_graph_and_schema_do_not_grow_with_the_file_count(tmp_path):
    few = _plan(tmp_path / "few", 2, 30, tmp_path / "out")
    many = _plan(tmp_path / "many", 60, 1, tmp_path / "out")
    assert (len(few.sources), len(many.sources)) == (2, 60)
    files = [{name: file for name, (file, _) in run_files(plan, str(tmp_path / "out")).items()} for plan in (few, many)]
    sizes = [len(pickle.dumps(cut_spec(plan, files))) for plan, files in zip((few, many), files)]
    assert abs(sizes[1] - sizes[0]) < 200, sizes
    assert len(pickle.dumps(cut_spec(many))) > sizes[1] + 58 * 40  # in the spec, every file would travel
    # Less the folder's name: the schema names a few files of each archive whole, and their paths' length
    # (a worker's tmp_path under pytest-xdist is longer) is not what grows with the file count.
    schema_sizes = [len(plan.schema.dumps().replace(str(tmp_path), "")) for plan in (few, many)]
    assert abs(schema_sizes[1] - schema_sizes[0]) < 200, schema_sizes


def test_each_files_format_travels_from_its_probe_to_the_worker(tmp_path, monkeypatch):
    """The worker reads each file through the reader of the format its probe found, without telling it again;
    a format column not of this index (edited, truncated) is dropped: each file is then told from its bytes."""
    plan = _plan(tmp_path / "a", 3, 2, tmp_path / "out")
    assert plan.sources.classic is not None and plan.sources.classic.tolist() == [False] * 3
    again = SourceIndex.from_bytes(plan.sources.to_bytes())
    assert list(again) == list(plan.sources) and {f.classic for f in again} == {False}
    box = plan.grid.source_box(plan.units[0])
    expected = read_selected(plan.sources, "time", plan.variables, box, plan.selection).values["t"]

    def sniffed(path):
        raise AssertionError(f"{path}: format told again")

    monkeypatch.setattr(slabs, "is_hdf5", sniffed)
    found = read_selected(again, "time", plan.variables, box, plan.selection).values["t"]
    np.testing.assert_array_equal(found, expected)
    monkeypatch.undo()
    edited = SourceIndex.from_bytes(dataclasses.replace(plan.sources, classic=np.array([True])).to_bytes())
    assert edited.classic is None and {f.classic for f in edited} == {None}
    read = read_selected(edited, "time", plan.variables, box, plan.selection).values["t"]
    np.testing.assert_array_equal(read, expected)
