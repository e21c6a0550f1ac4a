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

    #: int64 (n, 2): (offset, length) of each message cfgrib reads (placed), or that the filter may take
    ranges: np.ndarray
    #: int64 (n, 1 + k): the number of the variable (in ``layout``) each message fills, then its index along each
    #: of that variable's dims before its grid's dims (-1 past them)
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


def _message_length(head: bytes) -> int | None:
    """A GRIB message's length from its first 16 bytes (section 0); None where it does not say it plainly (not
    GRIB, or a GRIB 1 message over 8 MB, whose length ecCodes works out from its end)."""
    if len(head) < 16 or head[:4] != b"GRIB":
        return None
    if head[7] == 2:
        return int.from_bytes(head[8:16], "big")
    length = int.from_bytes(head[4:7], "big")
    return length if head[7] == 1 and not length & 0x800000 else None


def place_messages(dataset, local: str, promoted: str | None) -> GribMessages | None:
    """The messages cfgrib reads for ``dataset`` (cfgrib's, not yet promoted), each with its place and its check;
    None where cfgrib's index cannot be mapped to whole messages for sure.

    Args:
        dataset: the file's hypercube as ``xr.open_dataset(local, engine="cfgrib", cache=False)`` gives it.
        local: the file cfgrib opened (its index's offsets are in it).
        promoted: the concat dim, where the build gives each variable that dim first (a scalar in the file).

    Returns:
        The messages, in file order, with their cells and checks.
    """
    layout, placements = [], {}
    for number, name in enumerate(dataset.data_vars):
        array = _on_disk_array(dataset[name])
        if array is None or np.dtype(array.dtype) != VALUES_DTYPE or not 1 <= array.geo_ndim <= 2:
            return None
        if np.float32(array.missing_value) != MISSING:
            return None  # cfgrib could not set its missing value: not what decode_field gives
        dims = tuple(dataset[name].dims)
        grid = tuple(int(n) for n in array.shape[-array.geo_ndim :])
        prefix = (0,) if promoted is not None else ()
        layout.append((str(name), ((promoted,) if promoted else ()) + dims, grid))
        for header, ids in array.field_id_index.items():
            first = ids[0]
            if not isinstance(first, (int, np.integer)) or int(first) in placements:
                return None  # a field inside a multi-field message, or one message in two cells
            placements[int(first)] = (number, *prefix, *(int(i) for i in header))
    offsets = sorted(placements)
    width = 1 + max((len(cell) - 1 for cell in placements.values()), default=0)
    ranges = np.zeros((len(offsets), 2), dtype=np.int64)
    cells = np.full((len(offsets), width), -1, dtype=np.int64)
    checks = np.zeros(len(offsets), dtype=np.int64)
    with open(local, "rb") as stream:
        for row, offset in enumerate(offsets):
            length = _message_length(os.pread(stream.fileno(), 16, offset))
            message = os.pread(stream.fileno(), length, offset) if length else b""
            if len(message) != length or not message.endswith(b"7777"):
                return None
            ranges[row] = offset, length
            cells[row, : len(placements[offset])] = placements[offset]
            checks[row] = message_check(message, cells[row])
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
