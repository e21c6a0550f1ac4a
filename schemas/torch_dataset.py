"""A PyTorch IterableDataset over one split of an output (needs torch; nothing else imports this module).

    from torch.utils.data import DataLoader
    from schemas.torch_dataset import SplitDataset
    dataset = SplitDataset("out/patches", split="data", shuffle_buffer=10_000, seed=0)
    loader = DataLoader(dataset, batch_size=64, num_workers=2)   # every sample once per epoch
    for epoch in range(10):
        dataset.set_epoch(epoch)                                  # a new order each epoch
        for batch in loader: ...                                  # {name: tensor (64, *shape)}

Shards are divided between DataLoader workers (and, with ``rank``/``world_size``, between
processes of a distributed job), so each sample is read once per epoch; with more workers
than shards some workers get none. Pass ``batch_size`` to the dataset and ``batch_size=None``
to the DataLoader to stack batches in numpy, cheaper than collating single samples. Every
tensor a worker hands back costs a shared-memory transfer (a few ms per batch): prefer large
batches, and name only the ``features`` training needs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import numpy as np

from schemas.reader import Reader, rebatch, shuffled

try:
    import torch
    from torch.utils.data import IterableDataset, get_worker_info
except ImportError:  # the module still imports (the readers and tools that list modules need no torch)
    torch = None
    IterableDataset = object

_NO_TORCH = (
    "SplitDataset needs PyTorch, which is not installed: install it (a CPU build on Linux: "
    "pip install torch --index-url https://download.pytorch.org/whl/cpu), or read with schemas.Reader"
)


class SplitDataset(IterableDataset):
    """Samples (or batches) of one split as dicts of torch tensors, optionally shuffled with a seed.

    Shards are divided between DataLoader workers and between ranks, so each sample comes once per epoch; call
    ``set_epoch(e)`` before each epoch for a new, reproducible order.

    Args:
        path: the output's folder, a local path or an fsspec URL.
        split: the split to read (``"data"`` for a build without ``splits:``).
        shuffle_buffer: samples held to shuffle in (0: the shards' own order, already shuffled on disk).
        seed: the shuffle's seed (with ``set_epoch``: a new order each epoch).
        batch_size: samples per batch (None: one sample at a time).
        drop_remainder: drop a last batch smaller than ``batch_size``.
        transform: a function applied to each sample or batch (a dict of tensors).
        features: the features to read (default: all); each tensor costs a shared-memory transfer.
        rank: this process's rank, 0 <= rank < world_size.
        world_size: how many ranks share the split's shards.
        normalize: True: ``(x - mean) / std`` from stats.json; "tendency": targets as residuals.
        normalized_fill: the normalised value of filled points.

    Raises:
        ImportError: torch is not installed.
        ValueError: a rank outside 0..world_size - 1.
        UserError: no complete output at ``path``, or a split it does not hold.
    """

    def __init__(
        self,
        path: str,
        split: str = "data",
        *,
        shuffle_buffer: int = 0,
        seed: int | None = None,
        batch_size: int | None = None,
        drop_remainder: bool = False,
        transform: Callable[[dict], dict] | None = None,
        features: Sequence[str] | None = None,
        rank: int = 0,
        world_size: int = 1,
        normalize: bool | str = False,
        normalized_fill: float = 0.0,
    ):
        if torch is None:
            raise ImportError(_NO_TORCH)
        super().__init__()
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside 0..{world_size - 1}")
        # Reads schema.json (and stats.json to normalise) now: a bad path fails here, not in a worker.
        self.reader = Reader(path, split, normalize=normalize, normalized_fill=normalized_fill)
        known = [f.name for f in self.reader.features]
        unknown = [name for name in features or () if name not in known]
        if unknown:
            raise ValueError(f"{path}: no feature {unknown[0]!r}; it has: {', '.join(known)}")
        # Every tensor a DataLoader worker returns costs a shared-memory transfer: send only these.
        self.features = list(features) if features is not None else known
        self.shuffle_buffer = shuffle_buffer
        self.seed = seed
        self.batch_size = batch_size
        self.drop_remainder = drop_remainder
        self.transform = transform
        self.rank = rank
        self.world_size = world_size
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch whose order the next iteration yields (as DistributedSampler does)."""
        self.epoch = epoch

    def _partition(self) -> tuple[int, int]:
        """This iterator's index among all readers of the epoch, and their number."""
        info = get_worker_info()
        workers, worker = (info.num_workers, info.id) if info is not None else (1, 0)
        return self.rank * workers + worker, self.world_size * workers

    def _rng(self, *keys: int) -> np.random.Generator:
        if self.seed is None:
            return np.random.default_rng()
        return np.random.default_rng([self.seed, self.epoch, *keys])

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        index, count = self._partition()
        shards = list(self.reader.shards)
        if self.shuffle_buffer and self.seed is not None:
            # Every worker draws the same shard order (same seed and epoch), so the split between
            # them stays a partition.
            order = self._rng().permutation(len(shards))
            shards = [shards[i] for i in order]
        mine = shards[index::count]
        if self.shuffle_buffer and self.seed is None:
            np.random.default_rng().shuffle(mine)
        if self.batch_size and not self.shuffle_buffer:
            items = self.reader.iter_batches(self.batch_size, self.drop_remainder, shards=mine)
        else:
            items = self.reader.iter_examples(mine)
            if self.shuffle_buffer:
                # Buffer copies: a buffered view would keep its whole decoded block alive.
                copies = ({name: sample[name].copy() for name in self.features} for sample in items)
                items = shuffled(copies, self.shuffle_buffer, self._rng(index))
            if self.batch_size:
                rows = ({name: value[None] for name, value in sample.items()} for sample in items)
                items = rebatch(rows, self.batch_size, self.drop_remainder)
        for item in items:
            tensors = {name: torch.from_numpy(_owned(item[name])) for name in self.features}
            yield self.transform(tensors) if self.transform else tensors


def _owned(value: np.ndarray) -> np.ndarray:
    """The array itself if it owns its memory, else a copy.

    Samples are views of a decoded block: a tensor made from a view keeps the whole block alive
    and, sent from a DataLoader worker, ships all of it through shared memory.
    """
    if value.base is None or value.base.nbytes == value.nbytes:
        return value
    return value.copy()
