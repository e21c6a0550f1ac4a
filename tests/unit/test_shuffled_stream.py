"""A fresh global order every epoch; each rank's share; a resume that is exact with another number of ranks."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from synthetic_output import make_columns, write_output

from schemas import epoch_order, open_source, shuffled_stream
from schemas.errors import UserError
from schemas.schema import Feature

N = 103
FEATURES = (Feature("index/time", "int64", (), (), "index", {"dim": "time"}),)


@pytest.fixture(scope="module")
def output(tmp_path_factory):
    path = tmp_path_factory.mktemp("stream") / "out"
    write_output(path, make_columns(FEATURES, N), [40, 33, 30], features=FEATURES)
    return str(path)


@given(st.integers(0, 5000), st.integers(0, 2**63), st.integers(0, 1000))
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


def test_a_billion_samples_need_no_list_of_them():
    assert len(set(epoch_order(10**9, 5, 0, np.arange(0, 10**9, 10**5)).tolist())) == 10**4


def ids(stream, count=None) -> list[int]:
    out = []
    if count == 0:
        return out
    for sample in stream:
        out.append(int(sample["index/time"]))
        if count is not None and len(out) == count:
            break
    return out


def interleave(per_rank: list[list[int]]) -> list[int]:
    """Steps taken together: step k is rank 0's k-th sample, rank 1's k-th, ..."""
    return [i for step in zip(*per_rank) for i in step]


def test_every_sample_once_an_epoch_across_ranks_and_fewer_than_a_step_dropped(output):
    world = 4
    per_rank = [ids(shuffled_stream(output, seed=9, rank=r, world_size=world, epochs=2)) for r in range(world)]
    assert {len(p) for p in per_rank} == {2 * (N // world)}
    steps = interleave(per_rank)
    first, second = steps[: N // world * world], steps[N // world * world :]
    assert len(set(first)) == len(first) == 100 and len(set(second)) == 100
    assert first == epoch_order(N, 9, 0)[:100].tolist() and second == epoch_order(N, 9, 1)[:100].tolist()


def run_ranks(output, world, state=None, steps=None, epochs=None):
    """Ranks stepping together; their samples in step order and the state they all report after."""
    streams = [
        shuffled_stream(output, seed=3, rank=r, world_size=world, state=state, epochs=epochs) for r in range(world)
    ]
    per_rank = [ids(s, steps) for s in streams]
    states = [s.state() for s in streams]
    assert all(s == states[0] for s in states)
    return interleave(per_rank), json.loads(json.dumps(states[0]))


@pytest.mark.parametrize(("before", "after"), [(4, 1), (1, 4), (3, 5), (2, 2)])
@pytest.mark.parametrize("at_the_end", [False, True], ids=["mid-epoch", "at the epoch's end"])
def test_a_resume_with_another_world_size_continues_the_order_exactly(output, before, after, at_the_end):
    head, state = run_ranks(output, before, steps=N // before if at_the_end else 7)
    tail, _ = run_ranks(output, after, state=state, epochs=2)
    epoch0, epoch1 = epoch_order(N, 3, 0).tolist(), epoch_order(N, 3, 1).tolist()
    assert state == {"seed": 3, "epoch": int(at_the_end), "position": 0 if at_the_end else len(head), "num_samples": N}
    # Epoch 0 in the global order, without a gap or a repeat, less fewer than a step of the last world size at
    # its end; then epoch 1 as the new world size takes it.
    done = len(head) if at_the_end else len(head) + (N - len(head)) // after * after
    assert N - done < (before if at_the_end else after)
    assert (head + tail)[:done] == epoch0[:done]
    assert (head + tail)[done:] == epoch1[: N // after * after]


def test_the_state_after_some_steps_is_where_iterating_them_leaves(output):
    stream = shuffled_stream(output, seed=3, rank=1, world_size=4, epochs=3)
    start = stream.state()
    for steps in (0, 1, 24, 25, 26, 51, 60):
        moved = shuffled_stream(output, seed=3, rank=1, world_size=4, state=start)
        ids(moved, steps)
        assert stream.state(steps) == moved.state(), steps


def test_the_indices_are_a_sampler_whose_order_does_not_depend_on_the_reader(output):
    stream = shuffled_stream(output, seed=3, rank=2, world_size=3, epochs=1)
    source = open_source(output)
    assert [int(source[i]["index/time"]) for i in stream.indices()] == ids(stream)


@pytest.mark.parametrize(
    ("state", "message"),
    [
        ({"seed": 4, "epoch": 0, "position": 0, "num_samples": N}, "saved with seed 4, resumed with seed 3"),
        ({"seed": 3, "epoch": 0, "position": 0, "num_samples": 50}, "saved for a split of 50 samples"),
        ({"seed": 3, "epoch": 0, "position": N + 1, "num_samples": N}, "out of range"),
        ({"seed": 3, "epoch": "0", "position": 0, "num_samples": N}, "must be whole numbers"),
        ({"seed": 3, "position": 0}, "expected a dict with exactly seed, epoch, position, num_samples"),
        ([3, 0, 0], "expected a dict"),
    ],
)
def test_a_state_from_elsewhere_is_refused_in_one_line(output, state, message):
    with pytest.raises(UserError, match=message):
        shuffled_stream(output, seed=3, state=state)


def test_a_rank_outside_the_world_is_refused(output):
    with pytest.raises(UserError, match="rank 4 of world_size 4"):
        shuffled_stream(output, seed=3, rank=4, world_size=4)
