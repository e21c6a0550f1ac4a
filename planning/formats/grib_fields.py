"""Each GRIB message's place in its hypercube, as cfgrib's own index of the file places it, and each message's field
decoded with ecCodes as cfgrib decodes it: what lets a worker read a unit's messages alone, with no cfgrib open.

Planning opens every file through cfgrib once (planning.formats.grib); the index cfgrib builds there
says which message fills which cell (variable, step, level, ...) of each variable. Kept with the
messages' byte ranges in the output's bookkeeping, it lets a worker fetch the messages a box needs
and decode each the way cfgrib's ``OnDiskArray`` does: the field's values in the message's order,
odd rows reversed where ``alternativeRowScanning`` says so, cast to float32, cfgrib's missing value
(float32's largest, which it sets on every message) turned into NaN, NaN where no message is.
Each message read is held to a CRC-32 of its bytes and its cell taken at planning.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import zlib
from collections.abc import Sequence

import numpy as np

from schemas.errors import UserError

#: cfgrib's missingValue, set on every message before its values are read (cfgrib.messages).
MISSING = np.finfo(np.float32).max
#: cfgrib's default values dtype (values_dtype), which planning opens files with.
VALUES_DTYPE = np.dtype(np.float32)


@dataclasses.dataclass(frozen=True, eq=False)
class GribMessages:
    """One GRIB file's messages of the chosen hypercube, and where cfgrib places each (none: not known)."""

    ranges: np.ndarray  # int64 (n, 2): (offset, length) of each message that the filter may take
    #: int64 (n, 1 + k): the number of the variable (in ``layout``) each message fills (-1: one cfgrib leaves
    #: out), then its index along each of that variable's dims before its grid's dims (-1 past them)
    cells: np.ndarray | None = None
    checks: np.ndarray | None = None  # int64 (n,): CRC-32 of each message's bytes and then of its cell row
    #: each variable's (name, dims as the build reads them, grid shape (the trailing dims' sizes))
    layout: tuple[tuple[str, tuple[str, ...], tuple[int, ...]], ...] = ()

    @property
    def placed(self) -> bool:
        return self.cells is not None and self.checks is not None


def message_check(message: bytes | memoryview, cell: np.ndarray) -> int:
    """The CRC-32 of a message's bytes, then of its cell (its row's numbers but the -1 that pad it, so any width of
    the rows gives it): what a worker holds the bytes it read, and where it puts them, to."""
    cell = np.asarray(cell, dtype=np.int64)
    return zlib.crc32(cell[cell >= 0].tobytes(), zlib.crc32(message))


def _on_disk_array(variable):
    """cfgrib's OnDiskArray under an xarray variable's lazy wrappers, None where it is not there."""
    data = variable.variable._data
    for _ in range(8):
        if hasattr(data, "field_id_index") and hasattr(data, "geo_ndim"):
            return data
        data = getattr(data, "array", None)
        if data is None:
            return None
    return None


def place_messages(dataset, ranges: np.ndarray, local: str, promoted: str | None) -> GribMessages:
    """Where cfgrib places each message of ``ranges`` in ``dataset`` (cfgrib's, not yet promoted), and each
    message's check; without cells where cfgrib's index cannot be mapped to them for sure.

    Args:
        dataset: the file's hypercube as ``xr.open_dataset(local, engine="cfgrib", cache=False)`` gives it.
        ranges: (offset, length) of the messages that the filter may take (planning.formats.grib.message_ranges).
        local: the file the offsets are in (the one cfgrib opened).
        promoted: the concat dim, where the build gives each variable that dim first (a scalar in the file).

    Returns:
        The messages, with their cells and checks where every field cfgrib reads is one whole message of them.
    """
    unplaced = GribMessages(ranges)
    rows = {int(offset): row for row, offset in enumerate(ranges[:, 0])}
    layout, placements = [], []
    for number, name in enumerate(dataset.data_vars):
        array = _on_disk_array(dataset[name])
        if array is None or np.dtype(array.dtype) != VALUES_DTYPE or not 1 <= array.geo_ndim <= 2:
            return unplaced
        if np.float32(array.missing_value) != MISSING:
            return unplaced  # cfgrib could not set its missing value: not what decode_field gives
        dims = tuple(dataset[name].dims)
        grid = tuple(int(n) for n in array.shape[-array.geo_ndim :])
        prefix = (0,) if promoted is not None else ()
        layout.append((str(name), ((promoted,) if promoted else ()) + dims, grid))
        for header, ids in array.field_id_index.items():
            first = ids[0]
            if not isinstance(first, (int, np.integer)) or int(first) not in rows:
                return unplaced  # a field inside a multi-field message, or one the scan did not find
            placements.append((rows[int(first)], number, (*prefix, *(int(i) for i in header))))
    width = 1 + max((len(where) for _, _, where in placements), default=0)
    cells = np.full((len(ranges), width), -1, dtype=np.int64)
    for row, number, where in placements:
        if cells[row, 0] != -1:
            return unplaced  # one message in two cells: not something a worker places for sure
        cells[row, : 1 + len(where)] = (number, *where)
    checks = np.zeros(len(ranges), dtype=np.int64)
    with open(local, "rb") as stream:
        for row, (offset, length) in enumerate(ranges.tolist()):
            checks[row] = message_check(os.pread(stream.fileno(), length, offset), cells[row])
    return GribMessages(ranges, cells, checks, tuple(layout))


def checked_message(path: str, data: memoryview, offset: int, check: int, cell: np.ndarray) -> memoryview:
    """``data``, the bytes read at ``offset`` of ``path``, refused unless they are the message planning indexed."""
    if not (len(data) >= 8 and data[:4] == b"GRIB" and data[-4:] == b"7777") or message_check(data, cell) != check:
        raise UserError(
            f"{path}: bytes {offset} to {offset + len(data)} are not the GRIB message planning indexed there; the "
            "file changed since the build was planned: run it again"
        )
    return data


def decode_field(message: memoryview, grid: Sequence[int]) -> np.ndarray:
    """A message's field on ``grid`` as cfgrib's OnDiskArray fills it (before its missing values become NaN).

    Raises:
        ValueError: the message does not hold one value for each point of ``grid``.
    """
    import eccodes

    handle = eccodes.codes_new_from_message(message)
    try:
        eccodes.codes_set(handle, "missingValue", float(MISSING))
        values = eccodes.codes_get_values(handle)
        alternate = False
        if len(grid) == 2:
            with contextlib.suppress(eccodes.KeyValueNotFoundError):  # cfgrib's default where a grid lacks it
                alternate = bool(eccodes.codes_get(handle, "alternativeRowScanning"))
    finally:
        eccodes.codes_release(handle)
    if values.size != int(np.prod(grid)):
        raise ValueError(f"the message holds {values.size} values where the grid has {int(np.prod(grid))} points")
    values = values.reshape(grid)
    if alternate:
        values[1::2, :] = values[1::2, ::-1]
    return values
