"""The live progress line of a local build on stderr: units cut, samples, shards written, MB/s, ETA."""

from __future__ import annotations

import threading
import time
from typing import TextIO

from planning.run.progress import Progress, read_progress


def _clock(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    return (
        f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
        if seconds >= 3600
        else (f"{seconds // 60}:{seconds % 60:02d}")
    )


class ProgressLine:
    """Redraws one line while the pipeline runs (on a terminal), or prints a line every ``log_every`` s."""

    def __init__(
        self,
        directory: str,
        units: int,
        shards: int,
        input_bytes: int,
        stream: TextIO,
        interval: float = 0.5,
        log_every: float = 15.0,
    ):
        self._directory = directory
        self._units, self._shards, self._input_bytes = units, shards, input_bytes
        self._stream = stream
        self._tty = stream.isatty()
        self._interval = interval if self._tty else log_every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="progress", daemon=True)
        self._started = time.monotonic()
        self._width = 0

    def render(self, progress: Progress, elapsed: float) -> str:
        done = progress.units / max(self._units, 1)
        speed = done * self._input_bytes / 1e6 / max(elapsed, 1e-9)
        parts = [
            f"cut {progress.units}/{self._units} units",
            f"{progress.samples:,} samples",
            f"wrote {progress.shards}/{self._shards} shards ({progress.bytes_written / 1e6:,.1f} MB)",
            f"{speed:,.1f} MB/s in",
        ]
        # Cutting and encoding take most of the time; writing the shards comes after.
        fraction = 0.85 * done + 0.15 * progress.shards / max(self._shards, 1)
        if 0 < fraction < 1:
            parts.append(f"ETA {_clock(elapsed * (1 - fraction) / fraction)}")
        return " · ".join(parts)

    def _show(self, text: str) -> None:
        if self._tty:
            padding = " " * max(self._width - len(text), 0)
            self._stream.write(f"\r{text}{padding}")
            self._width = len(text)
        else:
            self._stream.write(f"{text}\n")
        self._stream.flush()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self._show(self.render(read_progress(self._directory), time.monotonic() - self._started))

    def __enter__(self) -> ProgressLine:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        if self._tty and self._width:
            self._stream.write("\r" + " " * self._width + "\r")  # the summary replaces the line
            self._stream.flush()
