"""Loading the build configuration: a YAML file (read safely, bounded) or plain data, plus command-line overrides."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pydantic
import yaml

from planning.config.model import BuildConfig, format_validation_error
from schemas.errors import UserError


def parse_config(data: Any, source: str = "config") -> BuildConfig:
    """Validate a config given as plain data (as loaded from YAML)."""
    if not isinstance(data, dict):
        raise UserError(f"{source}: expected a mapping of keys (input, sample, output, ...), got {type(data).__name__}")
    if (where := _empty_name(data)) is not None:
        raise UserError(f"{source}: {where or '(top level)'}: empty name or value; names and paths must not be empty")
    try:
        return BuildConfig.model_validate(data)
    except pydantic.ValidationError as error:
        raise UserError(format_validation_error(error, source)) from None


#: A config is a few hundred bytes; anything near these bounds is a mistake or an attack.
MAX_CONFIG_BYTES = 1_000_000
MAX_CONFIG_VALUES = 100_000
#: A config nests about 5 deep; PyYAML composes nested nodes recursively, so a deeper one is refused
#: before Python's recursion limit turns it into a RecursionError.
MAX_CONFIG_DEPTH = 100
_MERGE_TAG = "tag:yaml.org,2002:merge"


class _ConfigLoader(yaml.SafeLoader):
    """PyYAML's safe loader that refuses duplicate keys (YAML would keep the last silently) and deep nesting.

    Depth counts through aliases (``*name`` repeats its anchor's whole depth), and an alias
    inside its own anchor (a value that contains itself) is refused.
    """

    def __init__(self, stream: str, source: str):
        super().__init__(stream)
        self._source = source
        self._depth = 0
        self._heights: dict[int, int] = {}  # id(node) -> how deep it nests (1: a scalar)

    def _where(self, mark: yaml.Mark | None) -> str:
        return f"line {mark.line + 1}, column {mark.column + 1}" if mark else "unknown position"

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            node = super().compose_node(parent, index)
            if id(node) not in self._heights:  # its anchor is still being composed: the alias is inside it
                raise UserError(
                    f"{self._source}: YAML alias *{event.anchor} at {self._where(event.start_mark)} is inside the "
                    "value it names, so it would never end; write the value out"
                )
            height, mark = self._heights[id(node)], event.start_mark
        else:
            self._depth += 1
            try:
                if self._depth > MAX_CONFIG_DEPTH:
                    raise self._too_deep(self.peek_event().start_mark)
                node = super().compose_node(parent, index)
            finally:
                self._depth -= 1
            children = node.value if isinstance(node.value, list) else []
            parts = [part for child in children for part in (child if isinstance(child, tuple) else (child,))]
            height = 1 + max((self._heights.get(id(part), 1) for part in parts), default=0)
            self._heights[id(node)], mark = height, node.start_mark
        if self._depth + height > MAX_CONFIG_DEPTH:
            raise self._too_deep(mark)
        return node

    def _too_deep(self, mark: yaml.Mark | None) -> UserError:
        return UserError(
            f"{self._source}: nested more than {MAX_CONFIG_DEPTH} levels deep at {self._where(mark)} "
            "(aliases included); a config nests a few levels: flatten it"
        )

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, yaml.Mark] = {}
            for key_node, _ in node.value:
                if key_node.tag == _MERGE_TAG:  # `<<: *base` keys may be overridden: that is what they are for
                    continue
                key = self.construct_object(key_node, deep=deep)
                try:
                    first = seen.setdefault(key, key_node.start_mark)
                except TypeError:  # an unhashable key: the base class refuses it
                    continue
                if first is not key_node.start_mark:
                    raise UserError(
                        f"{self._source}: duplicate key {key!r} at {self._where(key_node.start_mark)} "
                        f"(first at line {first.line + 1}); YAML would keep only the last: remove one"
                    )
        return super().construct_mapping(node, deep)


def _expanded_size(node: yaml.Node, sizes: dict[int, int]) -> int:
    """Values the node stands for once YAML aliases are expanded (each alias counts what it repeats)."""
    if id(node) not in sizes:
        sizes[id(node)] = 0  # a node that contains itself: counted once
        children = node.value if isinstance(node.value, list) else []
        parts = [part for child in children for part in (child if isinstance(child, tuple) else (child,))]
        sizes[id(node)] = min(1 + sum(_expanded_size(part, sizes) for part in parts), MAX_CONFIG_VALUES + 1)
    return sizes[id(node)]


def read_yaml(path: str | Path) -> Any:
    """Load a YAML file with the safe loader; errors name the file and line.

    Size, alias expansion and nesting depth are bounded; duplicate keys are refused.
    """
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise UserError(f"{path}: config file not found; pass an existing file to --config") from None
    except IsADirectoryError:
        raise UserError(f"{path}: is a directory; pass a config file to --config") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise UserError(f"{path}: {len(data):,} bytes is too large for a config (at most {MAX_CONFIG_BYTES:,})")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise UserError(
            f"{path}: not UTF-8 text (byte 0x{data[error.start]:02x} at offset {error.start}); save it as UTF-8"
        ) from None
    loader = _ConfigLoader(text, str(path))
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        if _expanded_size(node, {}) > MAX_CONFIG_VALUES:
            raise UserError(
                f"{path}: expands to more than {MAX_CONFIG_VALUES:,} values through YAML aliases (*name); "
                "write the values out"
            )
        return loader.construct_document(node)
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "unknown position"
        raise UserError(f"{path}: YAML syntax error at {where}: {error.problem}") from None
    except yaml.YAMLError as error:
        raise UserError(f"{path}: YAML error: {error}") from None
    finally:
        loader.dispose()


def _empty_name(data: Any, where: str = "") -> str | None:
    """Where the config has an empty key or an empty text value (names must not be empty), if anywhere."""
    if isinstance(data, dict):
        for key, value in data.items():
            place = f"{where}.{key}" if where else str(key)
            if isinstance(key, str) and not key.strip():
                return place
            if (found := _empty_name(value, place)) is not None:
                return found
    elif isinstance(data, list):
        for index, value in enumerate(data):
            if (found := _empty_name(value, f"{where}.{index}")) is not None:
                return found
    elif isinstance(data, str) and not data.strip():
        return where
    return None


def load_config(path: str | Path | None = None, data: dict | None = None, **overrides: Any) -> BuildConfig:
    """Read the config file (or take ``data``) and apply command-line overrides.

    Overrides: ``input`` (paths), ``output``, ``seed``; a ``None`` value leaves the key as is.
    """
    raw = read_yaml(path) if path is not None else data
    source = str(path) if path is not None else "config"
    raw = dict(raw) if isinstance(raw, dict) else raw
    if isinstance(raw, dict):
        if overrides.get("input") is not None:
            raw["input"] = {**(raw.get("input") or {}), "paths": overrides["input"]}
        if overrides.get("output") is not None:
            raw["output"] = {**(raw.get("output") or {}), "path": overrides["output"]}
        if overrides.get("seed") is not None:
            raw["shuffle"] = {**(raw.get("shuffle") or {}), "seed": overrides["seed"]}
    return parse_config(raw, source)


def with_absolute_paths(config: BuildConfig) -> BuildConfig:
    """The config with relative local input and output paths made absolute (URLs unchanged).

    For workers on other machines of a shared filesystem: their working directory is not the
    driver's, so a relative path would name another place there.
    """

    def absolute(path: str) -> str:
        return path if "://" in path else os.path.abspath(path)

    return config.model_copy(
        update={
            "input": config.input.model_copy(update={"paths": [absolute(p) for p in config.input.paths]}),
            "output": config.output.model_copy(update={"path": absolute(config.output.path)}),
        }
    )
