"""Reassembly a variable at a time: bucket frames read for some arrays only, scans' held samples, the shared share."""

from __future__ import annotations

import io
import threading
import types

import numpy as np
import pytest

import transforms.reassemble as reassemble


def _frames(count: int, first: int = 0) -> list[dict[str, np.ndarray]]:
    """``count`` frames of two samples each: keys, and arrays whose values name their sample."""
    frames = []
    for i in range(first, first + count):
        samples = np.array([2 * i, 2 * i + 1])
        frames.append(
            {
                "index/lat": samples,
                "t": np.repeat(samples, 6).reshape(2, 2, 3).astype("f4"),
                "u": np.repeat(samples, 4).reshape(2, 4).astype("f8"),
            }
        )
    return frames


def _bucket(pieces_per_frame: list[list[dict[str, np.ndarray]]]) -> bytes:
    stream = io.BytesIO()
    stream.write(reassemble._BUCKET_MAGIC)
    for pieces in pieces_per_frame:
        reassemble.write_frame(stream, pieces)
    return stream.getvalue()


def test_a_frame_of_pieces_reads_back_as_their_samples_and_a_pass_reads_only_its_arrays():
    frames = _frames(4)
    data = _bucket([frames[:3], frames[3:]])  # three pieces in one frame, then one
    whole = list(reassemble.iter_bucket(io.BytesIO(data), "b"))
    assert [len(f["index/lat"]) for f in whole] == [6, 2]
    for name in ("index/lat", "t", "u"):
        want = np.concatenate([f[name] for f in frames])
        np.testing.assert_array_equal(np.concatenate([f[name] for f in whole]), want)
    seen: dict[str, int] = {}
    some = list(reassemble.iter_bucket(io.BytesIO(data), "b", names={"index/lat", "u"}, seen=seen))
    assert all(f.keys() == {"index/lat", "u"} for f in some)
    np.testing.assert_array_equal(np.concatenate([f["u"] for f in some]), np.concatenate([f["u"] for f in frames]))
    assert seen == {"index/lat": 1, "t": 6, "u": 4}  # values per sample of every array, read or skipped


def test_a_pass_that_skips_an_array_still_refuses_a_bucket_cut_short_inside_it():
    data = _bucket([_frames(2)])
    cut = data[: -(2 * 2 * 4 * 8) - 5]  # into the last frame's t, before its u
    with pytest.raises(ValueError, match="b: cut short in t"):
        list(reassemble.iter_bucket(io.BytesIO(cut), "b", names={"index/lat", "u"}))
    with pytest.raises(ValueError, match="b: cut short in u"):
        list(reassemble.iter_bucket(io.BytesIO(data[:-3]), "b", names={"index/lat"}))


def test_a_scan_holds_samples_by_chunk_and_writes_each_chunks_as_few_frames_in_order(tmp_path, monkeypatch):
    frames = _frames(12)
    monkeypatch.setattr(reassemble, "PENDING_BYTES", 3 * sum(a.nbytes for a in frames[0].values()))
    plan = types.SimpleNamespace(work=str(tmp_path))
    finished = []
    with reassemble._OpenBuckets(plan, "predictions.npz") as buckets:
        pending = reassemble._Pending(buckets)
        for i, frame in enumerate(frames):
            if i == 7:  # another layout (a prediction file with one more array): a frame of its own
                frame = {**frame, "v": frame["u"]}
            finished += pending.add(i % 2, frame)
        finished += pending.flush()
        finished += buckets.close()
    got: dict[int, list] = {0: [], 1: []}
    for chunk, path in finished:
        with open(path, "rb") as stream:
            for frame in reassemble.iter_bucket(stream, path):
                np.testing.assert_array_equal(frame["t"][:, 0, 0], frame["index/lat"])
                got[chunk].append(frame["index/lat"].tolist())
    # Each chunk's samples in the order they came, in frames of up to three pieces (the held bytes' limit),
    # sample 7's layout in a frame of its own.
    want = {c: [s for i, f in enumerate(frames) if i % 2 == c for s in f["index/lat"].tolist()] for c in (0, 1)}
    assert {c: [s for f in v for s in f] for c, v in got.items()} == want
    assert all(len(f) <= 6 for v in got.values() for f in v)
    assert [14, 15] in got[1] and len(got[0]) + len(got[1]) < len(frames)


def test_a_share_over_what_is_left_waits_for_one_given_back_and_a_whole_one_waits_for_all():
    held = reassemble._Held(1.0)
    held.take(0.6)
    took = threading.Event()
    waiter = threading.Thread(target=lambda: (held.take(0.6), took.set()))
    waiter.start()
    assert not took.wait(0.2)  # 1.2 would be over the limit
    held.give_back(0.6)
    assert took.wait(5)
    waiter.join()
    took.clear()
    waiter = threading.Thread(target=lambda: (held.take(2.0), took.set()))  # more than the limit: alone
    waiter.start()
    assert not took.wait(0.2)
    held.give_back(0.6)
    assert took.wait(5)
    waiter.join()
    assert held.held == pytest.approx(2.0)


def test_shares_are_given_back_once_every_write_of_a_variable_is_done(monkeypatch):
    import concurrent.futures

    held = reassemble._Held(1.0)
    monkeypatch.setattr(reassemble, "_HELD", held)
    held.take(0.8)
    futures = [concurrent.futures.Future(), None, concurrent.futures.Future()]  # None: not this task's to write
    reassemble._give_back_when_done(futures, 0.8)
    futures[0].set_result(None)
    assert held.held == pytest.approx(0.8)
    futures[2].set_exception(OSError("disk full"))  # (the task raises it; its share is not kept forever)
    assert held.held == 0
    held.take(0.3)
    reassemble._give_back_when_done([None], 0.3)
    assert held.held == 0
