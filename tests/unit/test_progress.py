"""The live progress line: what it says, and that it keeps to one line on a terminal."""

from __future__ import annotations

import io
import time

from pipelines.progress import ProgressLine
from planning.run.progress import Progress, mark, read_progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_markers_add_up_and_a_rewritten_marker_counts_once(tmp_path):
    mark(str(tmp_path), "unit", 0, samples=10)
    mark(str(tmp_path), "unit", 1, samples=5)
    mark(str(tmp_path), "unit", 1, samples=5)  # a retried unit
    mark(str(tmp_path), "shard", 0, records=15, bytes=1_500_000)
    mark(None, "unit", 2, samples=99)  # distributed runners: no directory, nothing written
    assert read_progress(str(tmp_path)) == Progress(units=2, samples=15, shards=1, records=15, bytes_written=1_500_000)
    assert read_progress(str(tmp_path / "missing")) == Progress()


def test_the_line_shows_units_samples_shards_speed_and_eta():
    line = ProgressLine("unused", units=10, shards=4, input_bytes=1_000_000_000, stream=io.StringIO())
    text = line.render(Progress(units=5, samples=1234, shards=0, bytes_written=0), elapsed=10.0)
    assert text.startswith("cut 5/10 units · 1,234 samples · wrote 0/4 shards (0.0 MB) · 50.0 MB/s in · ETA ")
    assert text.endswith("0:13")  # 42.5% done after 10 s: 13.5 s to go


def test_a_terminal_gets_one_redrawn_line_and_a_log_gets_lines(tmp_path):
    mark(str(tmp_path), "unit", 0, samples=7)
    terminal = Terminal()
    with ProgressLine(str(tmp_path), units=2, shards=1, input_bytes=100, stream=terminal, interval=0.01):
        time.sleep(0.1)
    written = terminal.getvalue()
    assert "\n" not in written and written.count("\r") >= 2 and "cut 1/2 units · 7 samples" in written
    assert written.endswith("\r")  # cleared for the summary
    log = io.StringIO()
    with ProgressLine(str(tmp_path), units=2, shards=1, input_bytes=100, stream=log, log_every=0.02):
        time.sleep(0.1)
    assert log.getvalue().count("\n") >= 2 and "\r" not in log.getvalue()


def test_a_unit_in_pieces_counts_once_when_its_last_piece_is_done(tmp_path):
    mark(str(tmp_path), "unit", 7, 0, 3, samples=10)
    mark(str(tmp_path), "unit", 7, 2, 3, samples=10)
    mark(str(tmp_path), "unit", 8, samples=4)
    assert read_progress(str(tmp_path)) == Progress(units=1, samples=24)
    mark(str(tmp_path), "unit", 7, 1, 3, samples=5)
    mark(str(tmp_path), "unit", 7, 1, 3, samples=5)  # a retried piece rewrites its marker
    assert read_progress(str(tmp_path)) == Progress(units=2, samples=29)
