"""Reassembly against the build (``python -m benchmarks.reassemble``): time ratio, and peak RSS per output chunk.

For each scale of the benchmark's patches set (benchmarks.datasets, 1x = 48 files, 18,816 samples):
build the output, then reassemble its records into Zarr with ``python -m pipelines.reassemble``,
each in its own process. Prints reassembly time / build time (target <= 1.5) and the reassembly's
peak RSS less the interpreter's (Python with Beam, xarray and the reassembly imported) against one
output chunk's bytes (target <= 2).
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import tempfile
from pathlib import Path

from benchmarks.datasets import ensure_archive, patches, write_config
from benchmarks.measure import run_measured

REPO = Path(__file__).resolve().parents[1]
TIME_TARGET = 1.5
MEMORY_TARGET = 2.0
#: The interpreter a reassembly runs in: what it imports before it holds any sample.
_INTERPRETER = "import apache_beam, xarray, zarr, schemas.reassembly, transforms.reassemble, pipelines.reassemble"


def output_chunk_bytes(output: Path, chunk_mb: float) -> int:
    """Bytes of one output chunk as written (float32 over every variable), as the command line sizes it."""
    from pipelines.reassemble import make_parser
    from pipelines.reassemble import make_plan as plan_of

    args = make_parser().parse_args([str(output), "--to", "unused.zarr", "--chunk_mb", str(chunk_mb)])
    plan, _ = plan_of(args, "unused.zarr", "unused.parts")
    probe = plan.assembly((0, 0))
    placed = {a.key or a.dim for a in probe.checked}
    per_cell = sum(
        f.size // math.prod(n for n, d in zip(f.shape, f.dims) if d in placed) for f in plan.schema.variable_features
    )
    return 4 * per_cell * plan.chunk_length * math.prod(a.length for a in probe.checked[1:])


def measure(workdir: Path, scale: int, quick: bool, chunk_mb: float) -> dict:
    spec = patches(scale, quick)
    archive = ensure_archive(workdir, spec)
    output = workdir / "out" / f"{spec.name}-reassemble"
    config = write_config(workdir, spec, archive, output)
    python = sys.executable
    build = run_measured(
        [python, "-m", "pipelines.build", "--config", str(config), "--overwrite", "--quiet"], str(REPO)
    )
    if not build.ok:
        raise SystemExit(f"build failed (exit {build.returncode}): {build.output_tail}")
    to = workdir / "out" / f"{spec.name}-reassembled.zarr"
    shutil.rmtree(to, ignore_errors=True)  # the benchmark's own, maybe from a release whose stores carry no mark
    command = [python, "-m", "pipelines.reassemble", str(output), "--to", str(to), "--quiet"]
    reassembly = run_measured([*command, "--chunk_mb", str(chunk_mb)], str(REPO))
    if not reassembly.ok:
        raise SystemExit(f"reassembly failed (exit {reassembly.returncode}): {reassembly.output_tail}")
    interpreter = run_measured([python, "-c", _INTERPRETER], str(REPO))
    chunk = output_chunk_bytes(output, chunk_mb)
    return {
        "set": spec.name,
        "samples": spec.num_samples,
        "input_mb": spec.input_bytes / 1e6,
        "build_s": build.wall_seconds,
        "reassemble_s": reassembly.wall_seconds,
        "time_ratio": reassembly.wall_seconds / build.wall_seconds,
        "peak_rss_mb": reassembly.peak_rss_bytes / 1e6,
        "interpreter_mb": interpreter.peak_rss_bytes / 1e6,
        "chunk_mb": chunk / 1e6,
        "memory_ratio": (reassembly.peak_rss_bytes - interpreter.peak_rss_bytes) / chunk,
        "load": [build.load_before, reassembly.load_after],
    }


def rows(results: list[dict]) -> list[str]:
    lines = ["== reassembly (records -> Zarr) against the build =="]
    for r in results:
        lines.append(
            f"{r['set']:>24}: build {r['build_s']:6.1f} s, reassembly {r['reassemble_s']:6.1f} s "
            f"= {r['time_ratio']:.2f}x (target <= {TIME_TARGET}); peak RSS {r['peak_rss_mb']:,.0f} MB "
            f"= interpreter {r['interpreter_mb']:,.0f} MB + {r['memory_ratio']:.2f} x chunk of "
            f"{r['chunk_mb']:,.1f} MB (target <= {MEMORY_TARGET}); load {r['load'][0]:.1f}-{r['load'][1]:.1f}"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", default=str(Path(tempfile.gettempdir()) / "xtf-bench"))
    parser.add_argument("--quick", action="store_true", help="tiny data: a smoke test, not a measurement")
    parser.add_argument("--scales", type=int, nargs="+", default=[1], help="sizes of the patches set (1x, 4x)")
    parser.add_argument("--chunk_mb", type=float, default=256, help="the command line's --chunk_mb")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    results = []
    print(rows([])[0], flush=True)
    for scale in args.scales:  # each row as soon as it is measured
        results.append(measure(workdir, scale, args.quick, args.chunk_mb))
        print(rows(results[-1:])[1], flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
