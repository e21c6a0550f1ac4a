"""Position features (split, index/*, coord/*) from grid positions alone, on hand-made grids."""

from __future__ import annotations

import numpy as np
import pytest

from planning.positions import Positions
from planning.sampling import Axis, SampleGrid

GRID = SampleGrid(
    (
        Axis.offsets("time", 6, [0, -1]),  # pairs (t, t-1): position p is the sample of step p + 1
        Axis.keep("level", 2),
        Axis.window("lat", 10, 4, 3),  # windows at 0, 3, 6
    )
)
TIMES = np.arange(100, 106, dtype=np.int64)
LATS = np.linspace(-45, 45, 10, dtype=np.float32)


def test_indices_and_coordinates_follow_each_axis_role():
    positions = Positions(GRID, "time", None, {"time": TIMES, "lat": LATS})
    time, lat = np.array([0, 4, 2]), np.array([2, 0, 1])
    columns = positions.columns([time, lat])
    assert set(columns) == {"index/time", "index/lat", "coord/time", "coord/lat"}
    assert columns["index/time"][0] == () and columns["index/time"][1].tolist() == [1, 5, 3]  # the offset-0 step
    assert columns["index/lat"][1].tolist() == [6, 0, 3]
    dims, values = columns["coord/time"]
    assert dims == ("time",) and values.tolist() == [[101, 100], [105, 104], [103, 102]]  # both steps of the pair
    dims, values = columns["coord/lat"]
    assert dims == ("lat",) and values.dtype == np.float32
    np.testing.assert_array_equal(values, [LATS[6:10], LATS[0:4], LATS[3:7]])
    assert all(values.dtype in (np.int64, np.float32) for _, values in columns.values())


def test_an_iterated_dim_gives_one_coordinate_and_a_dim_without_coordinates_none():
    grid = SampleGrid((Axis.iterate("time", 4), Axis.window("x", 5, 5, 5)))
    columns = Positions(grid, "time", None, {"time": TIMES[:4]}).columns([np.array([3, 0]), np.array([0, 0])])
    assert columns["coord/time"][0] == () and columns["coord/time"][1].tolist() == [103, 100]
    assert "coord/x" not in columns and columns["index/x"][1].tolist() == [0, 0]


def test_split_labels_come_from_the_split_dim_and_gaps_make_none():
    split_of_position = np.array([0, 0, 1, 1, -1], dtype=np.int16)  # per pair position along time
    positions = Positions(GRID, "time", split_of_position, {})
    time, lat = np.array([0, 2, 3, 4]), np.array([0, 1, 2, 0])
    assert positions.split_labels([time, lat]).tolist() == [0, 1, 1, -1]
    # Splits along another dim (input.new_dim), and positions whose pair would join steps across a gap.
    grid = SampleGrid((Axis.iterate("member", 3), Axis.offsets("time", 6, [0, 1])))
    across_gap = np.array([False, False, True, False, False])
    by_member = Positions(grid, "time", np.array([0, 1, 1], dtype=np.int16), {}, "member", across_gap)
    assert by_member.split_labels([np.array([0, 1, 2, 0]), np.array([0, 2, 3, 2])]).tolist() == [0, -1, 1, -1]
    # One split and no gaps: every sample is of split 0.
    assert Positions(GRID, "time", None, {}).split_labels([time, lat]).tolist() == [0, 0, 0, 0]


def test_a_curvilinear_longitude_travels_in_the_run_file_not_the_job_graph():
    from planning.positions import TimeFeatures

    grid = SampleGrid((Axis.iterate("time", 4), Axis.window("y", 6, 2, 2), Axis.window("x", 5, 3, 1)))
    lon = np.arange(30, dtype=np.float64).reshape(6, 5) * 7.0
    features = TimeFeatures(("day_progress",), "time", "noleap", "nav_lon", ("y", "x"), lon)
    positions = Positions(grid, "time", None, {"time": TIMES[:4] * 3600}, time_features=features)
    where = [np.array([0, 3, 1]), np.array([0, 2, 1]), np.array([2, 0, 1])]
    hollow = positions.hollow()
    assert hollow.time_features.lon_values is None  # (the graph carries none of the grid's longitudes)
    again = hollow.filled(positions.to_bytes()).columns(where)
    for name, (dims, values) in positions.columns(where).items():
        assert again[name][0] == dims
        np.testing.assert_array_equal(again[name][1], values)
    dims, values = again["time_features/day_progress_sin"]
    assert dims == ("y", "x") and values.shape == (3, 2, 3)
    hours = (TIMES[:4] % 24)[[0, 3, 1]]
    local = np.mod(hours[:, None, None] / 24 + np.stack([lon[0:2, 2:5], lon[4:6, 0:3], lon[2:4, 1:4]]) / 360, 1.0)
    np.testing.assert_allclose(values, np.sin(2 * np.pi * local), atol=1e-6)


@pytest.mark.filterwarnings("ignore::cftime.CFWarning")  # (dates before year 1, which CF does not cover)
def test_julian_year_progress_across_its_leap_years_and_the_missing_year_zero():
    import cftime

    from planning.positions import year_progress

    dates = [(-5, 3, 1, 12), (-1, 12, 31, 18), (1, 1, 1, 0), (1900, 2, 29, 6), (1900, 12, 31, 0), (1901, 7, 2, 0)]
    dates = [cftime.datetime(*d, calendar="julian") for d in dates]
    seconds = np.asarray(cftime.date2num(dates, "seconds since 1970-01-01", "julian"), dtype=np.float64)
    # Julian leap years: every fourth; 1 BC (year -1) and 5 BC are leap years, 1900 too, 1901 not.
    expected = [(60 + 0.5) / 366, (365 + 0.75) / 366, 0.0, (59 + 0.25) / 366, 365 / 366, 182 / 365]
    np.testing.assert_allclose(year_progress(seconds.reshape(2, 3), "julian"), np.reshape(expected, (2, 3)), atol=1e-12)
    assert year_progress(np.zeros((0, 2)), "julian").shape == (0, 2)
