"""Reassembly's command line against hostile predictions and destinations, and stopped part-way (SIGTERM).

Predictions are .npz files and TFRecords written next to a real output built from NetCDF files;
every refusal is one line that names the prediction file (or --to) and the fix, and a stopped or
failed run leaves neither its store nor its working folder, nor Beam's temp folder.
"""

from __future__ import annotations

import io
import os
import shutil
import signal
import subprocess
import sys
import time
import tracemalloc
import zipfile
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

from schemas import Reader, UserError, load_schema
from schemas.prediction_files import read_predictions

from helpers import build_quietly

#: A reassembly that opens a FIFO among the predictions (or as --to) blocks for ever: the alarm ends it. The
#: slowest test here (a stop part way) takes about a minute.
pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def overlapping(small_archive, tmp_path_factory) -> Path:
    """Overlapping windows, pairs along time, two splits: samples that share cells, as a model's would."""
    tmp = tmp_path_factory.mktemp("hostile")
    config = {
        "input": {"paths": str(small_archive / "*.nc")},
        "variables": ["t", "u"],
        "sample": {
            "window": {"lat": {"size": 8, "stride": 5}, "lon": {"size": 6, "stride": 4}},
            "offsets": {"time": [0, 1]},
            "keep": ["level"],
        },
        "splits": {"train": {"time": [None, "2020-01-02T00"]}, "valid": {"time": ["2020-01-02T06", None]}},
        "output": {"path": str(tmp / "out"), "num_shards": 2},
    }
    return build_quietly(config, tmp)


def reassemble_cli(*argv: str, capsys=None) -> tuple[int, str]:
    from pipelines.reassemble import main

    code = main([*argv, "--quiet"])
    err = capsys.readouterr().err if capsys is not None else ""
    return code, err


def _batch(output: Path, split: str = "train") -> dict[str, np.ndarray]:
    """One batch of the split's records: keys and the stored features (what a model's predictions hold)."""
    batch = next(Reader(str(output), split).iter_chunks())
    return {k: v for k, v in batch.items() if k.startswith("index/") or k in ("t", "u")}


def _refused(output: Path, predictions: Path, tmp_path: Path, capsys, split: str = "train") -> str:
    to = tmp_path / "x.zarr"
    code, err = reassemble_cli(
        str(output), "--split", split, "--to", str(to), "--predictions", str(predictions), capsys=capsys
    )
    assert code == 2 and err.count("\n") == 1 and err.startswith("error: "), (code, err)
    assert not to.exists() and not Path(f"{to}.parts").exists()
    return err.strip()


# ---- prediction files -------------------------------------------------------------------------------------------


def test_a_fifo_or_a_folder_among_the_predictions_is_refused_without_being_opened(overlapping, tmp_path, capsys):
    folder = tmp_path / "predictions"
    folder.mkdir()
    np.savez(folder / "b.npz", **_batch(overlapping))
    os.mkfifo(folder / "a.npz")  # nothing ever writes to it: an open would wait for ever
    err = _refused(overlapping, folder, tmp_path, capsys)
    assert err == f"error: --predictions: {folder / 'a.npz'} is not a regular file (a FIFO); move it out of the folder"
    (folder / "a.npz").unlink()
    (folder / "c.tfrecord").mkdir()
    assert "c.tfrecord is not a regular file (a directory)" in _refused(overlapping, folder, tmp_path, capsys)


def _npz_declaring(path: Path, arrays: dict[str, tuple[str, tuple[int, ...]]], data: int = 64) -> None:
    """An .npz whose members declare these dtypes and shapes, holding only ``data`` bytes of values each (a
    reader that trusted the headers would allocate and decompress what they declare)."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, (dtype, shape) in arrays.items():
            header = io.BytesIO()
            np.lib.format.write_array_header_1_0(
                header, {"descr": np.dtype(dtype).str, "fortran_order": False, "shape": shape}
            )
            archive.writestr(f"{name}.npy", header.getvalue() + bytes(data))


def test_an_npz_bomb_is_refused_from_its_headers_before_it_is_decompressed(overlapping, tmp_path, capsys):
    """A 200 MB array of zeros compresses to a few hundred KB: its header says so, and nothing is decompressed."""
    schema = load_schema(str(overlapping))
    folder = tmp_path / "bomb"
    folder.mkdir()
    samples = 200 * 2**20 // (schema.feature("t").size * 4)
    with zipfile.ZipFile(folder / "a.npz", "w", zipfile.ZIP_DEFLATED) as archive:
        with archive.open("t.npy", "w", force_zip64=True) as member:
            np.lib.format.write_array(member, np.zeros((samples, *schema.feature("t").shape), np.float32))
        with archive.open("index/time.npy", "w") as member:
            np.lib.format.write_array(member, np.zeros(samples, np.int64))
    assert (folder / "a.npz").stat().st_size < 2**20
    tracemalloc.start()
    try:
        with pytest.raises(UserError, match=r"a\.npz: its arrays declare [\d,]+ samples, more than the split holds"):
            list(read_predictions(str(folder / "a.npz"), schema, most_samples=1000))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 20 * 2**20  # (the file's bytes and a member's header: not its 200 MB)
    assert "its arrays declare" in _refused(overlapping, folder, tmp_path, capsys)
    # Headers that declare what the data does not hold: refused on what they declare, never allocated.
    per_sample = {"index/time": ("<i8", (1,)), "index/lat": ("<i8", (1,)), "index/lon": ("<i8", (1,))}
    for name, arrays, message in (
        ("huge", {**per_sample, "pred": ("<f4", (1, 10**9))}, "'pred' declares 1,000,000,000 values per sample"),
        ("wrong", {**per_sample, "t": ("<f4", (1, 2, 3, 8, 5))}, "'t' has shape (2, 3, 8, 5) where the output's"),
        ("objects", {**per_sample, "t": ("|O", (1, 288))}, "'t' holds object, not numbers"),
    ):
        (tmp_path / name).mkdir()
        _npz_declaring(tmp_path / name / "p.npz", arrays)
        err = _refused(overlapping, tmp_path / name, tmp_path, capsys)
        assert err.startswith(f"error: {tmp_path / name / 'p.npz'}: ") and message in err, err


def test_a_gzipped_tfrecord_bomb_is_refused_from_its_record_header(overlapping, tmp_path, capsys):
    """A record header declaring 100 MB, of zeros that gzip makes 100 KB: refused from the header, unread."""
    import gzip

    from schemas.tfrecord import masked_crc

    folder = tmp_path / "bomb"
    folder.mkdir()
    size = 100 * 2**20
    length = size.to_bytes(8, "little")
    with gzip.open(folder / "p.tfrecord.gz", "wb") as stream:
        stream.write(length + masked_crc(length).to_bytes(4, "little"))
        for _ in range(size // 2**20):
            stream.write(bytes(2**20))
        stream.write(bytes(4))
    assert (folder / "p.tfrecord.gz").stat().st_size < 2**20
    tracemalloc.start()
    try:
        with pytest.raises(UserError, match=r"p\.tfrecord\.gz: a record declares at least [0-9,]+ bytes, more than"):
            list(read_predictions(str(folder / "p.tfrecord.gz"), load_schema(str(overlapping))))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 20 * 2**20
    assert "a record declares at least" in _refused(overlapping, folder, tmp_path, capsys)


def test_a_float_index_is_refused_not_truncated(overlapping, tmp_path, capsys):
    import tensorflow as tf

    batch = _batch(overlapping)
    folder = tmp_path / "floats"
    folder.mkdir()
    np.savez(folder / "p.npz", **{**batch, "index/lat": batch["index/lat"] + 0.5})
    err = _refused(overlapping, folder, tmp_path, capsys)
    assert f"{folder / 'p.npz'}: 'index/lat' holds float64; an index is the record's integer index/<dim>" in err
    records = tmp_path / "records"
    records.mkdir()
    with tf.io.TFRecordWriter(str(records / "p.tfrecord")) as writer:
        feature = {
            name: tf.train.Feature(float_list=tf.train.FloatList(value=np.ravel(values[0]) + 0.5))
            for name, values in batch.items()
        }
        writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
    err = _refused(overlapping, records, tmp_path, capsys)
    assert f"{records / 'p.tfrecord'}: record 0: 'index/" in err and "holds 1 float32 value(s)" in err, err


def test_a_name_zarr_would_change_is_refused_in_one_line(overlapping, tmp_path, capsys):
    batch = _batch(overlapping)
    for i, name in enumerate(("t\\500", "t/500", ".zattrs")):
        folder = tmp_path / f"named-{i}"
        folder.mkdir()
        np.savez(folder / "p.npz", **{k: v for k, v in batch.items() if k != "t"}, **{name: batch["t"]})
        err = _refused(overlapping, folder, tmp_path, capsys)
        assert err.startswith(f"error: {folder / 'p.npz'}: the prediction name {name!r} cannot name a variable"), err


def test_every_prediction_error_names_its_file(overlapping, tmp_path, capsys):
    """Keys outside the split, shapes unlike the first sample's, samples given twice (in one file or two): each
    names the prediction file(s) it is about, not the output or a bucket of the run's."""
    batch = _batch(overlapping)
    bad_key = tmp_path / "key"
    bad_key.mkdir()
    np.savez(bad_key / "p.npz", **{**batch, "index/lat": np.full_like(batch["index/lat"], 3)})
    err = _refused(overlapping, bad_key, tmp_path, capsys)
    assert err.startswith(f"error: {bad_key / 'p.npz'}: sample (") and "index/lat = 3 is not a sample" in err, err
    twice = tmp_path / "twice"
    twice.mkdir()
    np.savez(twice / "a.npz", **batch)
    np.savez(twice / "b.npz", **batch)
    err = _refused(overlapping, twice, tmp_path, capsys)
    one, other = (
        (twice / "a.npz", twice / "b.npz") if f"error: {twice / 'a.npz'}" in err else (twice / "b.npz", twice / "a.npz")
    )
    assert err.startswith(f"error: {one}: sample (") and f"given twice (also in {other})" in err, err
    inside = tmp_path / "inside"
    inside.mkdir()
    np.savez(inside / "a.npz", **{k: np.concatenate([v, v[:1]]) for k, v in batch.items()})
    err = _refused(overlapping, inside, tmp_path, capsys)
    assert err.startswith(f"error: {inside / 'a.npz'}: ") and "twice" in err, err
    # Each file's own samples of one shape, the two files' of two (4 channels, 5): found as the chunk that both
    # reach is assembled (numpy's concatenate failed there, naming the output), and named by the file that
    # disagrees with the first one placed there.
    extra = tmp_path / "extra"
    extra.mkdir()
    first, second = list(Reader(str(overlapping), "train").iter_chunks(chunk=8))[:2]
    for name, batch, channels in (("a.npz", first, 4), ("b.npz", second, 5)):
        keys = {k: v for k, v in batch.items() if k.startswith("index/")}
        np.savez(extra / name, **keys, pred=np.zeros((len(batch["t"]), 2, 3, 8, 6, channels), np.float32))
    err = _refused(overlapping, extra, tmp_path, capsys)
    assert "'pred' has 4 along 'channel' where the output's samples have 5" in err or "'pred' has 5 along" in err, err
    assert err.startswith((f"error: {extra / 'b.npz'}: ", f"error: {extra / 'a.npz'}: ")), err


# ---- where it writes --------------------------------------------------------------------------------------------


def test_to_inside_the_output_or_in_a_system_folder_is_refused(overlapping, tmp_path, capsys):
    base = [str(overlapping), "--split", "valid"]
    for to, message in (
        (overlapping / "pred.zarr", f"is inside the output {overlapping}; write it beside the output, not in it"),
        (overlapping / "sub" / "back.nc", f"is inside the output {overlapping}"),
        (Path("/dev/null.nc"), "is in /dev, the system's folder, not a folder of files; write it elsewhere"),
        (Path("/proc/x.zarr"), "is in /proc, the system's folder"),
    ):
        existed = {p for p in (Path(f"{to}.parts"), to) if p.exists()}
        try:
            code, err = reassemble_cli(*base, "--to", str(to), capsys=capsys)
            assert code == 2 and err.count("\n") == 1 and message in err, err
            assert not Path(f"{to}.parts").exists()
        finally:  # (what a run before this check wrote there)
            for path in (Path(f"{to}.parts"), to):
                if path not in existed and path.exists():
                    shutil.rmtree(path) if path.is_dir() else path.unlink()
    assert not (overlapping / "pred.zarr").exists()
    fifo = tmp_path / "f.nc"
    os.mkfifo(fifo)
    code, err = reassemble_cli(*base, "--to", str(fifo), "--overwrite", capsys=capsys)
    assert code == 2 and err == f"error: --to: {fifo} is a FIFO, not a file or folder; choose another --to\n"


def test_the_store_is_marked_whole_only_once_every_chunk_is_written(overlapping, tmp_path):
    """The template (before any chunk) carries the unfinished mark, which --overwrite accepts; the marker of a
    whole reassembly comes with the last step."""
    import argparse

    from pipelines import reassemble as cli

    store = str(tmp_path / "s.zarr")
    args = argparse.Namespace(
        output=str(overlapping), split="valid", blend="mean", layout="grid", chunk_mb=0.05, predictions=None
    )
    plan, files = cli.make_plan(args, store, str(tmp_path / "work"))
    cli.write_template(plan, files)
    attrs = xr.open_zarr(store).attrs
    assert cli.REASSEMBLED_FROM not in attrs and attrs[cli.REASSEMBLY_UNFINISHED] == str(overlapping)
    assert cli._reassembled(store, "zarr")  # (--overwrite replaces what a killed run left in place)
    cli.mark_complete(store, plan.output)
    attrs = xr.open_zarr(store).attrs
    assert cli.REASSEMBLY_UNFINISHED not in attrs and attrs[cli.REASSEMBLED_FROM] == str(overlapping)


# ---- stopped ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("signum", "code", "what", "after"),
    [
        (signal.SIGTERM, 143, "stopped by SIGTERM", "template"),
        (signal.SIGINT, 130, "interrupted", "template"),
        (signal.SIGTERM, 143, "stopped by SIGTERM", "a chunk"),
    ],
)
def test_a_stop_part_way_leaves_no_store_no_parts_and_no_beam_folder(overlapping, tmp_path, signum, code, what, after):
    """Stopped once the run has written its store's template (or its first chunk): exit 143 (Ctrl-C: 130) with
    one line; neither the store (under its final name or any other), nor its .parts, nor Beam's temp folder is
    left (it was killed: exit -15, the store under its final name with the marker, its .parts, Beam's)."""
    temp = tmp_path / "temp"
    temp.mkdir()
    to = tmp_path / "t.zarr"
    env = {**os.environ, "TMPDIR": str(temp), "PYTHONPATH": os.pathsep.join([str(Path.cwd()), *sys.path])}
    command = [sys.executable, "-m", "pipelines.reassemble", str(overlapping), "--split", "train", "--to", str(to)]
    run = subprocess.Popen([*command, "--chunk_mb", "0.01"], env=env, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        done, template = Path(f"{to}.parts") / "done", Path(f"{to}.parts") / "data.zarr" / ".zmetadata"

        def reached() -> bool:
            if after == "template":
                return template.exists() or (to / ".zmetadata").exists()
            return done.is_dir() and any(done.iterdir())

        while not reached() and run.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)
        assert run.poll() is None, "the run ended before it could be stopped"
        run.send_signal(signum)
        _, err = run.communicate(timeout=120)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == code, err
    assert err == f"error: {what}; the run's files were removed and the output is not complete\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["temp"]
    assert not any(p.name.startswith("beam-pipeline-temp") for p in temp.iterdir()), list(temp.iterdir())


def test_the_progress_line_ends_with_a_newline(tmp_path):
    """On a log (not a terminal), whole lines only; on a terminal, the line redrawn in place and ended once."""
    from pipelines.reassemble import ChunkProgress

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    for stream in (io.StringIO(), Terminal()):
        with ChunkProgress(str(tmp_path / "done"), 3, stream, every=0.01, log_every=0.01):
            time.sleep(0.1)
        text = stream.getvalue()
        assert text.endswith("reassembled 0/3 chunks · 0 s\n"), repr(text)
        assert ("\r" in text) == stream.isatty()
    stream = Terminal()
    with pytest.raises(RuntimeError), ChunkProgress(str(tmp_path / "done"), 3, stream, every=0.01):
        time.sleep(0.05)
        raise RuntimeError("the run failed")
    assert stream.getvalue().endswith("\n")  # what the failure prints next starts a line of its own


def test_a_build_overwrites_its_output_after_a_refused_to_inside_it(small_archive, tmp_path, capsys):
    """A --to inside the output used to be written there, and a rebuild with --overwrite then refused the output
    (a file it had not written): refused, nothing is written there, and the rebuild goes ahead."""
    config = {
        "input": {"paths": str(small_archive / "*.nc")},
        "variables": ["t"],
        "sample": {"window": {"lat": 10, "lon": 12}, "keep": ["level"]},
        "output": {"path": str(tmp_path / "o")},
    }
    output = build_quietly(config, tmp_path)
    code, err = reassemble_cli(str(output), "--to", str(output / "back.nc"), capsys=capsys)
    assert code == 2 and "is inside the output" in err
    from pipelines.build import main

    assert main(["--config", str(tmp_path / "config.yaml"), "--quiet", "--overwrite"]) == 0
