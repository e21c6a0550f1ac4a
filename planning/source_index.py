"""The input files along the concat dim as columns: found by bisection, saved once per run for the workers.

An archive can hold 100,000 files. Pickled into a DoFn as objects they would make the job graph
grow with the archive (Dataflow refuses graphs over 10 MB); as columns saved beside the output,
every worker loads them once, and a unit finds its files in O(log files).
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
from collections.abc import Iterator

import numpy as np

from planning.sources import SourceFile


@dataclasses.dataclass(frozen=True, eq=False)
class SourceIndex:
    """Files in concat order; file i covers [starts[i], stops[i]) of the virtual dataset's concat dim."""

    paths: tuple[str, ...]
    starts: np.ndarray  # int64
    stops: np.ndarray
    nbytes: np.ndarray
    versions: tuple[str, ...] = ()  # as listed (modification time or generation); workers check them

    @classmethod
    def of(cls, files: list[SourceFile]) -> SourceIndex:
        return cls(
            tuple(f.path for f in files),
            np.array([f.start for f in files], dtype=np.int64),
            np.array([f.stop for f in files], dtype=np.int64),
            np.array([f.nbytes for f in files], dtype=np.int64),
            tuple(f.version for f in files),
        )

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> SourceFile:
        version = self.versions[index] if self.versions else ""
        return SourceFile(
            self.paths[index], int(self.starts[index]), int(self.stops[index]), int(self.nbytes[index]), version
        )

    def __iter__(self) -> Iterator[SourceFile]:
        return (self[i] for i in range(len(self)))

    @property
    def total_bytes(self) -> int:
        return int(self.nbytes.sum())

    def overlapping(self, begin: int, end: int) -> list[SourceFile]:
        """The files that hold any of positions [begin, end) along the concat dim, in order."""
        first = int(np.searchsorted(self.stops, begin, side="right"))
        last = int(np.searchsorted(self.starts, end, side="left"))
        return [self[i] for i in range(first, last)]

    def containing(self, position: int) -> SourceFile:
        return self[int(np.searchsorted(self.stops, position, side="right"))]

    def fingerprint(self) -> str:
        """Changes when any file, its size or its place along the concat dim changes."""
        digest = hashlib.sha256("\n".join(self.paths).encode())
        for column in (self.starts, self.stops, self.nbytes):
            digest.update(column.tobytes())
        return digest.hexdigest()

    def to_bytes(self) -> bytes:
        buffer = io.BytesIO()
        paths, versions = np.array(self.paths, dtype=np.str_), np.array(self.versions, dtype=np.str_)
        columns = {"starts": self.starts, "stops": self.stops, "nbytes": self.nbytes}
        np.savez_compressed(buffer, paths=paths, versions=versions, **columns)
        return buffer.getvalue()

    @classmethod
    def from_bytes(cls, data: bytes) -> SourceIndex:
        with np.load(io.BytesIO(data), allow_pickle=False) as columns:
            paths = tuple(str(p) for p in columns["paths"])
            versions = tuple(str(v) for v in columns["versions"])
            return cls(paths, columns["starts"], columns["stops"], columns["nbytes"], versions)
