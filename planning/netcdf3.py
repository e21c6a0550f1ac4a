"""The byte size a classic NetCDF file (CDF-1, CDF-2, CDF-5) must have, read from its header.

The netCDF library reads the missing tail of a truncated classic file as zeros, without an
error; comparing the real size with the size the header implies catches that before a worker
turns the zeros into training data. (HDF5-based NetCDF-4 files fail to open instead.)
"""

from __future__ import annotations

import math
import struct
from typing import BinaryIO

_TYPE_SIZES = {1: 1, 2: 1, 3: 2, 4: 4, 5: 4, 6: 8, 7: 1, 8: 2, 9: 4, 10: 8, 11: 8}
_ABSENT, _DIMENSION, _VARIABLE, _ATTRIBUTE = 0, 10, 11, 12
_STREAMING = 0xFFFFFFFF


class _Header:
    """A big-endian cursor over the header; CDF-5 widens counts, CDF-2 and CDF-5 widen offsets."""

    def __init__(self, stream: BinaryIO, version: int):
        self._stream = stream
        self._count = ">Q" if version == 5 else ">I"
        self._offset = ">Q" if version in (2, 5) else ">I"

    def _unpack(self, fmt: str) -> int:
        size = struct.calcsize(fmt)
        data = self._stream.read(size)
        if len(data) < size:
            raise EOFError("header ends early")
        return struct.unpack(fmt, data)[0]

    def tag(self) -> int:
        return self._unpack(">I")

    def count(self) -> int:
        return self._unpack(self._count)

    def offset(self) -> int:
        return self._unpack(self._offset)

    def skip(self, nbytes: int) -> None:
        padded = nbytes + (-nbytes % 4)
        if len(self._stream.read(padded)) < padded:
            raise EOFError("header ends early")

    def name(self) -> None:
        self.skip(self.count())

    def attributes(self) -> None:
        tag, count = self.tag(), self.count()
        if tag not in (_ABSENT, _ATTRIBUTE):
            raise ValueError(f"bad attribute list tag {tag}")
        for _ in range(count):
            self.name()
            kind = self.tag()
            self.skip(self.count() * _TYPE_SIZES.get(kind, 1))


def expected_size(stream: BinaryIO) -> int | None:
    """Smallest byte size the file's header allows, or None if it is not a classic NetCDF file."""
    magic = stream.read(4)
    if len(magic) < 4 or magic[:3] != b"CDF" or magic[3] not in (1, 2, 5):
        return None
    header = _Header(stream, magic[3])
    numrecs = header.count()
    if numrecs in (_STREAMING, 0xFFFFFFFFFFFFFFFF):
        return None  # being written in streaming mode: the record count is not in the header
    tag, ndims = header.tag(), header.count()
    if tag not in (_ABSENT, _DIMENSION):
        raise ValueError(f"bad dimension list tag {tag}")
    dims = []
    for _ in range(ndims):
        header.name()
        dims.append(header.count())
    header.attributes()
    tag, nvars = header.tag(), header.count()
    if tag not in (_ABSENT, _VARIABLE):
        raise ValueError(f"bad variable list tag {tag}")
    fixed_ends, records = [], []
    for _ in range(nvars):
        header.name()
        dim_ids = [header.count() for _ in range(header.count())]
        header.attributes()
        item = _TYPE_SIZES.get(header.tag(), 1)
        header.count()  # vsize: can overflow 32 bits, so sizes come from the shape instead
        begin = header.offset()
        is_record = bool(dim_ids) and dims[dim_ids[0]] == 0
        shape = [dims[i] for i in (dim_ids[1:] if is_record else dim_ids)]
        nbytes = item * math.prod(shape)
        (records if is_record else fixed_ends).append((begin, nbytes) if is_record else begin + nbytes)
    ends = list(fixed_ends)
    if records and numrecs:
        # One record holds every record variable, each padded to 4 bytes (unless it is alone).
        record_size = records[0][1] if len(records) == 1 else sum(n + (-n % 4) for _, n in records)
        ends.extend(begin + (numrecs - 1) * record_size + n for begin, n in records)
    return max(ends, default=0)
