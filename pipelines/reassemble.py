"""Command line: predictions (or a split's own records) back on the source grid (``python -m pipelines.reassemble``).

    python -m pipelines.reassemble OUTPUT --split valid --to pred.zarr [--predictions DIR]

A Beam pipeline (transforms.reassemble): each output chunk is assembled by one task from the samples
that reach it and written once, as its region of a Zarr store; a .nc destination is that store
copied into one NetCDF file at the end (locally). Flags it does not know go to Beam (``--runner``).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import io
import logging
import math
import os
import posixpath
import signal
import sys
import threading
import time

from pipelines.cli import configure_logging, report_failure, started_up
from schemas.errors import UserError

logger = logging.getLogger(__name__)

#: A chunk's sums and weights (float64) held by one task: the memory a worker needs, about.
DEFAULT_CHUNK_MB = 256


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m pipelines.reassemble",
        description=(
            "Put samples back on the output's source grid: a model's predictions (--predictions), or the "
            "split's own records. Overlaps are blended; coverage counts the samples per cell. "
            "Unknown flags go to Beam (e.g. --runner)."
        ),
    )
    parser.add_argument("output", help="the xarray-tfrecords output the samples were cut by (its schema.json)")
    parser.add_argument("--to", required=True, help="where to write: PATH.zarr (any fsspec URL) or PATH.nc (local)")
    parser.add_argument("--split", help="the split the samples belong to (default: train, else the first)")
    parser.add_argument(
        "--predictions", metavar="DIR", help="TFRecords of tf.Example or .npz batches, with the index/<dim> features"
    )
    parser.add_argument("--blend", default="mean", choices=("mean", "cosine", "gaussian"), help="overlap weights")
    parser.add_argument(
        "--layout",
        default="grid",
        choices=("grid", "forecast"),
        help="forecast: pairs, sequences and sample.roles as init_time x lead_time (WeatherBench-X's layout)",
    )
    parser.add_argument("--chunk_mb", type=float, default=DEFAULT_CHUNK_MB, help="memory per output chunk (MB)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --to")
    parser.add_argument("--quiet", action="store_true", help="no progress line")
    parser.add_argument("--verbose", action="store_true", help="log details; show tracebacks on errors")
    return parser


#: Folders of the system's own (devices, processes, the kernel's): nothing is written there...
SYSTEM_FOLDERS = ("/dev", "/proc", "/sys")
#: ... but in these, folders of files that happen to live among them (shared memory).
FILE_FOLDERS = ("/dev/shm",)


def _check_place(to: str, output: str) -> None:
    """UserError for a --to inside the output (which a rebuild with --overwrite would then refuse to clear: a file
    it did not write), in one of the system's folders, or in place of something that is no file or folder."""
    from schemas.urls import is_remote, special_kind

    def inside(path: str, folder: str) -> bool:
        return path == folder or path.startswith(folder.rstrip("/") + "/")

    if is_remote(to) or is_remote(output):
        if is_remote(to) and is_remote(output) and inside(to.rstrip("/"), output.rstrip("/")):
            raise UserError(f"--to: {to} is inside the output {output}; write it beside the output, not in it")
        return
    path = os.path.realpath(to.removeprefix("file://"))
    if inside(path, os.path.realpath(output.removeprefix("file://"))):
        raise UserError(f"--to: {to} is inside the output {output}; write it beside the output, not in it")
    system = next((f for f in SYSTEM_FOLDERS if inside(path, f)), None)
    if system is not None and not any(inside(path, f) and path != f for f in FILE_FOLDERS):
        raise UserError(f"--to: {to} is in {system}, the system's folder, not a folder of files; write it elsewhere")
    with contextlib.suppress(OSError):
        kind = special_kind(os.stat(path).st_mode)
        if kind is not None:
            raise UserError(f"--to: {to} is {kind}, not a file or folder; choose another --to")


def _destination(to: str, overwrite: bool, output: str = "") -> str:
    """The kind of --to ("zarr" or "nc"), after refusing one that exists (or removing it, with --overwrite)."""
    import fsspec

    from schemas.urls import is_remote

    kind = "zarr" if to.rstrip("/").endswith(".zarr") else "nc" if to.endswith(".nc") else None
    if kind is None:
        raise UserError(f"--to: {to} is neither a .zarr store nor a .nc file; name it PATH.zarr or PATH.nc")
    if kind == "nc" and is_remote(to):
        raise UserError(f"--to: {to}: NetCDF is written locally only; write PATH.zarr to remote storage")
    _check_place(to, output)
    fs, path = fsspec.core.url_to_fs(to)
    if fs.exists(path):
        if not overwrite:
            raise UserError(f"--to: {to} exists; remove it, or pass --overwrite to replace it")
        if not _reassembled(to, kind):
            raise UserError(
                f"--to: {to} exists and no reassembly wrote it (it has no {REASSEMBLED_FROM!r} attribute): "
                "--overwrite replaces only a reassembly's output; move it away, or choose another --to"
            )
        fs.rm(path, recursive=kind == "zarr")
    return kind


#: The global attribute a reassembly's output carries (the output it came from): only such a --to is replaced. It is
#: written last, once every chunk is: a store without it is not a whole reassembly.
REASSEMBLED_FROM = "xarray_tfrecords_reassembled_from"
#: The global attribute a store carries while a reassembly writes it (then replaced by REASSEMBLED_FROM): a remote
#: store written in place and left by a killed run says so, and --overwrite replaces it.
REASSEMBLY_UNFINISHED = "xarray_tfrecords_reassembly_unfinished"


def _reassembled(to: str, kind: str) -> bool:
    """Whether ``to`` is a NetCDF file or Zarr store a reassembly wrote: anything else there (a user's data, the
    output's own inputs) is never removed."""
    import xarray as xr

    try:
        with xr.open_dataset(to, engine="zarr" if kind == "zarr" else None, decode_cf=False) as dataset:
            return any(isinstance(dataset.attrs.get(k), str) for k in (REASSEMBLED_FROM, REASSEMBLY_UNFINISHED))
    except Exception:  # unreadable as what its name says: not one this tool wrote
        return False


#: The file that says a folder is a reassembly's working folder: only such a folder is ever removed.
WORK_MARKER = ".xarray-tfrecords-reassembly"


def _claim_work_folder(fs, path: str, url: str) -> None:
    """Make the run's working folder beside --to; one there already is removed only if a reassembly made it (a
    killed run's), else refused: the run removes its folder at the end, and must not remove a user's."""
    if fs.exists(path):
        if not fs.exists(posixpath.join(path, WORK_MARKER)):
            raise UserError(
                f"--to: {url} exists and no reassembly made it (a run works in that folder and removes it at "
                "the end); move it away, or choose another --to"
            )
        fs.rm(path, recursive=True)
    fs.makedirs(path, exist_ok=True)
    fs.pipe_file(posixpath.join(path, WORK_MARKER), b"")


def make_plan(args, store: str, work: str):
    """The plan workers run (transforms.reassemble.ReassemblePlan), and the sample files they read."""
    from schemas.metadata import load_schema
    from schemas.prediction_files import list_predictions
    from schemas.schema import default_split
    from schemas.urls import is_remote
    from transforms.reassemble import ReassemblePlan, chunk_length

    output = args.output.rstrip("/") or "/"
    schema = load_schema(output)
    split = args.split or default_split(list(schema.splits))
    schema.check_has_samples(split, output)  # (a split with no data yet has no steps to put samples on)
    plan = ReassemblePlan(output, schema, split, args.blend, args.layout, {}, "", 1, 1, store, work, True)
    probe = plan.assembly((0, 0))  # checks the split and the layout; holds no cells
    if not probe.checked:
        raise UserError(f"{output}: its samples have no dim to reassemble along; nothing to do")
    axis = probe.checked[0]
    # Values per cell of the placed dims: each variable's kept dims and channels (its feature less its window).
    placed = {a.key or a.dim: a for a in probe.checked}
    per_cell = sum(
        f.size // math.prod(n for n, d in zip(f.shape, f.dims) if d in placed) for f in schema.variable_features
    )
    per_step = max(1, per_cell) * math.prod(a.length for a in probe.checked[1:])
    length = min(axis.length, chunk_length(per_step, args.chunk_mb * 1e6))
    chunks = max(1, -(-axis.length // length))
    records = [shard.file for shard in schema.splits[split]]
    files = list_predictions(args.predictions) if args.predictions else records
    records = not args.predictions
    # A local output's own records are read where they are (buckets hold references); a remote one's would
    # be a request per record and variable, a compressed one's cannot be read at an offset: those are copied.
    references = records and not schema.compression and not is_remote(output)
    plan = ReassemblePlan(
        output,
        schema,
        split,
        args.blend,
        args.layout,
        {},
        axis.dim,
        length,
        chunks,
        store,
        work,
        records,
        references,
        files=() if records else tuple(files),
    )
    return plan, files


def write_template(plan, files: list[str]) -> None:
    """The store's metadata and coordinates, every variable chunked as the tasks will write it (no data yet).

    xarray writes the coordinates, and the variables with one step along the chunked dim (all fill, so
    no chunk) into memory; their arrays are resized there to the grid's length and their metadata copied
    over: the store xarray would write for the whole template, without making its data (nor Dask's)."""
    import numpy as np
    import xarray as xr
    import zarr

    from schemas.reassembly import COVERAGE, finished
    from transforms.reassemble import chunks_of, iter_file

    first, source = next(((batch, name) for name in files for batch in iter_file(plan, name)), (None, None))
    if first is None:
        raise UserError(f"{plan.output}: split {plan.split!r} holds no sample to reassemble")
    where = None if plan.records else source  # (errors about a prediction name its file)
    one = {name: values[:1] for name, values in first.items()}
    probe = plan.assembly((0, 0), where)
    probe.check_key({k: v[0] for k, v in one.items() if k.startswith("index/")})
    # The sample's dataset gives each variable's dims, dtype and attributes: on one cell of the chunked dim the
    # sample covers (not a whole chunk of cells), unless an integer variable comes back whole there, which on
    # its chunk it might not (then it is float64: docs/guides/reassembly.md, "dtypes").
    axis = probe.checked_axis(plan.chunk_dim)
    cell = int(one[axis.index_name].reshape(-1)[0]) + axis.origin - axis.first + int(axis.local_cells().min())
    sample = plan.assembly((cell, cell + 1), where).add_all([one]).dataset()
    if any(v.dtype.kind in "iub" for name, v in sample.data_vars.items() if name != COVERAGE):
        chunk = int(chunks_of(plan, probe, one)[0][0])
        sample = plan.assembly(plan.bounds(chunk), where).add_all([one]).dataset()
    whole = plan.assembly((0, 0))
    coords = whole.coordinates(whole=True)
    data, encoding, shapes = {}, {}, {}
    for name, variable in sample.data_vars.items():
        shapes[name] = [len(coords[d]) if d == plan.chunk_dim else variable.sizes[d] for d in variable.dims]
        step = [1 if d == plan.chunk_dim else n for d, n in zip(variable.dims, shapes[name])]
        nothing = np.broadcast_to(np.array(np.nan if variable.dtype.kind == "f" else 0, variable.dtype), step)
        data[name] = xr.Variable(variable.dims, nothing, variable.attrs)
        sizes = [plan.chunk_length if d == plan.chunk_dim else n for d, n in zip(variable.dims, shapes[name])]
        encoding[name] = {"chunks": sizes}
        if variable.dtype.kind in "iu":  # no fill value: integers (coverage) read back as integers
            encoding[name]["_FillValue"] = None
    template = finished(xr.Dataset({}, coords, {**sample.attrs, REASSEMBLY_UNFINISHED: plan.output}))
    template.to_zarr(plan.store, mode="w", zarr_format=2, consolidated=False)
    memory = zarr.storage.MemoryStore()
    step = template.isel({plan.chunk_dim: slice(0, 1)}).assign(data)
    step.to_zarr(memory, mode="w", encoding=encoding, zarr_format=2)
    group = zarr.open_group(memory, mode="r+", zarr_format=2)
    for name, shape in shapes.items():
        group[name].resize(shape)  # (metadata only: the one step held no chunk)
    store = zarr.open_group(plan.store, mode="r+", zarr_format=2).store
    keys = [".zattrs", *[f"{name}/{meta}" for name in data for meta in (".zarray", ".zattrs")]]
    zarr.core.sync.sync(_copy_keys(memory, store, keys))
    zarr.consolidate_metadata(store, zarr_format=2)


def mark_complete(store: str, output: str) -> None:
    """The store's marker of a whole reassembly, written once every chunk is: the unfinished mark replaced."""
    import zarr

    group = zarr.open_group(store, mode="r+", zarr_format=2)
    attrs = dict(group.attrs)
    attrs.pop(REASSEMBLY_UNFINISHED, None)
    attrs[REASSEMBLED_FROM] = output
    group.attrs.put(attrs)
    zarr.consolidate_metadata(group.store, zarr_format=2)


async def _copy_keys(source, target, keys: list[str]) -> None:
    from zarr.core.buffer import default_buffer_prototype

    for key in keys:
        await target.set(key, await source.get(key, prototype=default_buffer_prototype()))


class ChunkProgress:
    """'reassembled k/N chunks' on stderr while the pipeline runs, from the tasks' done markers: redrawn in place on
    a terminal (a newline ends it), a line every ``log_every`` seconds elsewhere (a log keeps whole lines)."""

    def __init__(self, folder: str, total: int, stream, every: float = 0.5, log_every: float = 15.0):
        self.folder, self.total, self.stream = folder, total, stream
        self._tty = bool(getattr(stream, "isatty", lambda: False)())
        self.every = every if self._tty else log_every
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._open = False  # a line drawn without its newline yet
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._started = time.monotonic()

    def line(self) -> str:
        import fsspec

        try:
            fs, path = fsspec.core.url_to_fs(self.folder)
            done = len(fs.ls(path, detail=False)) if fs.exists(path) else 0
        except OSError:  # (the folder removed meanwhile, by a failed run's clean-up)
            done = 0
        return f"reassembled {done}/{self.total} chunks · {time.monotonic() - self._started:,.0f} s"

    def _show(self, text: str, last: bool = False) -> None:
        with self._lock:
            if self._stop.is_set() and not last:
                return
            with contextlib.suppress(OSError, ValueError):
                if self._tty:
                    self.stream.write("\r" + text + ("\n" if last else ""))
                    self._open = not last
                else:
                    self.stream.write(text + "\n")
                self.stream.flush()

    def end_line(self) -> None:
        """No more redraws; a line left open gets its newline (what is printed next starts a line of its own)."""
        with self._lock:
            self._stop.set()
            if self._open:
                with contextlib.suppress(OSError, ValueError):
                    self.stream.write("\n")
                    self.stream.flush()
                self._open = False

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self._show(self.line())

    def __enter__(self):
        _LineEnd.progress = self
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        _LineEnd.progress = None
        if exc == (None, None, None):
            self._show(self.line(), last=True)
        else:
            self.end_line()


class _LineEnd:
    """stderr for the stop's line: a progress line drawn in place is ended first, so the line starts one of its own."""

    progress: ChunkProgress | None = None

    def __init__(self, stream):
        self.stream = stream

    def write(self, text: str) -> int:
        progress = _LineEnd.progress
        if progress is not None:
            progress.end_line()
        return self.stream.write(text)

    def flush(self) -> None:
        self.stream.flush()


def run(args, beam_args: list[str], progress) -> tuple[str, int]:
    """Reassemble as the arguments say; returns where it wrote and the chunks written."""
    import apache_beam as beam
    import fsspec

    from pipelines.runners import RunOptions, new_pipeline, with_runner_defaults
    from pipelines.stopping import RunCleanup, clean_up_on_stop
    from planning.run.cancellation import allow_writes, check_stopped
    from schemas.reassembly import import_xarray
    from schemas.urls import is_remote
    from transforms import compat
    from transforms.reassemble import DONE_DIR, Reassemble, map_large_arrays

    xr = import_xarray()
    started_up()
    compat.install()  # (a local run's workers are threads of this process: they run with its patches)
    map_large_arrays()
    allow_writes()  # an earlier run in this process may have failed and refused its threads' writes
    check_stopped()  # stopped while Beam was being imported
    kind = _destination(args.to, args.overwrite, args.output)
    to = args.to.rstrip("/")
    work = f"{to}.parts"
    # Written in the working folder and moved into place whole when local (a .nc is converted from it there);
    # remote storage moves no folder, so a remote store is written in place and marked whole last (mark_complete).
    in_place = kind == "zarr" and is_remote(to)
    store = to if in_place else posixpath.join(work, "data.zarr")
    fs, work_path = fsspec.core.url_to_fs(work)
    _claim_work_folder(fs, work_path, work)
    # Removed once, by this thread unwinding or by a stop it does not answer in time (pipelines.stopping).
    cleanup = RunCleanup(functools.partial(_remove_run_files, store if in_place else None, work))
    clean_up_on_stop(cleanup)
    try:
        check_stopped()
        plan, files = make_plan(args, store, work)
        write_template(plan, files)
        options = RunOptions(with_runner_defaults(beam_args))
        pipeline = new_pipeline(options)
        _ = pipeline | "Files" >> beam.Create(files) | "Reassemble" >> Reassemble(plan)
        marker = posixpath.join(work, DONE_DIR)
        check_stopped()
        with ChunkProgress(marker, plan.num_chunks, progress) if progress else contextlib.nullcontext():
            pipeline.run().wait_until_finish()
        check_stopped()
        mark_complete(store, plan.output)
        if kind == "nc":
            import dask

            partial = posixpath.join(work_path, "data.nc")  # (local: a .nc is written locally only)
            with dask.config.set(scheduler="synchronous"), xr.open_zarr(store) as dataset:
                dataset.to_netcdf(partial)  # chunk by chunk: memory of one chunk
            check_stopped()
            os.replace(partial, to)  # whole or not at all
        elif not in_place:
            check_stopped()
            os.rename(fsspec.core.url_to_fs(store)[1], fsspec.core.url_to_fs(to)[1])  # whole or not at all
    except BaseException:
        cleanup()
        raise
    finally:
        clean_up_on_stop(None)
    if fs.exists(work_path):
        fs.rm(work_path, recursive=True)
    return to, plan.num_chunks


def _remove_run_files(store: str | None, work: str) -> bool:
    """A stopped or failed run's files: the store it wrote in place (``store``; else it is in the working folder)
    and its working folder. Worker threads may still be writing (the local runner's): they are stopped first, or
    they would write again into what is being removed, or make its removal fail and hide the error."""
    import fsspec

    from planning.run.cancellation import cancel_writes

    if not cancel_writes():
        logger.warning("writes still running after the wait; what they leave, --overwrite removes")
    for url in (store, work):
        if url is None:
            continue
        fs, path = fsspec.core.url_to_fs(url)
        try:
            if fs.exists(path):
                fs.rm(path, recursive=True)
        except OSError as error:  # (the error that failed the run is the one to report)
            logger.warning("could not remove %s: %s", url, error)
    return True


def main(argv: list[str] | None = None) -> int:
    """``python -m pipelines.reassemble``: put predictions (or the split's records) back on the source grid.

    Args:
        argv: the command line without the program name (default: ``sys.argv[1:]``); flags it does not know go
            to Beam's PipelineOptions.

    Returns:
        The exit status: 0 written, 1 failed, 2 bad input (one line naming the prediction file or the key),
        130 or 143 stopped (nothing half-written left under ``--to``).
    """
    from pipelines.cli import EXIT_INTERRUPTED
    from pipelines.stopping import EXIT_CODES, StopOnSignal, stopped_line
    from planning.run.cancellation import reset as reset_cancellation

    parser = make_parser()
    args, beam_args = parser.parse_known_args(argv)
    configure_logging(args.verbose)
    started = time.monotonic()
    reset_cancellation()  # a run before this one in the process may have been stopped or have failed
    # SIGTERM (timeout, batch schedulers) stops a run as Ctrl-C does: its files removed, one line printed.
    stopping = [signal.SIGTERM] + ([signal.SIGINT] if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN else [])
    stop = StopOnSignal(stopping, _LineEnd(sys.stderr)).start()  # in the main thread only: elsewhere, no signal comes
    worker_output = io.StringIO()
    try:
        progress = None if args.quiet else sys.stderr
        with contextlib.redirect_stderr(sys.stderr if args.verbose else worker_output):
            to, chunks = run(args, beam_args, progress)
    except BaseException as error:
        if stop.requested is not None:
            # Whatever the stop made fail on its way out (a cancelled write, a killed worker) is its doing.
            stop.end()
            print(stopped_line(stop.requested), file=sys.stderr)
            return EXIT_CODES[stop.requested]
        if isinstance(error, KeyboardInterrupt):  # not through our handler: a program that calls main()
            print(stopped_line(signal.SIGINT), file=sys.stderr)
            return EXIT_INTERRUPTED
        if not isinstance(error, Exception):
            raise
        return report_failure(error, args.verbose, subject=args.output, output=args.to, flag="--to")
    finally:
        stop.close()
    print(f"Reassembled {args.output} into {to} ({chunks} chunk(s)) in {time.monotonic() - started:,.1f} s.")
    return 0


if __name__ == "__main__":
    gc.disable()  # until start-up's imports are done (pipelines.cli.started_up)
    code = main()
    gc.freeze()  # as the build does: the interpreter's last collections would walk Beam's whole object graph first
    sys.exit(code)
