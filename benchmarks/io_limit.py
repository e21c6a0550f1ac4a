"""The I/O limit: read the inputs (from the page cache), write the same bytes into the shards' files, sync them.

No decoding, cutting or encoding: what a build of these inputs costs at the least on this machine's disk
in its state now, as a competitor row beside the floor and the pipeline (benchmarks.run, ``io-limit``).
One process, one thread, the files read in order and written in 8 MB pieces.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

PIECE = 8 * 2**20


def input_files(directory: Path) -> list[Path]:
    """The archive's files, as benchmarks.datasets lists them (not imported: it loads xarray, and this row's
    wall is to be I/O alone)."""
    return sorted(directory.glob("*.nc"))


def _write_all(descriptor: int, data: memoryview) -> None:
    while data:
        data = data[os.write(descriptor, data) :]


def copy_and_sync(inputs: list[Path], output: Path, shards: int) -> dict:
    """Read ``inputs`` and write their bytes over ``shards`` files under ``output`` in turn, then sync each."""
    output.mkdir(parents=True, exist_ok=True)
    seconds = {"read": 0.0, "write": 0.0, "sync": 0.0}
    files = [os.open(output / f"data-{i:05d}.bin", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644) for i in range(shards)]
    nbytes = 0
    buffer = bytearray(PIECE)
    try:
        for number, path in enumerate(inputs):
            target = files[number % shards]
            with open(path, "rb", buffering=0) as stream:
                while True:
                    started = time.perf_counter()
                    got = stream.readinto(buffer)
                    read = time.perf_counter()
                    if not got:
                        seconds["read"] += read - started
                        break
                    _write_all(target, memoryview(buffer)[:got])
                    seconds["read"] += read - started
                    seconds["write"] += time.perf_counter() - read
                    nbytes += got
        started = time.perf_counter()
        for descriptor in files:
            os.fsync(descriptor)
        seconds["sync"] = time.perf_counter() - started
    finally:
        for descriptor in files:
            os.close(descriptor)
    return {"bytes": nbytes, "seconds": seconds}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inputs", required=True, help="the archive's directory (its *.nc files)")
    parser.add_argument("--output", required=True, help="a directory to write into (replaced)")
    parser.add_argument("--shards", type=int, default=1, help="files to spread the bytes over")
    parser.add_argument("--result", required=True, help="where to write the result JSON")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    result = copy_and_sync(input_files(Path(args.inputs)), Path(args.output), max(1, args.shards))
    result["wall"] = time.perf_counter() - started
    Path(args.result).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
