"""--append against a full rebuild (``python -m benchmarks.append``): time, bytes written, and the same samples.

Generation 0 is built from the first ``files - added`` files of the patches archive, then the
last ``added`` are appended (timed, its bytes written counted), then the same command runs on
the output with nothing to append (the fixed start-up and planning every run pays), then a full
build of every file (timed). The append's union of generations must equal the full build
sample for sample, its statistics within 1e-12, and the old shards must hash as before.

Targets (issue 24): bytes written by the append <= 1.05x its new shards' bytes plus the metadata
files; (append - nothing) <= 2x (added / files) x (full - nothing).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.datasets import ensure_archive, input_files, patches, write_config
from benchmarks.measure import run_captured
from benchmarks.outputs import REPO

METADATA = ("schema.json", "stats.json", "parser.py", "generations.json", "_manifest.json", "_inventory.json")
#: The child's last stdout line starts with this, then its counters as JSON.
_MARK = "APPEND-BENCH "


def _child(argv: list[str]) -> int:
    """Run one build in this process and report what it wrote: /proc/self/io's wchar (every write() call)."""
    from pipelines.build import main

    code = main(argv)
    counters = dict(line.split(": ") for line in Path("/proc/self/io").read_text().splitlines())
    print(_MARK + json.dumps({"code": code, "wchar": int(counters["wchar"])}), flush=True)
    return 0


def _run(argv: list[str]) -> dict:
    started = time.monotonic()
    done = run_captured([sys.executable, "-m", "benchmarks.append", "--child", *argv], cwd=REPO)
    seconds = time.monotonic() - started
    lines = [line for line in done.stdout.splitlines() if line.startswith(_MARK)]
    if done.returncode or not lines or json.loads(lines[-1][len(_MARK) :])["code"]:
        raise RuntimeError(f"{' '.join(argv)} failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return {**json.loads(lines[-1][len(_MARK) :]), "seconds": seconds, "stdout": done.stdout}


def _hashes(output: Path, names) -> dict[str, str]:
    return {name: hashlib.sha256((output / name).read_bytes()).hexdigest() for name in names}


def _samples(output: Path, split: str) -> dict[str, np.ndarray]:
    """A split's samples ordered by their index/* features (one sample per index tuple)."""
    from schemas.reader import Reader

    columns = Reader(str(output), split).read_all()
    keys = sorted(name for name in columns if name.startswith("index/"))
    order = np.lexsort([columns[k] for k in reversed(keys)])
    return {name: values[order] for name, values in columns.items()}


def _close(got, want) -> bool:
    if isinstance(want, dict):
        return got.keys() == want.keys() and all(_close(got[k], want[k]) for k in want)
    if isinstance(want, list):
        return len(got) == len(want) and all(_close(a, b) for a, b in zip(got, want))
    if isinstance(want, float) and isinstance(got, float):
        return abs(got - want) <= 1e-12 * max(abs(got), abs(want))
    return got == want


def union_equals_rebuild(appended: Path, full: Path) -> dict[str, bool]:
    """Whether the generations hold the full build's samples (all features) and its statistics (1e-12)."""
    from schemas.metadata import load_schema

    splits = list(load_schema(str(full)).splits)
    same = list(load_schema(str(appended)).splits) == splits
    for split in splits if same else ():
        a, b = _samples(appended, split), _samples(full, split)
        same = same and a.keys() == b.keys() and all(np.array_equal(a[k], b[k], equal_nan=True) for k in b)
    stats = [json.loads((path / "stats.json").read_text()) for path in (appended, full)]
    for document in stats:
        document.pop("generations", None)
    return {"samples": same, "stats": _close(*stats)}


def _undo_append(output: Path, metadata: dict[str, bytes], old: list[str]) -> None:
    """Back to generation 0 to time the append again: its metadata files back, every other shard removed."""
    for path in output.iterdir():
        if path.is_file() and path.name not in metadata and path.name not in old:
            path.unlink()
    for name, data in metadata.items():
        (output / name).write_bytes(data)


def run(workdir: Path, files: int, added: int, quick: bool, repeat: int = 1) -> dict:
    spec = patches(1, quick=quick, num_files=files)
    archive = ensure_archive(workdir, spec)
    paths = [str(p) for p in input_files(archive)]
    appended, full = workdir / "out" / "appended", workdir / "out" / "full"
    config = str(write_config(workdir, spec, archive, appended))
    full_config = str(write_config(workdir, spec, archive, full))
    _run(["--config", config, "--input", *paths[: files - added], "--overwrite", "--quiet"])
    from schemas.metadata import load_schema

    old = [n for shards in load_schema(str(appended)).splits.values() for s in shards for n in (s.file, s.index) if n]
    before = _hashes(appended, old)
    generation0 = {name: (appended / name).read_bytes() for name in METADATA if (appended / name).exists()}
    appends, nothings = [], []
    for attempt in range(repeat):  # the fastest of each (a shared machine only ever adds time)
        if attempt:
            _undo_append(appended, generation0, old)
        appends.append(_run(["--config", config, "--append", "--quiet"]))
        nothings.append(_run(["--config", config, "--append", "--quiet"]))
    append, nothing = (min(runs, key=lambda r: r["seconds"]) for runs in (appends, nothings))
    rebuild = _run(["--config", full_config, "--overwrite", "--quiet"])
    schema = load_schema(str(appended))
    new = [s for shards in schema.splits.values() for s in shards if s.generation == schema.sources["generations"] - 1]
    new_bytes = sum(s.bytes + ((appended / s.index).stat().st_size if s.index else 0) for s in new)
    metadata_bytes = sum((appended / name).stat().st_size for name in METADATA if (appended / name).exists())
    fixed = nothing["seconds"]
    share = added / files * (rebuild["seconds"] - fixed)
    checks = union_equals_rebuild(appended, full)
    return {
        "files": files,
        "added": added,
        "repeat": repeat,
        "append_seconds_all": [r["seconds"] for r in appends],
        "nothing_seconds_all": [r["seconds"] for r in nothings],
        "append_seconds": append["seconds"],
        "nothing_seconds": fixed,
        "rebuild_seconds": rebuild["seconds"],
        "append_written_bytes": append["wchar"],
        "new_shard_bytes": new_bytes,
        "metadata_bytes": metadata_bytes,
        "rebuild_written_bytes": rebuild["wchar"],
        "bytes_ratio": append["wchar"] / (new_bytes + metadata_bytes),
        "time_ratio": (append["seconds"] - fixed) / share if share > 0 else float("inf"),
        "nothing_said": "nothing to append" in nothing["stdout"],
        "old_shards_unchanged": _hashes(appended, old) == before,
        **{f"union_equals_rebuild_{k}": v for k, v in checks.items()},
    }


def report(result: dict) -> list[str]:
    ok = all(result[k] for k in result if k.startswith("union_equals") or k in ("old_shards_unchanged", "nothing_said"))
    return [
        f"append {result['added']} files to {result['files'] - result['added']}: {result['append_seconds']:.1f} s, "
        f"{result['append_written_bytes'] / 1e6:,.1f} MB written for {result['new_shard_bytes'] / 1e6:,.1f} MB of new "
        f"shards and {result['metadata_bytes'] / 1e6:,.2f} MB of metadata "
        f"({result['bytes_ratio']:.3f}x; target <= 1.05x)",
        f"(fastest of {result['repeat']}) nothing to append: {result['nothing_seconds']:.1f} s; "
        f"full rebuild of {result['files']}: "
        f"{result['rebuild_seconds']:.1f} s, {result['rebuild_written_bytes'] / 1e6:,.1f} MB written",
        f"append less fixed, against {result['added']}/{result['files']} of the rebuild less fixed: "
        f"{result['time_ratio']:.2f}x (target <= 2x)",
        f"union equals the rebuild, stats within 1e-12, old shards unchanged, 'nothing to append' said: {ok}",
    ]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        return _child(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m benchmarks.append", description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=192, help="files of the patches archive after the append")
    parser.add_argument("--added", type=int, default=8, help="files the append adds")
    parser.add_argument("--quick", action="store_true", help="tiny files (a smoke test; no ratio means anything)")
    parser.add_argument("--repeat", type=int, default=3, help="time the append and the empty append this often")
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "xtf-bench")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args(argv)
    if not 0 < args.added < args.files:
        parser.error("--added must be between 1 and --files - 1")
    result = run(args.workdir, args.files, args.added, args.quick, max(1, args.repeat))
    for line in report(result):
        print(line)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
