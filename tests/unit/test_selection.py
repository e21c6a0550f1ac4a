"""Resolving ``select`` on coordinates, mapping the selected grid back to source runs, and the grid tolerance."""

from __future__ import annotations

import cftime
import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from planning.config import SelectRange
from planning.inputs.tolerance import coordinate_mismatch
from planning.reads.selection import Selection, runs_of
from planning.selected import resolve
from schemas.errors import UserError

EAST = {"units": "degrees_east"}
LON_360 = np.arange(0, 360, 2.5, dtype=np.float32)  # 0 .. 357.5
LON_180 = np.arange(-180, 180, 0.75, dtype=np.float32)  # ERA-Interim's
LAT_DOWN = np.linspace(90, -90, 241, dtype=np.float32)


def values_at(values, wanted, attrs=None, dim="x"):
    return values[resolve(dim, wanted, values, attrs or {})]


def test_a_range_is_inclusive_and_either_bound_optional_on_a_decreasing_grid():
    got = values_at(LAT_DOWN, SelectRange(min=30, max=60), dim="lat")
    np.testing.assert_array_equal(got, LAT_DOWN[(LAT_DOWN >= 30) & (LAT_DOWN <= 60)])
    assert got[0] == 60 and got[-1] == 30  # the file's order
    np.testing.assert_array_equal(values_at(LAT_DOWN, SelectRange(min=89.25)), [90, 89.25])
    np.testing.assert_array_equal(values_at(LAT_DOWN, SelectRange(max=-89.25)), [-89.25, -90])


def test_typed_values_match_float32_coordinates():
    lat = np.float32([0.1, 0.2, 0.3])  # 0.1 in float32 is 0.10000000149
    np.testing.assert_array_equal(values_at(lat, SelectRange(max=0.1)), np.float32([0.1]))
    np.testing.assert_array_equal(values_at(lat, [0.3, 0.1]), np.float32([0.1, 0.3]))  # the file's order


@pytest.mark.parametrize(
    ("values", "low", "high", "expected"),
    [
        (LON_360, 350, 10, [*np.arange(350, 360, 2.5), *np.arange(0, 10.1, 2.5)]),
        (LON_360, -10, 10, [*np.arange(350, 360, 2.5), *np.arange(0, 10.1, 2.5)]),
        (LON_360, 10, 20, np.arange(10, 20.1, 2.5)),
        (LON_360, 0, 360, LON_360),
        (LON_180, 170, -170, [*LON_180[LON_180 >= 170], *LON_180[LON_180 <= -170]]),
        (LON_180, 170, 190, [*LON_180[LON_180 >= 170], *LON_180[LON_180 <= -170]]),
        (LON_180, -10, 10, np.arange(-9.75, 10, 0.75)),
        (LON_180, 350, 10, np.arange(-9.75, 10, 0.75)),
        (LON_360[::-1], 350, 10, [*np.arange(10, -0.1, -2.5), *np.arange(357.5, 349.9, -2.5)]),
    ],
    ids=["seam-0", "negative-bounds", "inside", "whole", "seam-180", "beyond-180", "across-0", "0-360-bounds", "down"],
)
def test_longitude_ranges_go_east_from_min_to_max_across_the_seam(values, low, high, expected):
    got = values_at(values, SelectRange(min=low, max=high), EAST, "lon")
    np.testing.assert_allclose(got, np.float32(expected))
    indices = resolve("lon", SelectRange(min=low, max=high), values, EAST)
    assert len(runs_of(indices.tolist())) <= 2  # one piece, or two joined at the seam


def test_a_longitude_range_off_both_ends_of_a_regional_grid_is_refused():
    regional = np.arange(0, 60, 2.5)
    with pytest.raises(
        UserError, match=r"select.lon: \{min: 50, max: 5\} takes both ends of lon .* not a whole circle"
    ):
        resolve("lon", SelectRange(min=50, max=5), regional, EAST)


def test_longitude_values_match_modulo_360():
    np.testing.assert_array_equal(values_at(LON_360, [-10, 10], EAST, "lon"), [10, 350])


def test_times_match_at_their_own_precision():
    times = pd.date_range("1990-01-01", periods=48, freq="MS").values
    got = values_at(times, SelectRange(min=1990.0, max="1990-03"))
    np.testing.assert_array_equal(got, np.array(["1990-01", "1990-02", "1990-03"], dtype="datetime64[ns]"))
    assert len(values_at(times, ["1991", "1993-12"])) == 13
    noleap = np.array([cftime.DatetimeNoLeap(y, 7, 1) for y in range(1890, 2000)])
    assert [t.year for t in values_at(noleap, SelectRange(min="1900", max="1909-12-31"))] == list(range(1900, 1910))


@pytest.mark.parametrize(
    ("wanted", "expected"),
    [
        ([925], "select.level: 925 is not a level value of the input; the nearest are 1000, 850, 500 (of 3)"),
        (["abc"], "select.level: 'abc' is not a number, but level values are numbers"),
        (SelectRange(min=1001), "select.level: {min: 1001} holds no level value of the input (500 to 1000)"),
        (SelectRange(min=900, max=600), "select.level: min 900 is above max 600, so nothing lies between them"),
    ],
)
def test_bad_selections_name_the_key_and_what_the_input_has(wanted, expected):
    with pytest.raises(UserError) as info:
        resolve("level", wanted, np.array([1000, 850, 500], dtype=np.int32), {"units": "hPa"})
    assert expected in str(info.value) and "\n" not in str(info.value)


def test_a_time_that_cannot_be_read_is_one_line():
    times = pd.date_range("1990-01-01", periods=4, freq="D").values
    with pytest.raises(UserError, match=r"select.time: cannot read \{min: 1990-99\} as times"):
        resolve("time", SelectRange(min="1990-99"), times, {})


def test_selection_maps_boxes_of_the_selected_grid_to_source_pieces():
    selection = Selection({"lon": ((20, 24), (0, 5)), "level": ((0, 1), (2, 4))})
    assert selection.length("lon", 24) == 9 and selection.length("lat", 20) == 20
    assert selection.indices("lon", 24).tolist() == [20, 21, 22, 23, 0, 1, 2, 3, 4]
    assert selection.source_runs("lon", 2, 7) == [((22, 24), (0, 2)), ((0, 3), (2, 5))]
    pieces = selection.pieces({"time": (0, 4), "level": (0, 3), "lat": (3, 9), "lon": (2, 7)}, ["level", "lon"])
    assert [(p["level"], p["lon"], where) for p, where in pieces] == [
        ((0, 1), (22, 24), {"level": (0, 1), "lon": (0, 2)}),
        ((0, 1), (0, 3), {"level": (0, 1), "lon": (2, 5)}),
        ((2, 4), (22, 24), {"level": (1, 3), "lon": (0, 2)}),
        ((2, 4), (0, 3), {"level": (1, 3), "lon": (2, 5)}),
    ]
    assert all(p["time"] == (0, 4) and p["lat"] == (3, 9) for p, _ in pieces)


@given(st.lists(st.integers(0, 30), min_size=1, max_size=12, unique=True), st.data())
def test_pieces_put_together_are_the_selected_elements(indices, data):
    selection = Selection({"x": runs_of(indices)})
    start = data.draw(st.integers(0, len(indices) - 1))
    stop = data.draw(st.integers(start + 1, len(indices)))
    source = np.arange(100, 131)
    out = np.full(stop - start, -1)
    for piece, where in selection.pieces({"x": (start, stop)}, ["x"]):
        out[slice(*where["x"])] = source[slice(*piece["x"])]
    np.testing.assert_array_equal(out, source[indices[start:stop]])


def test_grids_agree_within_float32_rounding_or_the_configured_tolerance():
    lev = np.array([3.64346569404006, 992.556095123291])
    rounded = lev.astype(np.float32).astype(np.float64)
    assert coordinate_mismatch(rounded, lev, "float32") is None
    exact = coordinate_mismatch(rounded, lev, 0.0)
    assert exact.index == 1 and exact.difference == pytest.approx(3.8e-6, rel=0.01) and exact.allowed == 0
    moved = lev + np.array([0, 0.5])
    assert coordinate_mismatch(moved, lev, 0.6) is None
    found = coordinate_mismatch(moved, lev, "float32")
    assert (found.index, found.difference) == (1, pytest.approx(0.5))
    times = pd.date_range("2000", periods=3).values
    assert coordinate_mismatch(times[::-1], times, 1e9).difference is None  # times must be equal
