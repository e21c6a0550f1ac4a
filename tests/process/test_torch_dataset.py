"""The torch IterableDataset: every sample once per epoch across DataLoader workers, equal to the reader."""

from __future__ import annotations

import numpy as np
import pytest
from synthetic_output import FEATURES, make_columns, write_output

from schemas.reader import read_split

pytest.importorskip("torch")
import torch
from torch.utils.data import DataLoader

from schemas.torch_dataset import SplitDataset

pytestmark = pytest.mark.torch
SAMPLES = 61


@pytest.fixture(scope="module")
def output(tmp_path_factory):
    directory = tmp_path_factory.mktemp("torch_output")
    write_output(directory, make_columns(FEATURES, SAMPLES), [9, 17, 0, 20, 15], compression="gzip")
    return str(directory)


def concat(batches) -> dict[str, np.ndarray]:
    return {name: torch.cat([b[name] for b in batches]).numpy() for name in batches[0]}


def by_sample(columns: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    order = np.argsort(columns["index/time"])
    return {name: values[order] for name, values in columns.items()}


def assert_same_samples(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    got, want = by_sample(got), by_sample(want)
    assert sorted(got) == sorted(want)
    for name in want:
        assert got[name].dtype == want[name].dtype and got[name].shape == want[name].shape, name
        assert got[name].tobytes() == want[name].tobytes(), name


def test_two_workers_give_every_sample_once_and_equal_the_reader(output):
    expected = read_split(output)
    loader = DataLoader(SplitDataset(output), batch_size=8, num_workers=2)
    got = concat(list(loader))
    assert sorted(got["index/time"].tolist()) == list(range(SAMPLES))
    assert_same_samples(got, expected)
    assert got["t"].shape == (SAMPLES, 2, 3, 4) and got["w"].shape == (SAMPLES,)


def test_seeded_shuffle_is_reproducible_per_epoch_and_a_permutation(output):
    dataset = SplitDataset(output, shuffle_buffer=16, seed=3, batch_size=5)
    loader = DataLoader(dataset, batch_size=None, num_workers=2)

    def order():
        return concat(list(loader))["index/time"].tolist()

    first = order()
    assert sorted(first) == list(range(SAMPLES)) and first != sorted(first)
    assert order() == first
    dataset.set_epoch(1)
    assert order() != first and sorted(order()) == list(range(SAMPLES))


def test_single_process_samples_and_distributed_ranks(output):
    samples = list(SplitDataset(output))
    assert len(samples) == SAMPLES and isinstance(samples[0]["t"], torch.Tensor)
    assert samples[0]["index/time"].shape == () and samples[0]["t"].dtype == torch.float32
    ranks = [SplitDataset(output, rank=r, world_size=2, batch_size=7) for r in range(2)]
    seen = [int(i) for dataset in ranks for batch in dataset for i in batch["index/time"]]
    assert sorted(seen) == list(range(SAMPLES))
    only = next(iter(SplitDataset(output, features=["w", "index/time"], batch_size=4)))
    assert sorted(only) == ["index/time", "w"] and only["w"].shape == (4,)
    with pytest.raises(ValueError, match="no feature 'nope'"):
        SplitDataset(output, features=["nope"])
    doubled = SplitDataset(output, transform=lambda s: {**s, "w": s["w"] * 2})
    np.testing.assert_array_equal([float(s["w"]) for s in doubled], [2 * float(s["w"]) for s in samples])


def test_a_map_style_dataloader_with_workers_reads_the_streams_order(tmp_path):
    """The random-access source, a stream's indices as the sampler: the order is the stream's, whatever the workers."""
    from schemas import open_source, shuffled_stream

    write_output(tmp_path / "plain", make_columns(FEATURES, SAMPLES), [9, 17, 0, 20, 15])
    stream = shuffled_stream(str(tmp_path / "plain"), seed=5, rank=1, world_size=2, epochs=1)
    sampler = list(stream.indices())  # from the stream's state: before iterating it
    expected = [int(s["index/time"]) for s in stream]
    assert len(expected) == SAMPLES // 2
    for workers in (0, 2):
        loader = DataLoader(open_source(str(tmp_path / "plain")), batch_size=4, sampler=sampler, num_workers=workers)
        assert concat(list(loader))["index/time"].tolist() == expected, workers
