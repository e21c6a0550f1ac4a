"""Training order with an exact, elastic resume: each rank's samples of a fresh global order every epoch.

    stream = shuffled_stream("out/patches", "train", seed=1, rank=r, world_size=W)
    for step, sample in enumerate(stream):
        ...
        checkpoint["data"] = stream.state()   # small, JSON-able
    # later, with any number of ranks:
    stream = shuffled_stream("out/patches", "train", seed=1, rank=r, world_size=W2, state=checkpoint["data"])

Epoch e's order is ``epoch_order(n, seed, e)``; a step takes the next W positions of it, rank r
the r-th. Every rank takes the same number of samples an epoch: a step is taken only while W
positions are left, so fewer than W samples at the end of each epoch are dropped. The state
is the global position of the next step, assuming the ranks step together (synchronous
data-parallel training): a stream given it continues exactly there, with any world size, and
the steps before and after are the epoch's order without a gap or a repeat.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from schemas.epochs import epoch_order
from schemas.errors import UserError
from schemas.random_access import RandomAccessSource, Sample

#: Samples read together (one __getitems__): one coalesced read per shard run.
READ_AHEAD = 64
STATE_KEYS = ("seed", "epoch", "position", "num_samples")


class ShuffledStream:
    """One rank's samples, epoch after epoch, in the global per-epoch order; ``state()`` resumes it exactly."""

    def __init__(
        self,
        source: RandomAccessSource,
        *,
        seed: int,
        rank: int = 0,
        world_size: int = 1,
        state: dict | None = None,
        epochs: int | None = None,
    ):
        if world_size < 1 or not 0 <= rank < world_size:
            raise UserError(f"rank {rank} of world_size {world_size}: need 0 <= rank < world_size")
        self.source, self.seed, self.rank, self.world_size, self.epochs = source, int(seed), rank, world_size, epochs
        self.num_samples = len(source)
        self.epoch, self.position = 0, 0
        if state is not None:
            self.epoch, self.position = _checked(state, self.seed, self.num_samples)
        self._settle()

    @property
    def steps_per_epoch(self) -> int:
        """Samples each rank takes an epoch."""
        return self.num_samples // self.world_size

    def _settle(self) -> None:
        """Fewer than a step's positions left in the epoch: on to the next epoch's start."""
        if self.position + self.world_size > self.num_samples:
            self.epoch, self.position = self.epoch + 1, 0

    def state(self, steps: int = 0) -> dict:
        """Where the next step starts (JSON-able); ``steps``: after that many more samples of this rank.

        With a DataLoader reading ``indices()`` ahead of training, keep the state taken before it started
        and pass the samples trained on since, not what the loader has prefetched.
        """
        epoch, position, n, w = self.epoch, self.position, self.num_samples, self.world_size
        left = (n - position) // w  # steps left in this epoch
        if steps >= left and self.steps_per_epoch:
            steps -= left
            epoch += 1 + steps // self.steps_per_epoch
            position = (steps % self.steps_per_epoch) * w
        else:
            position += steps * w
        return {"seed": self.seed, "epoch": epoch, "position": position, "num_samples": n}

    def indices(self) -> Iterator[int]:
        """This rank's sample indices in order from the current state (a sampler for a map-style DataLoader)."""
        epoch, position, n = self.epoch, self.position, self.num_samples
        while (self.epochs is None or epoch < self.epochs) and self.steps_per_epoch:
            while position + self.world_size <= n:
                steps = min(READ_AHEAD, (n - position) // self.world_size)
                where = position + self.rank + self.world_size * np.arange(steps, dtype=np.int64)
                yield from epoch_order(self.num_samples, self.seed, epoch, where).tolist()
                position += steps * self.world_size
            epoch, position = epoch + 1, 0

    def __iter__(self) -> Iterator[Sample]:
        indices = self.indices()
        while True:
            chunk = [i for _, i in zip(range(READ_AHEAD), indices)]
            if not chunk:
                return
            for sample in self.source.__getitems__(chunk):
                # The state moves before the sample is handed over: a checkpoint taken after training on it resumes
                # at the next one.
                self.position += self.world_size
                self._settle()
                yield sample


def _checked(state: dict, seed: int, num_samples: int) -> tuple[int, int]:
    """(epoch, position) of a saved state, which must come from this split and seed."""
    if not isinstance(state, dict) or set(state) != set(STATE_KEYS):
        raise UserError(f"state: expected a dict with exactly {', '.join(STATE_KEYS)}, as state() returns")
    if not all(isinstance(state[k], int) and not isinstance(state[k], bool) for k in STATE_KEYS):
        raise UserError("state: seed, epoch, position and num_samples must be whole numbers, as state() returns")
    if state["seed"] != seed:
        raise UserError(f"state: saved with seed {state['seed']}, resumed with seed {seed}; use the same seed")
    if state["num_samples"] != num_samples:
        raise UserError(
            f"state: saved for a split of {state['num_samples']} samples, this one has {num_samples}; "
            "resume on the same output"
        )
    if state["epoch"] < 0 or not 0 <= state["position"] <= num_samples:
        raise UserError(f"state: epoch {state['epoch']}, position {state['position']} are out of range")
    return state["epoch"], state["position"]


def shuffled_stream(
    path: str,
    split: str = "data",
    *,
    seed: int,
    rank: int = 0,
    world_size: int = 1,
    state: dict | None = None,
    epochs: int | None = None,
) -> ShuffledStream:
    """One rank's samples of a split in a fresh global order every epoch (``epochs``: how many; None: for ever)."""
    return ShuffledStream(
        RandomAccessSource(path, split), seed=seed, rank=rank, world_size=world_size, state=state, epochs=epochs
    )
