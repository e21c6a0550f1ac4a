"""An append's checks (planning.run.generations) and its stored accumulators (exact through JSON)."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from planning.run.contracts import NonFinite
from planning.run.generations import (
    Held,
    HeldFile,
    HeldRange,
    NothingToAppend,
    check_config,
    dumps,
    files_fingerprint,
    generation_entry,
    held_of,
    held_range,
    loads,
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
    assert held_range(_held(), "time", VALUES, FILES) == HeldRange(0, 4, 0)


def test_nothing_new_is_not_an_error():
    with pytest.raises(NothingToAppend, match="nothing to append"):
        held_range(_held(8), "time", VALUES, FILES)


def test_earlier_steps_are_new_and_move_the_index_origin_back():
    # Held: the middle files, as their own build fingerprinted them (ranges from its first step).
    middle = [HeldFile(f.path, f.start - 2, f.stop - 2, f.nbytes) for f in FILES[1:3]]
    held = Held(1, 4, VALUES[2], VALUES[5], files_fingerprint(middle))
    assert held_range(held, "time", VALUES, FILES) == HeldRange(2, 6, 2)
    # After an earlier backfill the origin adds up: index 0 stays generation 0's first step.
    assert held_range(dataclasses.replace(held, origin=3), "time", VALUES, FILES).origin == 5
    assert held_range(held, "time", VALUES[2:], None) == HeldRange(0, 4, 0)  # (a store: no files)
    with pytest.raises(UserError, match="not those the output was built from"):
        held_range(held, "time", VALUES, [FILES[0], HeldFile(FILES[1].path, 2, 4, 999), *FILES[2:]])  # resized


def test_a_file_straddling_the_first_held_step_is_refused():
    held = Held(1, 4, VALUES[2], VALUES[5], None)
    straddling = [HeldFile("/a/x.nc", 0, 3, 5), HeldFile("/a/y.nc", 3, 8, 5)]
    with pytest.raises(UserError, match=r"/a/x\.nc holds time steps on both sides of 2020-01-03"):
        held_range(held, "time", VALUES, straddling)


def test_held_files_missing_from_the_input_are_refused():
    with pytest.raises(UserError, match="every file the output was built from"):
        held_range(_held(), "time", VALUES[4:], FILES[2:])


def test_steps_changed_inside_the_held_range_are_refused():
    changed = [*VALUES[:3], "2020-01-03T12", *VALUES[4:]]
    with pytest.raises(UserError, match="overlap or change the steps it holds"):
        held_range(_held(), "time", changed, FILES)


def test_a_file_straddling_the_last_held_step_is_refused():
    straddling = [*FILES[:1], HeldFile("/a/x.nc", 2, 6, 5), *FILES[3:]]
    with pytest.raises(UserError, match=r"/a/x\.nc holds time steps on both sides"):
        held_range(_held(), "time", VALUES, straddling)


def test_a_held_file_replaced_or_resized_is_refused():
    resized = [HeldFile(FILES[0].path, 0, 2, 999), *FILES[1:]]
    with pytest.raises(UserError, match="not those the output was built from"):
        held_range(_held(), "time", VALUES, resized)


def test_a_held_file_with_another_version_is_refused_by_name():
    """Same path, size and range, written again: its version (mtime, inode, ctime; a GCS generation) tells."""
    versioned = [dataclasses.replace(f, version=f"mtime_ns={i}") for i, f in enumerate(FILES)]
    entry = generation_entry(0, 4, VALUES[0], VALUES[3], versioned, store=False)
    held = held_of([entry], "generations.json")
    assert held_range(held, "time", VALUES, versioned) == HeldRange(0, 4, 0)
    rewritten = [versioned[0], dataclasses.replace(versioned[1], version="mtime_ns=99"), *versioned[2:]]
    known = {(f.path, f.nbytes, f.version) for f in versioned}  # the last run's listing (its inventory cache)
    with pytest.raises(UserError, match=r"input: /a/1\.nc changed since the output was built from it"):
        held_range(held, "time", VALUES, rewritten, known)
    with pytest.raises(UserError, match=r"input: a file holding 2020-01-01 to 2020-01-04 changed since"):
        held_range(held, "time", VALUES, rewritten)  # (no cache to name it by)
    # A file after the held steps may have any version: it is new.
    assert held_range(held, "time", VALUES, [*versioned[:2], dataclasses.replace(versioned[2], version="x")])
    # Recorded before versions were: checked by path, size and range only.
    assert held_range(dataclasses.replace(held, versions=None), "time", VALUES, rewritten) == HeldRange(0, 4, 0)
    with pytest.raises(UserError, match="records no steps held"):
        held_of([{**entry, "versions": 7}], "generations.json")


def test_a_store_is_checked_by_its_steps_alone():
    assert held_range(Held(1, 4, VALUES[0], VALUES[3], None), "time", VALUES, None) == HeldRange(0, 4, 0)


def test_positions_within_the_held_steps_are_not_cut_again():
    window = Axis.window("time", 8, 3, 1)  # positions 0..5; those ending by step 4 are held
    assert held_positions(window, HeldRange(0, 4, 0)).tolist() == [True, True, False, False, False, False]
    strided = Axis.window("time", 8, 2, 2)  # positions 0..3 start at 0, 2, 4, 6
    assert held_positions(strided, HeldRange(0, 5, 0)).tolist() == [True, True, False, False]
    assert held_positions(strided, HeldRange(2, 6, 2)).tolist() == [False, True, True, False]  # (after a backfill)


def test_a_config_difference_names_its_key_and_the_input_files_may_differ():
    built = {"input": {"paths": ["a"], "concat_dim": "time"}, "sample": {"window": {"lat": {"size": 8}}}}
    check_config(built, {**built, "input": {"paths": ["a", "b"], "concat_dim": "time"}})
    changed = {**built, "sample": {"window": {"lat": {"size": 9}}}}
    with pytest.raises(UserError, match=r"^sample\.window\.lat\.size: 9 differs from the 8"):
        check_config(built, changed)


def test_keys_added_since_an_output_was_built_mean_their_defaults():
    """An output of an earlier version lacks the config keys added since: they are not a difference."""
    from planning.config.model import json_default

    now = {"input": {"paths": ["a"]}, "stats": {"per": [], "tendency": False}, "sample": {"time_features": []}}
    built = {"input": {"paths": ["a"]}, "stats": {"per": []}, "sample": {}}
    check_config(built, now, json_default)
    with pytest.raises(UserError, match=r"^stats\.tendency: True differs from the False"):
        check_config(built, {**now, "stats": {"per": [], "tendency": True}}, json_default)
    with pytest.raises(UserError, match=r"^sample\.time_features"):
        check_config(built, {**now, "sample": {"time_features": ["year_progress"]}}, json_default)
    with pytest.raises(UserError, match=r"^sample\.time_features: \[\] differs from the None"):
        check_config(built, now)  # (without defaults, a missing key is a difference)
    assert json_default("stats") == {"per": [], "reference_split": None, "over": "samples", "tendency": False}
    assert json_default("output.path") is None and json_default("no.such.key") is None


def test_the_record_is_read_for_the_committed_generations_only():
    entries = [{"generation": 0, "steps": 4, "first": "a", "last": "b", "fingerprint": "f"}]
    text = dumps([*entries, {"generation": 1, "steps": 6}])  # the second: an append that never committed
    assert held_of(loads(text, "g.json", 1), "g.json") == Held(1, 4, "a", "b", "f")
    backfilled = dumps([{**entries[0], "origin": 2}])
    assert held_of(loads(backfilled, "g.json", 1), "g.json").origin == 2
    edited = [{**entries[0], "origin": origin} for origin in (-1, 4, "2")]
    malformed = ("{}", "[1]", dumps([{"generation": 3}]), dumps([{"generation": 0, "steps": "x"}]))
    for bad in (*malformed, *(dumps([e]) for e in edited)):
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
