"""Shard results combined as arrays: per split, each reported shard's number, records, examples and bytes.

A 2-million-shard build's results were 2 million ShardResult objects gathered on one worker (about 0.5 GB);
as four 8-byte words a shard they are 64 MB, and a combine's partial results stay as small as the shards
they hold (a sparse list, not an array as long as the split).
"""

from __future__ import annotations

import array
from collections.abc import Iterable

import numpy as np

from planning.run.contracts import ShardResult

#: The words kept per shard, in order.
_WORDS = ("shard", "records", "examples", "bytes")


class ShardCounts:
    """The shards a write stage reported, by split, as packed 8-byte words (mergeable, picklable)."""

    def __init__(self):
        self._words: dict[str, array.array] = {}
        #: per split: one reported (shard number, file, index) to check the naming rule by, and whether any shard
        #: came without an index and any with one (the rule says all or none)
        self._named: dict[str, tuple[int, str, str | None]] = {}
        self._indexed: dict[str, set[bool]] = {}

    @classmethod
    def of(cls, results: Iterable[ShardResult]) -> ShardCounts:
        counts = cls()
        for result in results:
            counts.add(result)
        return counts

    def add(self, result: ShardResult) -> None:
        words = self._words.setdefault(result.split, array.array("q"))
        words.extend((result.shard, result.records, result.examples, result.bytes))
        self._named.setdefault(result.split, (result.shard, result.file, result.index))
        self._indexed.setdefault(result.split, set()).add(result.index is not None)

    def absorb(self, other: ShardCounts) -> None:
        for split, words in other._words.items():
            self._words.setdefault(split, array.array("q")).extend(words)
        for split, named in other._named.items():
            self._named.setdefault(split, named)
        for split, indexed in other._indexed.items():
            self._indexed.setdefault(split, set()).update(indexed)

    def named(self, split: str) -> tuple[int, str, str | None] | None:
        """One reported shard of the split: its number, file and index (None: none reported)."""
        return self._named.get(split)

    def indexed(self, split: str) -> set[bool]:
        """Whether the split's reported shards came with an index: {True}, {False}, both, or none reported."""
        return self._indexed.get(split, set())

    def dense(self, split: str, num_shards: int) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Which of the split's ``num_shards`` shards were reported, and their records, examples and bytes (0 where
        not).

        Raises:
            RuntimeError: a shard reported twice, or numbered outside the split (a bug of the write stage).
        """
        table = np.frombuffer(self._words.get(split, array.array("q")), dtype=np.int64).reshape(-1, len(_WORDS))
        numbers = table[:, 0]
        if len(numbers) and (numbers.min() < 0 or numbers.max() >= num_shards):
            raise RuntimeError(f"split {split}: a shard numbered outside 0-{num_shards - 1} was reported; a bug")
        seen = np.zeros(num_shards, dtype=bool)
        seen[numbers] = True
        if int(seen.sum()) != len(numbers):
            raise RuntimeError(f"split {split}: a shard was reported twice; this is a bug, please report it")
        out = {}
        for column, key in enumerate(_WORDS[1:], start=1):
            values = np.zeros(num_shards, dtype=np.int64)
            values[numbers] = table[:, column]
            out[key] = values
        return seen, out
