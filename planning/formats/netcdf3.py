"""Classic NetCDF (CDF-1, CDF-2, CDF-5) headers: where each variable's bytes are, and the size the file must have.

Workers read remote classic files by byte ranges computed from the header (planning.formats.classic_reads).
The netCDF library also reads the missing tail of a truncated classic file as zeros, without an
error; comparing the real size with the size the header implies catches that before a worker
turns the zeros into training data. (HDF5-based NetCDF-4 files fail to open instead.)
"""

from __future__ import annotations

import dataclasses
import math
import struct
from typing import Any, BinaryIO

import numpy as np

#: The stored (big-endian) dtype of each nc_type; 2 is NC_CHAR.
_DTYPES = {1: "i1", 2: "S1", 3: ">i2", 4: ">i4", 5: ">f4", 6: ">f8", 7: "u1", 8: ">u2", 9: ">u4", 10: ">i8", 11: ">u8"}
_CHAR = 2
_ABSENT, _DIMENSION, _VARIABLE, _ATTRIBUTE = 0, 10, 11, 12
_STREAMING = (0xFFFFFFFF, 0xFFFFFFFFFFFFFFFF)


@dataclasses.dataclass(frozen=True)
class ClassicVariable:
    """One variable as the header lays it out."""

    name: str
    dims: tuple[str, ...]
    shape: tuple[int, ...]  # a record variable's first entry is the record count (None: streaming)
    dtype: np.dtype  # as stored: big-endian
    begin: int  # byte offset of its first element (in the first record, for record variables)
    is_record: bool
    attrs: dict[str, Any]  # as the netCDF library returns them: str, numpy scalar or array

    @property
    def inner_shape(self) -> tuple[int, ...]:
        """Shape of the part in one record (record variables) or of the whole (fixed-size ones)."""
        return self.shape[1:] if self.is_record else self.shape


@dataclasses.dataclass(frozen=True)
class ClassicHeader:
    """What a classic file's header says about its layout."""

    version: int
    numrecs: int | None  # None: written in streaming mode, the count is not in the header
    record_size: int  # bytes between the starts of consecutive records
    variables: dict[str, ClassicVariable]

    def expected_size(self) -> int | None:
        """Smallest byte size the header allows (None when the record count is unknown)."""
        if self.numrecs is None:
            return None
        ends = []
        for var in self.variables.values():
            nbytes = var.dtype.itemsize * math.prod(var.inner_shape)
            if not var.is_record:
                ends.append(var.begin + nbytes)
            elif self.numrecs:
                ends.append(var.begin + (self.numrecs - 1) * self.record_size + nbytes)
        return max(ends, default=0)


class _Cursor:
    """A big-endian cursor over the header; CDF-5 widens counts, CDF-2 and CDF-5 widen offsets."""

    def __init__(self, stream: BinaryIO, version: int):
        self._stream = stream
        self._count = ">Q" if version == 5 else ">I"
        self._offset = ">Q" if version in (2, 5) else ">I"

    def read(self, nbytes: int) -> bytes:
        data = self._stream.read(nbytes)
        if len(data) < nbytes:
            raise EOFError("header ends early")
        return data

    def _unpack(self, fmt: str) -> int:
        return struct.unpack(fmt, self.read(struct.calcsize(fmt)))[0]

    def tag(self) -> int:
        return self._unpack(">I")

    def count(self) -> int:
        return self._unpack(self._count)

    def offset(self) -> int:
        return self._unpack(self._offset)

    def padded(self, nbytes: int) -> bytes:
        return self.read(nbytes + (-nbytes % 4))[:nbytes]

    def name(self) -> str:
        return self.padded(self.count()).decode("utf-8", errors="replace")

    def nc_type(self) -> np.dtype:
        kind = self.tag()
        if kind not in _DTYPES:
            raise ValueError(f"unknown type {kind}")
        return np.dtype(_DTYPES[kind])

    def attributes(self) -> dict[str, Any]:
        tag, count = self.tag(), self.count()
        if tag not in (_ABSENT, _ATTRIBUTE):
            raise ValueError(f"bad attribute list tag {tag}")
        attrs = {}
        for _ in range(count):
            name = self.name()
            dtype = self.nc_type()
            attrs[name] = _attribute_value(self.padded(self.count() * dtype.itemsize), dtype)
        return attrs


def _attribute_value(data: bytes, dtype: np.dtype) -> Any:
    """The value as netCDF4-python returns it (what xarray's CF decoding then sees)."""
    if dtype.kind == "S":
        return data.decode("utf-8", errors="replace").replace("\x00", "")
    values = np.frombuffer(data, dtype).astype(dtype.newbyteorder("="))
    return values[0] if len(values) == 1 else values


def read_header(stream: BinaryIO) -> ClassicHeader | None:
    """The header of a classic NetCDF file, or None if the stream does not start like one.

    Raises EOFError if the stream ends inside the header, ValueError if it is malformed.
    """
    magic = stream.read(4)
    if len(magic) < 4 or magic[:3] != b"CDF" or magic[3] not in (1, 2, 5):
        return None
    version = magic[3]
    cursor = _Cursor(stream, version)
    numrecs = cursor.count()
    tag, ndims = cursor.tag(), cursor.count()
    if tag not in (_ABSENT, _DIMENSION):
        raise ValueError(f"bad dimension list tag {tag}")
    dims: list[tuple[str, int]] = [(cursor.name(), cursor.count()) for _ in range(ndims)]
    cursor.attributes()  # global attributes: not needed
    tag, nvars = cursor.tag(), cursor.count()
    if tag not in (_ABSENT, _VARIABLE):
        raise ValueError(f"bad variable list tag {tag}")
    known = None if numrecs in _STREAMING else numrecs
    variables: dict[str, ClassicVariable] = {}
    for _ in range(nvars):
        name = cursor.name()
        dim_ids = [cursor.count() for _ in range(cursor.count())]
        if any(i >= len(dims) for i in dim_ids):
            raise ValueError(f"variable {name!r} names a dimension that does not exist")
        attrs = cursor.attributes()
        dtype = cursor.nc_type()
        cursor.count()  # vsize: can overflow 32 bits, so sizes come from the shape instead
        begin = cursor.offset()
        is_record = bool(dim_ids) and dims[dim_ids[0]][1] == 0
        shape = tuple(known if is_record and j == 0 else dims[i][1] for j, i in enumerate(dim_ids))
        names = tuple(dims[i][0] for i in dim_ids)
        variables[name] = ClassicVariable(name, names, shape, dtype, begin, is_record, attrs)
    return ClassicHeader(version, known, _record_size(variables.values()), variables)


def _record_size(variables) -> int:
    sizes = [v.dtype.itemsize * math.prod(v.inner_shape) for v in variables if v.is_record]
    if len(sizes) == 1:
        return sizes[0]  # a lone record variable is not padded between records
    # One record holds every record variable, each padded to 4 bytes.
    return sum(n + (-n % 4) for n in sizes)


def expected_size(stream: BinaryIO) -> int | None:
    """Smallest byte size the file's header allows, or None if it is not a classic NetCDF file."""
    header = read_header(stream)
    return None if header is None else header.expected_size()
