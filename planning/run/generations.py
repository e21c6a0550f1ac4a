"""An output's generations (0: its build; 1, 2, ...: appends), recorded in generations.json, and what an append adds.

Each generation records how many steps of the (selected) concat dim the output holds once it is
committed, the first and last of them, a fingerprint of the files holding them, its counts and
each split's statistics accumulators (float64, exact in JSON), so that an append cuts only the
samples that reach into steps the output does not hold and merges its statistics into theirs.
``versions`` fingerprints the held files' versions too (planning.formats.sources: modification time,
inode and change time locally; generation and checksums on GCS): a held file rewritten in place,
even with its size and steps unchanged, is refused, since the samples already written hold its old
values. Generations recorded before it check paths, sizes and ranges only.

An append may add steps after the last held step and, contiguous with it, before the first (a
backfill). ``index/<concat_dim>`` keeps counting from generation 0's first step, so every record
already written (and every prediction or resume state keyed by one) stays valid: steps added
before it get negative indices, and ``origin`` records how many there are (a full rebuild numbers
from its own first step instead: its indices are the union's plus ``origin``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from collections.abc import Callable, Collection, Sequence
from typing import Any

from schemas.errors import UserError

logger = logging.getLogger(__name__)

FORMAT = "xarray-tfrecords-generations/1"
GENERATIONS_FILE = "generations.json"
#: Keys of the config an append may change: which files it reads, or which version of an Icechunk repository (the
#: rest must be what the output was built with).
APPENDABLE_KEYS = frozenset({"input.paths", "input.icechunk", "output.path"})


class NothingToAppend(Exception):
    """The input holds no step the output does not hold already: an append has nothing to do (not an error)."""


@dataclasses.dataclass(frozen=True)
class Held:
    """What an output's committed generations hold along its concat dim: ``steps`` consecutive steps of its grid."""

    generation: int  # the number the next generation gets (the committed generations count)
    steps: int
    first: Any  # the first and last step held, as schema.json writes coordinate values
    last: Any
    fingerprint: str | None  # of the files holding them (None: one Zarr store, which grows in place)
    origin: int = 0  # held steps before the one index/<concat_dim> 0 is (steps a backfill added)
    #: of the files holding them with their versions (None: a store, or a generation recorded before versions were)
    versions: str | None = None


@dataclasses.dataclass(frozen=True)
class HeldRange:
    """Where the held steps are on an append's input grid, [start, stop), and the index origin after it."""

    start: int
    stop: int
    origin: int  # the input's steps before index/<concat_dim> 0: the held origin plus the steps added before


@dataclasses.dataclass(frozen=True)
class HeldFile:
    """An input file as the held check sees it: its range [start, stop) on the selected concat dim."""

    path: str
    start: int
    stop: int
    nbytes: int
    version: str = ""  # as listed (planning.formats.sources); "" where the filesystem gives none


def files_fingerprint(files: Sequence[HeldFile]) -> str:
    """Changes when a file, its size or its range changes, or one is added or removed."""
    text = "\n".join(f"{f.path}\t{f.nbytes}\t{f.start}\t{f.stop}" for f in files)
    return hashlib.sha256(text.encode()).hexdigest()


def versions_fingerprint(files: Sequence[HeldFile]) -> str:
    """Changes as ``files_fingerprint`` does, and when a file's version changes (it was written again)."""
    text = "\n".join(f"{f.path}\t{f.nbytes}\t{f.start}\t{f.stop}\t{f.version}" for f in files)
    return hashlib.sha256(text.encode()).hexdigest()


def generation_entry(
    number: int, steps: int, first: Any, last: Any, files: Sequence[HeldFile], store: bool, origin: int = 0
) -> dict:
    """A generation's record before its counts and statistics are known (Finalize adds them).

    Nothing in it changes from run to run (no run id, no time): a build hashes the same every time.
    ``origin`` is written only when a backfill made it other than 0 (outputs without one keep their bytes).
    """
    held = [f for f in files if f.stop <= steps]
    entry = {
        "generation": number,
        "steps": steps,
        "first": first,
        "last": last,
        "fingerprint": None if store else files_fingerprint(held),
        "versions": None if store else versions_fingerprint(held),
        "files": len(held),
        "bytes": sum(f.nbytes for f in held),
    }
    if origin:
        entry["origin"] = origin
    return entry


def dumps(entries: Sequence[dict]) -> str:
    """generations.json: floats as Python writes them (exact in float64), infinities included (an empty min)."""
    return json.dumps({"format": FORMAT, "generations": list(entries)}, indent=1) + "\n"


#: schema.json's ``sources`` key for the digest of the committed generations' record (``digest``).
DIGEST_KEY = "generations_sha256"


def digest(entries: Sequence[dict]) -> str:
    """The digest of these generations' record, as ``dumps`` writes it: schema.json keeps the committed ones'."""
    return hashlib.sha256(dumps(entries).encode()).hexdigest()


def loads(text: str, source: str, committed: int, recorded: str | None = None) -> list[dict]:
    """The first ``committed`` generations recorded in ``text`` (later ones: an append that never committed).

    ``recorded``: their digest, as schema.json holds it since outputs record one: the statistics an append merges
    with its own come from this file, so an edit that keeps it well-formed must still be refused.
    """
    try:
        document = json.loads(text)
        entries = document["generations"] if document.get("format") == FORMAT else None
        valid = isinstance(entries, list) and all(isinstance(e, dict) for e in entries)
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
        valid = False
    if (
        not valid
        or len(entries) < committed
        or [e.get("generation") for e in entries[:committed]] != list(range(committed))
    ):
        raise UserError(
            f"output: {source} is not a generations record of this tool for its {committed} generation(s); "
            "it was edited or lost: rebuild the output with --overwrite"
        )
    if recorded is not None and digest(entries[:committed]) != recorded:
        raise UserError(
            f"output: {source} is not what the output's last commit recorded (its digest differs from schema.json's "
            f"{DIGEST_KEY}); it was edited: rebuild the output with --overwrite"
        )
    return entries[:committed]


def held_of(entries: Sequence[dict], source: str) -> Held:
    """What the committed generations hold (the last one's record), checked for the types it must have."""
    last = entries[-1]
    steps, fingerprint, origin = last.get("steps"), last.get("fingerprint"), last.get("origin", 0)
    versions = last.get("versions")
    if (
        not isinstance(steps, int)
        or steps < 1
        or not (fingerprint is None or isinstance(fingerprint, str))
        or not (versions is None or isinstance(versions, str))
        or not isinstance(origin, int)
        or not 0 <= origin < steps
    ):
        raise UserError(f"output: {source} records no steps held; it was edited: rebuild the output with --overwrite")
    return Held(len(entries), steps, last.get("first"), last.get("last"), fingerprint, origin, versions)


def config_difference(
    built: dict, now: dict, prefix: str = "", default_of: Callable[[str], Any] | None = None
) -> tuple[str, Any, Any] | None:
    """The first config key (dotted) whose value differs, with both values; keys an append may change are skipped.

    ``default_of(key)``: the value a key has when not given; a key missing from ``built`` (an output
    of an earlier version, before the key existed) is taken to have it.
    """
    for key in sorted(set(built) | set(now)):
        name = f"{prefix}{key}"
        if name in APPENDABLE_KEYS:
            continue
        before, after = built.get(key), now.get(key)
        if key not in built and default_of is not None:
            before = default_of(name)
        if isinstance(before, dict) and isinstance(after, dict):
            found = config_difference(before, after, f"{name}.", default_of)
            if found:
                return found
        elif before != after:
            return name, before, after
    return None


def check_config(built: dict, now: dict, default_of: Callable[[str], Any] | None = None) -> None:
    """UserError naming the first key where ``now`` differs from the config the output was built with."""
    found = config_difference(built, now, default_of=default_of)
    if found:
        key, before, after = found
        raise UserError(
            f"{key}: {after!r} differs from the {before!r} the output was built with; --append adds files with the "
            "same config (build into a new output, or rebuild with --overwrite, to change it)"
        )


def held_range(
    held: Held,
    dim: str,
    values: Sequence,
    files: Sequence[HeldFile] | None,
    known: Collection[tuple[str, int, str]] = (),
) -> HeldRange:
    """Where the held steps are in the input, checked; NothingToAppend when it holds no other step.

    ``values``: the input's concat coordinate as schema.json writes values (read where the held
    range starts and ends: pass a lazy sequence for a long one; the start is searched for only
    when the input begins earlier); ``files``: the input files' ranges (None: one Zarr store).
    Steps before the held ones (a backfill) must be contiguous with them: the caller checks that
    on the decoded values, and that they keep the samples' stride. ``known``: (path, size, version) of the
    files the last run listed (its inventory cache), to name a held file whose version changed since.
    """
    total = len(values)
    start = 0 if total and values[0] == held.first else _index_of(values, held.first)
    if start is None or total < start + held.steps:
        raise UserError(
            f"input: its {dim} steps do not hold the {held.steps:,} the output holds ({held.first} to "
            f"{held.last}); --input must name every file the output was built from as well as the new ones"
        )
    stop = start + held.steps
    if values[stop - 1] != held.last:
        raise UserError(
            f"input: its {dim} step {stop - 1:,} is {values[stop - 1]}, where the output holds "
            f"{held.last}: files overlap or change the steps it holds ({held.first} to {held.last}); --append adds "
            "files before its first step or after its last only"
        )
    if files is not None:
        for edge, side in ((start, held.first), (stop, held.last)):
            straddling = next((f for f in files if f.start < edge < f.stop), None)
            if straddling is not None:
                raise UserError(
                    f"input: {straddling.path} holds {dim} steps on both sides of {side}, one end of the output's "
                    "steps; --append adds whole files before its first step or after its last: rebuild with "
                    "--overwrite"
                )
        inside = [dataclasses.replace(f, start=f.start - start, stop=f.stop - start) for f in files]
        holding = [f for f in inside if f.start >= 0 and f.stop <= held.steps]
        if files_fingerprint(holding) != held.fingerprint:
            raise UserError(
                f"input: the files holding {held.first} to {held.last} are not those the output was built from (one "
                "was added, removed, moved or resized); --input must name them unchanged, with the new ones"
            )
        _check_versions(held, holding, known)
    if total == held.steps:
        raise NothingToAppend(
            f"nothing to append: the input's {total:,} {dim} steps ({held.first} to {held.last}) are all in the output"
        )
    return HeldRange(start, stop, held.origin + start)


def _check_versions(held: Held, holding: Sequence[HeldFile], known: Collection[tuple[str, int, str]]) -> None:
    """UserError naming a held file written again since the output was built from it (its samples hold old values)."""
    if held.versions is None:
        logger.warning(
            "output: its generations record no versions of the files it holds (written by an earlier version): they "
            "are checked by path, size and range only, so one rewritten in place with its size is not noticed"
        )
        return
    if versions_fingerprint(holding) == held.versions:
        return
    listed = {key[0] for key in known}  # (a file the cache does not list at all tells nothing)
    changed = [f.path for f in holding if f.path in listed and (f.path, f.nbytes, f.version) not in known]
    what = f"a file holding {held.first} to {held.last}"
    if changed:
        what = changed[0] + (f" (and {len(changed) - 1} more)" if len(changed) > 1 else "")
    raise UserError(
        f"input: {what} changed since the output was built from it (its modification time, inode or change time, "
        "or on GCS its generation, differ from those recorded), so the samples already written may hold its old "
        "values; rebuild the output with --overwrite"
    )


def _index_of(values: Sequence, value: Any) -> int | None:
    """Where ``value`` is among ``values`` (None: not there)."""
    for index in range(len(values)):
        if values[index] == value:
            return index
    return None
