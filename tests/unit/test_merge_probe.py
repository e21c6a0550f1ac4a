"""transforms.merging.probe: a merge step records the bytes it holds only when XTF_MERGE_MEMORY asks for it."""

from __future__ import annotations

import numpy as np

from transforms.merging import probe


@probe.measured("Fold")
def fold(parts: list[np.ndarray]) -> np.ndarray:
    return np.sum(parts, axis=0)


@probe.measured("Outer")
def fold_twice(parts: list[np.ndarray]) -> np.ndarray:
    return fold([fold(parts), fold(parts)])


def test_a_marked_step_records_its_inputs_and_result_only_when_asked(tmp_path, monkeypatch):
    parts = [np.ones(10_000) for _ in range(4)]  # 80 KB each
    monkeypatch.delenv(probe.ENV, raising=False)
    assert fold(parts).sum() == 40_000
    assert probe.read_measures(tmp_path) == []  # off: nothing written anywhere
    monkeypatch.setenv(probe.ENV, str(tmp_path))
    fold(parts)
    (line,) = probe.read_measures(tmp_path)
    assert line["step"] == "Fold"
    assert 4 * 80_000 <= line["held"] < 4 * 80_000 + 2_000  # the four buffers, and little else
    assert 5 * 80_000 <= line["bytes"] < 5 * 80_000 + 2_000  # ... and the result's


def test_a_step_inside_a_measured_step_is_the_outer_ones(tmp_path, monkeypatch):
    monkeypatch.setenv(probe.ENV, str(tmp_path))
    fold_twice([np.ones(100)])
    assert [line["step"] for line in probe.read_measures(tmp_path)] == ["Outer"]


def test_shared_buffers_and_views_are_counted_once():
    base = np.ones(10_000)
    alone = probe.size_of(base)
    assert alone >= base.nbytes
    assert probe.size_of([base, base, base[:10], base[5:]]) < alone + 1_000
    assert probe.size_of([base, np.ones(10_000)]) >= 2 * base.nbytes
