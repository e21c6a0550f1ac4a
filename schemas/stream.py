"""Training order with an exact, elastic resume: one global stream of samples per seed, shared out between ranks.

    stream = shuffled_stream("out/patches", "train", seed=1, rank=r, world_size=W)
    for step, sample in enumerate(stream):
        ...
        checkpoint["data"] = stream.state()   # small, JSON-able
    # later, with any number of ranks:
    stream = shuffled_stream("out/patches", "train", seed=1, rank=r, world_size=W2, state=checkpoint["data"])

The stream is the concatenation of the epochs' orders (epoch e's is ``epoch_order(n, seed, e)``),
the same whatever the number of ranks. A step takes its next W positions, rank r the r-th: rank r
of W takes the global positions p0 + r, p0 + r + W, ... A step may straddle two epochs; nothing is
dropped, so every sample comes exactly once an epoch, and ranks take the same number of samples an
epoch only where W divides the epoch's length and the stream starts at a multiple of W.

``epoch_multiple=L`` keeps the first n - n mod L positions of each epoch's order and drops the rest
(other samples each epoch, as the order changes): the dropped positions depend on L alone, never on
the number of ranks, so a resume on another world size drops the same samples. With L a multiple
of W (say the global batch size) and a stream started or saved at a multiple of W (between
optimizer steps), every step lies inside one epoch and every rank takes (n - n mod L) / W samples
an epoch, as a trainer with per-rank epochs needs. ``epochs=E`` ends the stream where epoch E begins:
there, the ranks may differ by one sample unless that holds.

The state is the global position of the next step (epoch e, position p of its order), assuming the
ranks step together (synchronous data-parallel training): a stream given it continues the
uninterrupted stream sample for sample, with any world size. It names the output (a digest of the
shuffle seed the output was built with, the split's shards and their sample counts, and the
split's range) and the split, with the stream's seed and ``epoch_multiple``; a state from another
output, split, seed or multiple is refused in one line, as resuming there would repeat some
samples and skip others. So are states of the first format (seed, epoch, position, num_samples):
they name no output, so nothing can check that they belong to this one.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from itertools import islice

import numpy as np

from schemas.epochs import checked_word, epoch_order
from schemas.errors import UserError
from schemas.random_access import RandomAccessSource, Sample
from schemas.schema import Schema

#: Samples read together (one __getitems__): one coalesced read per shard run.
READ_AHEAD = 64
STATE_FORMAT = "xarray-tfrecords/stream-2"
STATE_KEYS = ("format", "output", "split", "num_samples", "seed", "epoch_multiple", "epoch", "position")
_FIRST_FORMAT_KEYS = {"seed", "epoch", "position", "num_samples"}
#: Global positions stay below this, so that a position, and a read-ahead past it, fit numpy's int64.
_POSITION_LIMIT = 2**62


def output_identity(schema: Schema, split: str) -> str:
    """A digest of what fixes a split's file order: the build's shuffle seed, its shards, their counts, its range.

    A rebuild with another seed, or of other samples, orders them otherwise (same count or not); a copy of the
    output elsewhere (another folder, a bucket) keeps it.
    """
    what = {
        "seed": schema.seed,
        "split": split,
        "shards": [[shard.file, shard.examples, shard.generation] for shard in schema.splits[split]],
        "range": schema.sample.get("splits", {}).get(split) if isinstance(schema.sample.get("splits"), dict) else None,
    }
    text = json.dumps(what, sort_keys=True, separators=(",", ":"), default=str)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def _whole(value, name: str, low: int) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < low:
        raise UserError(f"{name}: {value!r} is not a whole number of at least {low}")
    return int(value)


class ShuffledStream:
    """One rank's samples of the global stream, epoch after epoch; ``state()`` resumes it exactly."""

    def __init__(
        self,
        source: RandomAccessSource,
        *,
        seed: int,
        rank: int = 0,
        world_size: int = 1,
        state: dict | None = None,
        epochs: int | None = None,
        epoch_multiple: int = 1,
    ):
        self.seed = checked_word(seed, "seed")
        world_size, rank = _whole(world_size, "world_size", 1), _whole(rank, "rank", 0)
        if rank >= world_size:
            raise UserError(f"rank {rank} of world_size {world_size}: need 0 <= rank < world_size")
        self.epoch_multiple = _whole(epoch_multiple, "epoch_multiple", 1)
        self.epochs = None if epochs is None else _whole(epochs, "epochs", 0)
        self.source, self.rank, self.world_size = source, rank, world_size
        self.num_samples = len(source)
        #: positions taken from each epoch's order
        self.epoch_length = self.num_samples - self.num_samples % self.epoch_multiple
        self.output = output_identity(source.schema, source.split)
        self._end = None if self.epochs is None else min(self.epochs * self.epoch_length, _POSITION_LIMIT)
        #: the global position of the next step
        self._next = 0 if state is None else self._resumed(state)
        if self._end is not None:
            self._end = max(self._end, self._next)  # resumed past the last epoch: nothing left, and never rewound

    @property
    def steps_per_epoch(self) -> int:
        """Steps of all ranks together an epoch holds (whole ones); each rank's samples an epoch where W divides it."""
        return self.epoch_length // self.world_size

    @property
    def epoch(self) -> int:
        """The epoch of the next step's first position."""
        return self._next // self.epoch_length if self.epoch_length else 0

    def state(self, steps: int = 0) -> dict:
        """Where the next step starts (JSON-able); ``steps``: after that many more samples of this rank.

        With a DataLoader reading ``indices()`` ahead of training, keep the state taken before it started
        and pass the samples trained on since, not what the loader has prefetched.
        """
        at = self._next + _whole(steps, "steps", 0) * self.world_size
        if self._end is not None and at + self.rank >= self._end:
            at = self._end  # this rank's last sample taken: the others' last (partial) step ends the stream
        epoch, position = divmod(at, self.epoch_length) if self.epoch_length else (0, 0)
        return {
            "format": STATE_FORMAT,
            "output": self.output,
            "split": self.source.split,
            "num_samples": self.num_samples,
            "seed": self.seed,
            "epoch_multiple": self.epoch_multiple,
            "epoch": epoch,
            "position": position,
        }

    def indices(self) -> Iterator[int]:
        """This rank's sample indices in order from the current state (a sampler for a map-style DataLoader)."""
        n, length, step = self.num_samples, self.epoch_length, self.world_size
        end = _POSITION_LIMIT if self._end is None else self._end
        at = self._next + self.rank
        while length and at < end:
            count = min(READ_AHEAD, -(-(end - at) // step))
            epochs, offsets = np.divmod(at + step * np.arange(count, dtype=np.int64), length)
            out = np.empty(count, dtype=np.int64)
            for epoch in np.unique(epochs).tolist():  # one epoch, or two where the positions cross into the next
                inside = epochs == epoch
                out[inside] = epoch_order(n, self.seed, epoch, offsets[inside])
            yield from out.tolist()
            at += step * count

    def __iter__(self) -> Iterator[Sample]:
        indices = self.indices()
        while True:
            chunk = list(islice(indices, READ_AHEAD))
            if not chunk:
                return
            for sample in self.source.__getitems__(chunk):
                # The state moves before the sample is handed over: a checkpoint taken after training on it resumes
                # at the next one.
                self._next += self.world_size
                yield sample

    def _resumed(self, state: dict) -> int:
        """The global position a saved state names, which must come from this output, split, seed and multiple."""
        if isinstance(state, dict) and set(state) == _FIRST_FORMAT_KEYS:
            raise UserError(
                "state: of shuffled_stream's first format (seed, epoch, position, num_samples), which names no "
                "output, so it cannot be checked to belong to this one; start the stream afresh (no state), or, if "
                "you know it was taken on this output and split, put its epoch and position into a fresh "
                "stream.state()"
            )
        if not isinstance(state, dict) or set(state) != set(STATE_KEYS):
            raise UserError(f"state: expected a dict with exactly {', '.join(STATE_KEYS)}, as state() returns")
        if state["format"] != STATE_FORMAT:
            raise UserError(f"state: format {state['format']!r:.60} is not {STATE_FORMAT!r}; pass what state() returns")
        numbers = ("num_samples", "seed", "epoch_multiple", "epoch", "position")
        if not all(isinstance(state[k], int) and not isinstance(state[k], bool) for k in numbers):
            raise UserError(f"state: {', '.join(numbers)} must be whole numbers, as state() returns")
        if state["split"] != self.source.split:
            raise UserError(
                f"state: taken on split {state['split']!r:.60}, resumed on {self.source.split!r}; resume on the "
                "split it was taken on"
            )
        if state["num_samples"] != self.num_samples:
            raise UserError(
                f"state: saved for a split of {state['num_samples']} samples, this one has {self.num_samples}; "
                "resume on the output it was taken on (an append or a rebuild changes the count; after an append, to "
                f"go on from the next epoch, put epoch {state['epoch'] + 1} and position 0 into a fresh stream.state())"
            )
        if state["output"] != self.output:
            raise UserError(
                f"state: taken on another output than {self.source.path} (or on a build of it with another "
                "shuffle.seed or other shards), whose samples are in another order: resuming here would repeat "
                "some and skip others; resume on the output it was taken on"
            )
        if state["seed"] != self.seed:
            raise UserError(f"state: saved with seed {state['seed']}, resumed with seed {self.seed}; use the same seed")
        if state["epoch_multiple"] != self.epoch_multiple:
            raise UserError(
                f"state: saved with epoch_multiple {state['epoch_multiple']}, resumed with {self.epoch_multiple}; "
                "use the same, so that each epoch drops the same positions"
            )
        epoch, position = state["epoch"], state["position"]
        at = epoch * self.epoch_length + position
        if epoch < 0 or not 0 <= position < max(1, self.epoch_length) or at >= _POSITION_LIMIT:
            raise UserError(f"state: epoch {epoch}, position {position} are out of range")
        return at


def shuffled_stream(
    path: str,
    split: str = "data",
    *,
    seed: int,
    rank: int = 0,
    world_size: int = 1,
    state: dict | None = None,
    epochs: int | None = None,
    epoch_multiple: int = 1,
) -> ShuffledStream:
    """One rank's samples of a split's global stream, a fresh order every epoch.

    Args:
        path: the output's folder, a local path or an fsspec URL (``gs://...``).
        split: the split to read (``"data"`` for a build without ``splits:``).
        seed: the order's seed, a whole number in 0..2**64-1: the same seed gives the same stream anywhere.
        rank: this process's rank, 0 <= rank < world_size.
        world_size: how many ranks share the stream; rank r takes its global positions r, r + W, r + 2W, ...
        state: what ``ShuffledStream.state()`` returned, to resume there (with any world size).
        epochs: how many epochs the stream holds; None: for ever.
        epoch_multiple: L, to keep the first n - n mod L positions of each epoch's order whatever the world size
            (with L a multiple of the world size, every rank takes as many samples an epoch).

    Returns:
        A ``ShuffledStream``: iterate it for samples (``{name: array}``), call ``state()`` to checkpoint it.

    Raises:
        UserError: a seed, rank or world size out of range, or a state taken on another output, split, seed or
            epoch_multiple (or of the first state format, which names no output).
    """
    return ShuffledStream(
        RandomAccessSource(path, split),
        seed=seed,
        rank=rank,
        world_size=world_size,
        state=state,
        epochs=epochs,
        epoch_multiple=epoch_multiple,
    )
