"""One global stream per seed: each rank's share, every sample once an epoch, an exact resume on any number of ranks."""

from __future__ import annotations

import json
import shutil
from itertools import islice, zip_longest

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from synthetic_output import make_columns, write_output, write_schema

from schemas import epoch_order, open_source, shuffled_stream
from schemas.errors import UserError
from schemas.random_access import RandomAccessSource
from schemas.schema import Feature, Schema
from schemas.stream import ShuffledStream

N = 103
BIG = 3520  # a multiple of 4: the epoch's end is a step boundary for 1, 2 and 4 ranks
EVEN = 96  # a multiple of 1, 2, 3, 4, 6, 8 and 12 ranks
FEATURES = (Feature("index/time", "int64", (), (), "index", {"dim": "time"}),)


@pytest.fixture(scope="module")
def output(tmp_path_factory):
    path = tmp_path_factory.mktemp("stream") / "out"
    write_output(path, make_columns(FEATURES, N), [40, 33, 30], features=FEATURES)
    return str(path)


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    path = tmp_path_factory.mktemp("stream") / "big"
    write_output(path, make_columns(FEATURES, BIG), [1500, 1000, 1020], features=FEATURES)
    return str(path)


@given(st.integers(0, 5000), st.integers(0, 2**64 - 1), st.integers(0, 1000))
def test_each_epoch_is_a_permutation_evaluated_per_position(n, seed, epoch):
    order = epoch_order(n, seed, epoch)
    assert sorted(order.tolist()) == list(range(n))
    if n:
        positions = np.array([n - 1, 0, n // 2])
        assert epoch_order(n, seed, epoch, positions).tolist() == order[positions].tolist()


def test_orders_differ_between_epochs_and_seeds_and_not_between_runs():
    orders = {(seed, epoch): tuple(epoch_order(1000, seed, epoch)) for seed in range(3) for epoch in range(3)}
    assert len(set(orders.values())) == 9
    assert tuple(epoch_order(1000, 1, 2)) == orders[1, 2]
    # The same on every machine: pinned, as a checkpoint taken on one machine is resumed on another.
    assert epoch_order(10, 0, 0).tolist() == [4, 6, 9, 0, 8, 2, 5, 3, 7, 1]
    assert epoch_order(10, np.uint64(2**64 - 1), 0).tolist() == epoch_order(10, 2**64 - 1, 0).tolist()


@pytest.mark.parametrize(
    ("seed", "message"),
    [
        (-1, "seed: -1 is outside 0..2\\*\\*64-1"),  # was taken as 2**64 - 1
        (2**64, "seed: 18446744073709551616 is outside"),  # was taken as 0
        (True, "seed: True is not a whole number"),
        (1.0, "seed: 1.0 is not a whole number"),
        ("1", "seed: '1' is not a whole number"),
        (None, "seed: None is not a whole number"),
    ],
)
def test_a_seed_that_would_alias_another_or_is_no_whole_number_is_refused(output, seed, message):
    with pytest.raises(UserError, match=message):
        epoch_order(10, seed, 0)
    with pytest.raises(UserError, match=message):
        shuffled_stream(output, seed=seed)


def test_an_epoch_outside_the_keys_range_is_refused():
    with pytest.raises(UserError, match=r"epoch: -1 is outside 0\.\.2"):
        epoch_order(10, 0, -1)


def test_a_billion_samples_need_no_list_of_them():
    assert len(set(epoch_order(10**9, 5, 0, np.arange(0, 10**9, 10**5)).tolist())) == 10**4


def ids(stream, count=None) -> list[int]:
    return [int(sample["index/time"]) for sample in islice(stream, count)]


def interleave(per_rank: list[list[int]]) -> list[int]:
    """Steps taken together: step k is rank 0's k-th sample, rank 1's k-th, ... (the last step may be partial)."""
    return [i for step in zip_longest(*per_rank) for i in step if i is not None]


def uninterrupted(n: int, seed: int, epochs: int, keep: int | None = None) -> list[int]:
    """The single-rank stream: each epoch's order (its first ``keep`` positions), one after the other."""
    return [i for epoch in range(epochs) for i in epoch_order(n, seed, epoch)[:keep].tolist()]


def run_ranks(output, world, state=None, steps=None, epochs=None, **options):
    """Ranks stepping together, reading samples; their samples in step order and the state they all report after."""
    streams = [
        shuffled_stream(output, seed=3, rank=r, world_size=world, state=state, epochs=epochs, **options)
        for r in range(world)
    ]
    per_rank = [ids(s, steps) for s in streams]
    states = [s.state() for s in streams]
    assert all(s == states[0] for s in states)
    return interleave(per_rank), json.loads(json.dumps(states[0]))


@pytest.mark.parametrize("world", [1, 3, 4])
def test_the_ranks_share_one_global_stream_and_nothing_is_dropped(output, world):
    per_rank = [ids(shuffled_stream(output, seed=9, rank=r, world_size=world, epochs=2)) for r in range(world)]
    assert max(map(len, per_rank)) - min(map(len, per_rank)) <= 1
    steps = interleave(per_rank)
    assert steps == uninterrupted(N, 9, 2)
    assert sorted(steps[:N]) == sorted(steps[N:]) == list(range(N))


@pytest.mark.parametrize(("before", "after"), [(1, 4), (4, 1), (4, 3), (3, 5), (2, 2)])
@pytest.mark.parametrize("at_the_end", [False, True], ids=["mid-epoch", "7 before the epoch's end"])
def test_a_resume_with_another_world_size_continues_the_uninterrupted_stream(output, before, after, at_the_end):
    head, state = run_ranks(output, before, steps=(N - 7) // before if at_the_end else 7)
    assert len(head) == (N - 7 if at_the_end else 7 * before)
    assert state["epoch"] == 0 and state["position"] == len(head)
    tail, final = run_ranks(output, after, state=state, epochs=2)
    # Sample for sample the single-rank stream, the last 7 of epoch 0 included: every sample once an epoch.
    assert head + tail == uninterrupted(N, 3, 2) == ids(shuffled_stream(output, seed=3, epochs=2))
    assert (final["epoch"], final["position"]) == (2, 0)


@pytest.mark.parametrize(("before", "after"), [(1, 4), (4, 1), (4, 3), (3, 5)])
@pytest.mark.parametrize("left", [0, 7], ids=["at the epoch's end", "7 before it"])
def test_a_resume_near_the_epochs_boundary_of_a_split_the_ranks_divide(big, before, after, left):
    source = RandomAccessSource(big)
    steps = (BIG - left) // before
    first = [ShuffledStream(source, seed=3, rank=r, world_size=before) for r in range(before)]
    head = interleave([list(islice(stream.indices(), steps)) for stream in first])
    state = first[0].state(steps)
    assert (state["epoch"], state["position"]) == divmod(steps * before, BIG)
    resumed = [ShuffledStream(source, seed=3, rank=r, world_size=after, state=state, epochs=2) for r in range(after)]
    assert head + interleave([list(stream.indices()) for stream in resumed]) == uninterrupted(BIG, 3, 2)


@pytest.fixture(scope="module")
def even(tmp_path_factory):
    path = tmp_path_factory.mktemp("stream") / "even"
    write_output(path, make_columns(FEATURES, EVEN), [50, 46], features=FEATURES)
    return str(path)


@given(
    st.sampled_from([N, EVEN]),
    st.integers(1, 6),
    st.integers(1, 6),
    st.floats(0, 2.5),
    st.sampled_from([1, 1, 2, 4, 6, 8, 12, 24, 60, 200]),
)
def test_any_resume_is_the_uninterrupted_stream_and_each_epoch_holds_a_sample_at_most_once(
    output, even, n, before, after, fraction, multiple
):
    source = RandomAccessSource(output if n == N else even)
    kept = n - n % multiple
    epochs = 3
    steps = int(fraction * kept) // before
    first = [ShuffledStream(source, seed=11, rank=r, world_size=before, epoch_multiple=multiple) for r in range(before)]
    state = first[0].state(steps)
    assert all(stream.state(steps) == state for stream in first)
    head = interleave([list(islice(stream.indices(), steps)) for stream in first])
    streams = [
        ShuffledStream(source, seed=11, rank=r, world_size=after, state=state, epochs=epochs, epoch_multiple=multiple)
        for r in range(after)
    ]
    per_rank = [list(stream.indices()) for stream in streams]
    whole = uninterrupted(n, 11, epochs, keep=kept)
    assert head + interleave(per_rank) == whole
    for epoch in range(epochs):
        assert len(set(whole[epoch * kept : (epoch + 1) * kept])) == kept
    start = state["epoch"] * kept + state["position"]
    if multiple % after == 0 and start % after == 0:  # equal per-rank epochs: every step inside one epoch
        assert len({len(indices) for indices in per_rank}) == 1


def test_an_epoch_multiple_drops_the_same_positions_at_any_world_size(output):
    # 103 samples, a multiple of 8: each epoch keeps the first 96 positions of its order (other samples each epoch).
    alone, _ = run_ranks(output, 1, epochs=2, epoch_multiple=8)
    assert alone == uninterrupted(N, 3, 2, keep=96)
    four = [ids(shuffled_stream(output, seed=3, rank=r, world_size=4, epochs=2, epoch_multiple=8)) for r in range(4)]
    assert [len(p) for p in four] == [48] * 4 and interleave(four) == alone
    head, state = run_ranks(output, 4, steps=10, epoch_multiple=8)  # 40 samples: a multiple of 8 ranks too
    tail, _ = run_ranks(output, 8, state=state, epochs=2, epoch_multiple=8)
    assert head + tail == alone
    with pytest.raises(UserError, match="saved with epoch_multiple 8, resumed with 1"):
        shuffled_stream(output, seed=3, state=state)


def test_the_state_after_some_steps_is_where_iterating_them_leaves(output):
    stream = shuffled_stream(output, seed=3, rank=1, world_size=4, epochs=3)
    start = stream.state()
    for steps in (0, 1, 24, 25, 26, 51, 60, 77, 78, 100):
        moved = shuffled_stream(output, seed=3, rank=1, world_size=4, state=start, epochs=3)
        ids(moved, steps)
        assert stream.state(steps) == moved.state(), steps
    assert stream.state(100) == {**start, "epoch": 3, "position": 0}  # past the end: the end
    later = {**start, "epoch": 5, "position": 10}
    assert shuffled_stream(output, seed=3, state=later, epochs=3).state(1) == later  # never rewound


def test_the_indices_are_a_sampler_whose_order_does_not_depend_on_the_reader(output):
    stream = shuffled_stream(output, seed=3, rank=2, world_size=3, epochs=2)
    source = open_source(output)
    assert [int(source[i]["index/time"]) for i in stream.indices()] == ids(stream)


@pytest.fixture(scope="module")
def two_splits(tmp_path_factory):
    """An output with splits train and val of N samples each."""
    base = tmp_path_factory.mktemp("splits")
    columns = make_columns(FEATURES, N)
    parts = [write_output(base / name, columns, [50, 53], features=FEATURES, split=name) for name in ("train", "val")]
    for name in ("train", "val"):
        for file in (base / name).glob(f"{name}-*"):
            shutil.move(file, base / file.name)
    schema = Schema(features=FEATURES, splits={**parts[0].splits, **parts[1].splits}, seed=7)
    write_schema(base, schema)
    (base / "stats.json").write_text("{}")
    return str(base)


def test_a_state_on_another_split_of_the_same_size_is_refused(two_splits):
    train = shuffled_stream(two_splits, "train", seed=3)
    ids(train, 10)
    with pytest.raises(UserError, match="state: taken on split 'train', resumed on 'val'; resume on the split"):
        shuffled_stream(two_splits, "val", seed=3, state=train.state())
    assert shuffled_stream(two_splits, "train", seed=3, state=train.state()).state() == train.state()


def test_a_state_on_another_output_of_the_same_size_is_refused(output, tmp_path):
    # The same samples in other shards: another file order, so the state's positions mean other samples.
    write_output(tmp_path / "other", make_columns(FEATURES, N), [50, 53], features=FEATURES)
    state = shuffled_stream(output, seed=3).state(30)
    with pytest.raises(UserError, match=r"state: taken on another output than .*other .*resume on the output it was"):
        shuffled_stream(str(tmp_path / "other"), seed=3, state=state)
    shutil.copytree(output, tmp_path / "copy")  # a copy is the same output
    assert shuffled_stream(str(tmp_path / "copy"), seed=3, state=state).state() == state


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"seed": 4}, "saved with seed 4, resumed with seed 3"),
        ({"num_samples": 50}, "a split of 50 samples, this one has 103; .* put epoch 1 and position 0 into a fresh"),
        ({"position": N}, "epoch 0, position 103 are out of range"),
        ({"epoch": -1}, "out of range"),
        ({"epoch": 2**62}, "out of range"),
        ({"epoch": "0"}, "must be whole numbers"),
        ({"position": True}, "must be whole numbers"),
        ({"format": "xarray-tfrecords/stream-3"}, "format 'xarray-tfrecords/stream-3' is not"),
        ({"output": "sha256:0"}, "taken on another output"),
    ],
)
def test_a_state_from_elsewhere_is_refused_in_one_line(output, change, message):
    state = {**shuffled_stream(output, seed=3).state(), **change}
    with pytest.raises(UserError, match=message):
        shuffled_stream(output, seed=3, state=state)


@pytest.mark.parametrize(
    ("state", "message"),
    [
        ({"seed": 3, "epoch": 0, "position": 7, "num_samples": N}, "first format .* names no output"),
        ({"seed": 3, "position": 0}, "expected a dict with exactly format, output, split"),
        ([3, 0, 0], "expected a dict"),
    ],
)
def test_a_state_of_the_first_format_or_another_shape_is_refused(output, state, message):
    with pytest.raises(UserError, match=message):
        shuffled_stream(output, seed=3, state=state)


def test_a_first_format_state_carried_into_a_fresh_one_resumes_where_it_was(output):
    old = {"seed": 3, "epoch": 1, "position": 7, "num_samples": N}  # what the first format saved: epoch 1, 7 taken
    state = {**shuffled_stream(output, seed=3).state(), "epoch": old["epoch"], "position": old["position"]}
    assert ids(shuffled_stream(output, seed=3, state=state, epochs=2)) == epoch_order(N, 3, 1)[7:].tolist()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"rank": 4, "world_size": 4}, "rank 4 of world_size 4"),
        ({"world_size": 0}, "world_size: 0 is not a whole number of at least 1"),
        ({"epoch_multiple": 0}, "epoch_multiple: 0 is not a whole number of at least 1"),
        ({"epochs": -1}, "epochs: -1 is not"),
    ],
)
def test_a_rank_outside_the_world_or_a_bad_option_is_refused(output, options, message):
    with pytest.raises(UserError, match=message):
        shuffled_stream(output, seed=3, **options)


def test_a_split_shorter_than_the_multiple_streams_nothing(output):
    stream = shuffled_stream(output, seed=3, epoch_multiple=N + 1)
    assert ids(stream) == [] and stream.state()["position"] == 0
