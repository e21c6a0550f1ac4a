"""Progress markers: each finished unit or shard leaves a small file the driver sums up.

Beam's local runner reports metrics only when the pipeline ends (the Dask runner not at all),
so the live progress line reads these instead. Workers that share the output's filesystem
(threads, processes, or a cluster with --shared_filesystem) all write to one directory; a
retried unit rewrites its own marker, so nothing is counted twice. Runs whose workers share no
filesystem get no directory and report through Beam counters (Dataflow's UI) instead; nor do runs
that show no line (--quiet): nothing would read them.
"""

from __future__ import annotations

import dataclasses
import json
import os

from planning.run.cancellation import writing


def mark(directory: str | None, kind: str, index: int, piece: int = 0, pieces: int = 1, **numbers: int) -> None:
    """Record that unit or shard ``index`` (or piece ``piece`` of the unit's ``pieces``) is done, with its sample
    and byte counts."""
    if directory is None:
        return
    with writing():
        name = f"{kind}-{index:06d}" if pieces == 1 else f"{kind}-{index:06d}-{piece}"
        if pieces > 1:
            numbers["of"] = pieces
        path = os.path.join(directory, f"{name}.json")
        temporary = f"{path}.tmp"
        text = json.dumps(numbers)
        try:
            _write_text(temporary, text)
        except FileNotFoundError:  # the run's first marker makes the folder (a makedirs each cost every unit time)
            os.makedirs(directory, exist_ok=True)
            _write_text(temporary, text)
        os.replace(temporary, path)


def _write_text(path: str, text: str) -> None:
    with open(path, "w") as stream:
        stream.write(text)


@dataclasses.dataclass(frozen=True)
class Progress:
    units: int = 0
    samples: int = 0
    shards: int = 0
    records: int = 0
    bytes_written: int = 0


def read_progress(directory: str) -> Progress:
    """What the markers in ``directory`` add up to."""
    units = samples = shards = records = written = 0
    pieces: dict[str, int] = {}  # units done in pieces: how many of their pieces are
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return Progress()
    for name in names:
        if not name.endswith(".json"):
            continue
        try:
            with open(os.path.join(directory, name)) as stream:
                numbers = json.load(stream)
        except (OSError, ValueError):
            continue  # being replaced right now; the next look counts it
        if name.startswith("unit-"):
            samples += numbers.get("samples", 0)
            of = numbers.get("of", 1)
            if of == 1:
                units += 1
            else:
                unit = name.rsplit("-", 1)[0]
                pieces[unit] = pieces.get(unit, 0) + 1
                units += pieces[unit] == of  # done with its last piece
        elif name.startswith("shard-"):
            shards += 1
            records += numbers.get("records", 0)
            written += numbers.get("bytes", 0)
    return Progress(units, samples, shards, records, written)
