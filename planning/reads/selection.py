"""The selected grid (config ``select``) as runs of source indices: mapping its boxes back to what the files hold.

Planning cuts samples on the selected grid: along a selected dim, position i is the i-th
selected element. A selection is, per dim, the runs of consecutive source indices it takes,
in its order (a longitude range across the seam is two runs, the one east of the seam last).
Workers read a box of the selected grid as the pieces of source it maps to; nothing outside
the selection is read.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterable, Mapping

import numpy as np

Run = tuple[int, int]  # [start, stop)
Box = dict[str, tuple[int, int]]


def runs_of(indices: Iterable[int]) -> tuple[Run, ...]:
    """Consecutive increasing indices grouped into [start, stop) runs, in the given order."""
    runs: list[list[int]] = []
    for index in indices:
        if runs and runs[-1][1] == index:
            runs[-1][1] += 1
        else:
            runs.append([index, index + 1])
    return tuple((start, stop) for start, stop in runs)


@dataclasses.dataclass(frozen=True, eq=False)
class Selection:
    """Per selected dim, the source index runs it takes, in order; dims not named are taken whole."""

    runs: Mapping[str, tuple[Run, ...]] = dataclasses.field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.runs)

    def length(self, dim: str, whole: int) -> int:
        """Length of ``dim`` on the selected grid (``whole``: its length in the source)."""
        if dim not in self.runs:
            return whole
        return sum(stop - start for start, stop in self.runs[dim])

    def indices(self, dim: str, whole: int) -> np.ndarray:
        """The source index of each position along ``dim`` of the selected grid."""
        if dim not in self.runs:
            return np.arange(whole)
        return np.concatenate([np.arange(start, stop) for start, stop in self.runs[dim]])

    def source_runs(self, dim: str, start: int, stop: int) -> list[tuple[Run, Run]]:
        """The source runs positions [start, stop) of ``dim`` take, each with its place among them."""
        if dim not in self.runs:
            return [((start, stop), (0, stop - start))]
        out, offset = [], 0
        for first, last in self.runs[dim]:
            low, high = max(start, offset), min(stop, offset + last - first)
            if low < high:
                out.append(((first + low - offset, first + high - offset), (low - start, high - start)))
            offset += last - first
        return out

    def pieces(self, box: Box, dims: Iterable[str]) -> list[tuple[Box, Box]]:
        """The source boxes a box of the selected grid maps to, each with its place in the box along ``dims``.

        ``dims``: the selected dims the variables to read have; the box is cut into one piece
        per combination of their runs. Other selected dims, which those variables lack, map to
        their first run: the reader does not look at them.
        """
        dims = [d for d in dims if d in self.runs]
        source = {}
        for dim, (start, stop) in box.items():
            if dim not in dims:
                runs = self.source_runs(dim, start, stop)
                source[dim] = runs[0][0] if runs else (start, start)
        out = []
        for combination in itertools.product(*(self.source_runs(d, *box[d]) for d in dims)):
            piece, place = dict(source), {}
            for dim, (taken, where) in zip(dims, combination):
                piece[dim], place[dim] = taken, where
            out.append((piece, place))
        return out

    def to_json(self) -> dict:
        return {dim: [list(run) for run in runs] for dim, runs in self.runs.items()}
