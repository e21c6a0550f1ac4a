"""An append's checks (planning.run.generations) and its stored accumulators (exact through JSON)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from planning.run.contracts import NonFinite
from planning.run.generations import (
    Held,
    HeldFile,
    NothingToAppend,
    check_config,
    dumps,
    files_fingerprint,
    held_of,
    loads,
    new_steps,
)
from planning.sampling import Axis
from planning.splits import held_positions
from schemas.errors import UserError
from transforms.stats import Moments, SplitSummary, summary_from_json, summary_to_json

VALUES = [f"2020-01-{day:02d}" for day in range(1, 9)]  # eight daily steps, as schema.json writes them
FILES = [HeldFile(f"/a/{i}.nc", 2 * i, 2 * i + 2, 100 + i) for i in range(4)]  # two steps each


def _held(steps: int = 4, files=FILES) -> Held:
    held = [f for f in files if f.stop <= steps]
    return Held(1, steps, VALUES[0], VALUES[steps - 1], files_fingerprint(held))


def test_the_steps_after_the_held_ones_are_new():
    assert new_steps(_held(), "time", VALUES, FILES) == 4


def test_nothing_new_is_not_an_error():
    with pytest.raises(NothingToAppend, match="nothing to append"):
        new_steps(_held(8), "time", VALUES, FILES)


def test_earlier_steps_are_refused():
    with pytest.raises(UserError, match="come before the output's first"):
        new_steps(Held(1, 2, VALUES[2], VALUES[3], None), "time", VALUES, FILES)


def test_held_files_missing_from_the_input_are_refused():
    with pytest.raises(UserError, match="every file the output was built from"):
        new_steps(_held(), "time", VALUES[4:], FILES[2:])


def test_steps_changed_inside_the_held_range_are_refused():
    changed = [*VALUES[:3], "2020-01-03T12", *VALUES[4:]]
    with pytest.raises(UserError, match="overlap or change the steps it holds"):
        new_steps(_held(), "time", changed, FILES)


def test_a_file_straddling_the_last_held_step_is_refused():
    straddling = [*FILES[:1], HeldFile("/a/x.nc", 2, 6, 5), *FILES[3:]]
    with pytest.raises(UserError, match=r"/a/x\.nc holds time steps on both sides"):
        new_steps(_held(), "time", VALUES, straddling)


def test_a_held_file_replaced_or_resized_is_refused():
    resized = [HeldFile(FILES[0].path, 0, 2, 999), *FILES[1:]]
    with pytest.raises(UserError, match="not those the output was built from"):
        new_steps(_held(), "time", VALUES, resized)


def test_a_store_is_checked_by_its_steps_alone():
    assert new_steps(Held(1, 4, VALUES[0], VALUES[3], None), "time", VALUES, None) == 4


def test_positions_within_the_held_steps_are_not_cut_again():
    window = Axis.window("time", 8, 3, 1)  # positions 0..5; those ending by step 4 are held
    assert held_positions(window, 4).tolist() == [True, True, False, False, False, False]
    strided = Axis.window("time", 8, 2, 2)  # positions 0..3 start at 0, 2, 4, 6
    assert held_positions(strided, 5).tolist() == [True, True, False, False]


def test_a_config_difference_names_its_key_and_the_input_files_may_differ():
    built = {"input": {"paths": ["a"], "concat_dim": "time"}, "sample": {"window": {"lat": {"size": 8}}}}
    check_config(built, {**built, "input": {"paths": ["a", "b"], "concat_dim": "time"}})
    changed = {**built, "sample": {"window": {"lat": {"size": 9}}}}
    with pytest.raises(UserError, match=r"^sample\.window\.lat\.size: 9 differs from the 8"):
        check_config(built, changed)


def test_the_record_is_read_for_the_committed_generations_only():
    entries = [{"generation": 0, "steps": 4, "first": "a", "last": "b", "fingerprint": "f"}]
    text = dumps([*entries, {"generation": 1, "steps": 6}])  # the second: an append that never committed
    assert held_of(loads(text, "g.json", 1), "g.json") == Held(1, 4, "a", "b", "f")
    for bad in ("{}", "[1]", dumps([{"generation": 3}]), dumps([{"generation": 0, "steps": "x"}])):
        with pytest.raises(UserError, match=r"g\.json"):
            held_of(loads(bad, "g.json", 1), "g.json")


def test_accumulators_round_trip_through_json_exactly():
    rng = np.random.default_rng(0)
    values = (rng.standard_normal((50, 3, 7)) * 1e3 + 250).astype(np.float32)
    values[0, 0, 0] = np.nan
    moments = Moments.of(values, keep_axes=[1]).merge(Moments.of(values[:3] * 1.1, keep_axes=[1]))
    empty = Moments.of(values[:0], keep_axes=[1])  # min inf, max -inf: JSON keeps them
    summary = SplitSummary({"t": moments, "e": empty}, 53, 1, 2, {"d": NonFinite(10, 1, 2, 3)})
    back = summary_from_json(json.loads(json.dumps(summary_to_json(summary))))
    assert (back.cut, back.dropped_nan, back.with_nan, back.nonfinite) == (53, 1, 2, summary.nonfinite)
    for name, m in summary.moments.items():
        for field in ("count", "mean", "m2", "minimum", "maximum", "nan_count", "inf_count", "filled_count"):
            got, want = getattr(back.moments[name], field), getattr(m, field)
            assert got.dtype == want.dtype and np.array_equal(got, want), (name, field)
