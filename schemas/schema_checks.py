"""The checks schema.json's entries meet as they are read: types, counts, file names; SchemaError where one fails."""

from __future__ import annotations

import posixpath
from typing import Any


class SchemaError(ValueError):
    """A schema (schema.json's JSON) that is malformed: the message names the entry and what is wrong with it.

    ``schemas.metadata.load_schema`` adds the file and the fix.
    """


def expect(value: Any, kind: type, where: str, what: str) -> Any:
    """``value`` if it is a ``kind`` (a bool is no int), else SchemaError naming the entry ``where``."""
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise SchemaError(f"{where}: {shown(value)} is not {what}")
    return value


def count(value: Any, where: str) -> int:
    """``value`` if it is a whole number of 0 or more (a record count, a size), else SchemaError."""
    if expect(value, int, where, "a whole number") < 0:
        raise SchemaError(f"{where}: {value} is negative")
    return value


def shown(value: Any) -> str:
    """A value for a one-line message: short however big a damaged schema.json makes it."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def plain_file_name(name: Any) -> bool:
    """True for the name of a file directly in the output folder: no folder, no ``..``, not absolute.

    Readers join the names schema.json lists to the output's path: any other name would read
    another output's shards, or any file on the machine, as this output's.
    """
    return (
        isinstance(name, str)
        and name not in ("", ".", "..")
        and not any(character in name for character in "/\\\0")
        and not posixpath.isabs(name)
    )


def file_name(value: Any, where: str) -> str:
    """``value`` if it names a file of the output's folder (plain_file_name), else SchemaError."""
    if not plain_file_name(value):
        raise SchemaError(f"{where}: {shown(value)} is not the name of a file in the output's folder")
    return value
