"""Command line: describe, verify and plot a written output (``python -m pipelines.inspect OUTPUT``)."""

from __future__ import annotations

import argparse
import sys
import textwrap
import unicodedata
from typing import TYPE_CHECKING, Any

from pipelines.cli import EXIT_FAILED, EXIT_INTERRUPTED, configure_logging, dropped_line, report_failure
from schemas.errors import UserError

if TYPE_CHECKING:
    from schemas.schema import Feature, Schema

EXIT_VERIFY_FAILED = EXIT_FAILED
#: The reader of our output left (``inspect OUT | head``): what a tool killed by SIGPIPE exits with (128 + 13).
EXIT_CLOSED_PIPE = 141


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m pipelines.inspect",
        description=(
            "Describe an xarray-tfrecords output (features, splits, size, seed, config, statistics); "
            "with --verify read every shard and check it; with --plot draw a page of random samples."
        ),
    )
    parser.add_argument("output", metavar="OUTPUT", help="output directory: a local path or an fsspec URL (gs://...)")
    parser.add_argument(
        "--split",
        help="only this split (default: every split; --plot: train if there is one, else the first)",
    )
    parser.add_argument("--verify", action="store_true", help="read every shard: CRCs, record counts, feature shapes")
    parser.add_argument(
        "--source",
        type=int,
        metavar="N",
        help="with --verify: re-read N random samples from the output's inputs with xarray and compare every "
        "feature bit for bit (--seed picks them)",
    )
    parser.add_argument("--plot", metavar="PNG", help="write a page of random samples and histograms to this PNG")
    parser.add_argument("--map", action="store_true", help="add the samples' footprints on a lat/lon map to --plot")
    parser.add_argument("--samples", type=int, default=4, metavar="N", help="samples on the --plot page (default 4)")
    parser.add_argument(
        "--seed", type=int, default=0, help="which random samples --plot shows and --source re-reads (default 0)"
    )
    parser.add_argument("--verbose", action="store_true", help="show tracebacks on errors")
    args = parser.parse_args(argv)
    if args.map and not args.plot:
        parser.error("--map adds a map to the --plot page: add --plot out.png")
    if args.source is not None and not args.verify:
        parser.error("--source checks samples against the inputs as part of --verify: add --verify")
    if args.source is not None and args.source < 1:
        parser.error(f"--source must be at least 1, not {args.source}")
    if args.samples < 1:
        parser.error(f"--samples must be at least 1, not {args.samples}")
    return args


# ---------------------------------------------------------------------------------------------
# The summary


def printable(text: str) -> str:
    """``text`` with control and format characters escaped (\\x1b, \\n, \\u202e): names and attributes come from
    the input files, and a terminal would act on them (colours, a cleared screen, lines that are not there, text
    shown reversed)."""
    return "".join(
        ch.encode("unicode_escape").decode() if unicodedata.category(ch) in ("Cc", "Cf") else ch for ch in text
    )


def _megabytes(size: int) -> str:
    return f"{size / 1e6:,.1f} MB" if size >= 1e5 else f"{size / 1e3:,.1f} kB"


def _shape(shape: tuple[int, ...]) -> str:
    return "(" + ", ".join(map(str, shape)) + ("," if len(shape) == 1 else "") + ")"


def _describe_feature(feature: Feature) -> tuple[str, str]:
    """(units, description) of a feature, from its provenance."""
    source = feature.source
    if feature.role == "variable" and "channels" in source:
        units = {str(v.get("attrs", {}).get("units", "")) for v in source["variables"].values()}
        return (units.pop() if len(units) == 1 else "mixed"), "channels: " + ", ".join(source["channels"])
    if feature.role == "variable":
        attrs = source.get("attrs", {})
        text = attrs.get("long_name", "")
        stored, in_file = source.get("dtype"), source.get("file_dtype")
        if stored and stored != feature.dtype:
            packed = f", {in_file} in the file" if in_file and in_file != stored else ""
            text += f" (stored as {feature.dtype}; source {stored}{packed})"
        if "preprocess" in source:
            text += f" (derived by {source['preprocess']})"
        return str(attrs.get("units", "")), text.strip()
    if feature.role == "index":
        return "", f"start index along {source.get('dim', '?')}"
    if feature.role == "coord":
        calendar = f" ({source['calendar']} calendar)" if "calendar" in source else ""
        return str(source.get("units", "")), f"{source.get('dim', '?')} values the sample covers{calendar}"
    if feature.role == "mask":
        return "", f"1 where {source.get('of', '?')} was NaN and filled with {source.get('fill_value', '?')}"
    if feature.role == "aux_coord":
        attrs = source.get("attrs", {})
        static = ", from the first file" if source.get("static") else ""
        text = f"coordinate {source.get('coordinate', '?')} at the sample's points{static}"
        return str(attrs.get("units", "")), text
    return "", feature.role


def _table(rows: list[list[str]], indent: str = "  ", align: str = "") -> list[str]:
    """Rows as aligned columns; ``align`` gives '<' or '>' per column (default left)."""
    rows = [[printable(cell) for cell in row] for row in rows]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for row in rows:
        cells = [f"{cell:{align[i] if i < len(align) else '<'}{widths[i]}}" for i, cell in enumerate(row)]
        lines.append((indent + "  ".join(cells)).rstrip())
    return lines


def feature_lines(schema: Schema) -> list[str]:
    rows = [["name", "dtype", "shape", "dims", "units", "description"]]
    for feature in schema.features:
        units, text = _describe_feature(feature)
        rows.append([feature.name, feature.dtype, _shape(feature.shape), ", ".join(feature.dims) or "-", units, text])
    return [f"Features ({len(schema.features)}, per sample)", *_table(rows)]


def _count(shard) -> str:
    if shard.records == shard.examples:
        return f"{shard.examples:,} samples"
    return f"{shard.examples:,} samples in {shard.records:,} records"


def _awaiting(schema: Schema, split: str) -> str:
    """Why a split holds no sample, as schema.json says it (its range lies beyond the input's steps)."""
    described = (schema.sample or {}).get("splits", {}).get(split, {})
    reason = described.get("no_data_yet") if isinstance(described, dict) else None
    return f": no data yet ({reason}); an --append with its steps fills it" if reason else ""


def split_lines(schema: Schema, files: dict[str, int], only: str | None) -> list[str]:
    lines = ["Splits"]
    for name, shards in schema.splits.items():
        if only and name != only:
            continue
        if not shards:
            lines.append(f"  {name}: 0 samples{_awaiting(schema, name)}")
            continue
        examples = [s.examples for s in shards]
        size = sum(files.get(s.file, 0) for s in shards)
        spread = f", {min(examples):,} to {max(examples):,} per shard" if len(shards) > 1 else ""
        lines.append(f"  {name}: {sum(examples):,} samples in {len(shards)} shard(s){spread}, {_megabytes(size)}")
        rows = [[s.file, _count(s), _megabytes(files.get(s.file, 0))] for s in shards]
        if len(rows) > 8:  # a long shard list says little more than its first and last entries
            rows = [*rows[:3], ["...", "", ""], *rows[-2:]]
        lines.extend(_table(rows, indent="    ", align="<>>"))
    return lines


def _axis_text(axis: dict[str, Any], coords: list | None) -> str:
    role, dim = axis["role"], axis["dim"]
    if role == "window":
        return f"{dim}: window {axis['size']} stride {axis['stride']} ({axis['positions']} of {axis['length']})"
    if role == "keep":
        values = ", ".join(map(str, coords or []))
        return f"{dim}: kept whole ({axis['length']}){': ' + values if values else ''}"
    if role == "iterate":
        return f"{dim}: every index ({axis['length']})"
    return f"{dim}: {role} {axis.get('offsets', axis.get('steps', ''))}".rstrip()


def geometry_lines(schema: Schema) -> list[str]:
    sample = schema.sample
    lines = []
    if sample.get("axes"):
        grid = " x ".join(map(str, sample.get("grid_shape", [])))
        lines.append(f"Sample grid: {grid} = {sample.get('num_samples', 0):,} samples")
        lines.extend(f"  {_axis_text(axis, schema.coords.get(axis['dim']))}" for axis in sample["axes"])
    for dim, selected in sample.get("selection", {}).items():
        lines.append(f"  selected {dim}: {selected['length']} values, {selected['first']} to {selected['last']}")
    along_concat = "split_dim" not in sample  # splits along input.new_dim name members, not dates
    calendar = f" ({sample['calendar']} calendar)" if "calendar" in sample and along_concat else ""
    dim = "" if along_concat else f"{sample['split_dim']} "
    for name, split in sample.get("splits", {}).items():
        if split.get("first") is None:
            lines.append(f"  split {name}: no step of the input yet")
            continue
        lines.append(f"  split {name}: {dim}{split['first']} to {split['last']}{calendar}")
    new_dim = sample.get("new_dim")
    if new_dim:
        values = ", ".join(map(str, new_dim["values"][:8])) + (", ..." if len(new_dim["values"]) > 8 else "")
        lines.append(f"  {new_dim['name']} from the file names ({new_dim['from']}): {values}")
    sources = schema.sources
    if sources.get("files"):
        globs = ", ".join(sources.get("globs", []))
        lines.append(f"Sources: {sources['files']:,} file(s) along {sample.get('concat_dim', '?')} ({globs})")
        listed = sources.get("listed", [])
        for i, source in enumerate(listed):
            if i == len(listed) - 1 and sources["files"] > len(listed):
                lines.append("  ...")
            member = f"  {new_dim['name']} {new_dim['values'][source['member']]}" if new_dim else ""
            lines.append(f"  {source['path']}  [{source['start']}:{source['stop']}]{member}")
    for source in sources.get("static", []):
        lines.append(f"  {source['path']}  (static variables)")
    return lines


def scalar_lines(schema: Schema) -> list[str]:
    """The files' scalar coordinates: name = value units (long name)."""
    if not schema.scalar_coords:
        return []
    lines = ["Scalar coordinates (schema.json's scalar_coords)"]
    for entry in schema.scalar_coords:
        attrs = entry.get("attrs", {})
        units = f" {attrs['units']}" if attrs.get("units") else ""
        name = f" ({attrs['long_name']})" if attrs.get("long_name") else ""
        lines.append(f"  {entry['name']} = {entry['value']}{units}{name}")
    return lines


def _stat_rows(
    name: str, units: str, s: dict[str, Any], coords: dict[str, list], filled: bool = False
) -> list[list[str]]:
    """One row per variable, or per index of its per-dim statistics (e.g. one per level)."""
    import numpy as np

    def cell(value, form=".6g") -> str:
        return "-" if value is None else f"{value:{form}}"

    keys = ("count", "mean", "std", "min", "max", "nan_count", *(("filled_count",) if filled else ()))
    if not s.get("dims"):
        return [[name, units, *(cell(s[k], "," if k.endswith("count") else ".6g") for k in keys)]]
    columns = [np.asarray(s[k], dtype=object).reshape(-1) for k in keys]
    rows = []
    for i, index in enumerate(np.ndindex(np.asarray(s["count"]).shape)):
        # Name each row by its coordinate values (level=500), or by index where there are none.
        label = ", ".join(
            f"{dim}={coords[dim][j] if j < len(coords.get(dim, [])) else j}" for dim, j in zip(s["dims"], index)
        )
        cells = [cell(c[i], "," if k.endswith("count") else ".6g") for c, k in zip(columns, keys)]
        rows.append([f"{name} [{label}]", units, *cells])
    return rows


def stats_lines(stats: dict[str, Any] | None, schema: Schema) -> list[str]:
    import numpy as np

    if stats is None:
        return ["Statistics: no stats.json"]
    units = {}
    for feature in schema.variable_features:
        members = feature.source.get("variables", {feature.name: feature.source})  # a stack lists its members
        for name, source in members.items():
            units[name] = str(source.get("attrs", {}).get("units", ""))
    variables = stats.get("variables", {})
    # Filled values are in no statistic: show how many there were, where nan_policy: fill filled any.
    filled = any(np.sum(s.get("filled_count", 0)) for s in variables.values() if s)
    rows = [["variable", "units", "count", "mean", "std", "min", "max", "NaN", *(["filled"] if filled else [])]]
    for name, s in variables.items():
        if not s:
            rows.append([name, "", "(missing)", *[""] * (len(rows[0]) - 3)])
            continue
        rows.extend(_stat_rows(name, units.get(name, ""), s, schema.coords, filled))
    reference = stats.get("reference_split")
    over = f", over the {stats['over']}" if stats.get("over") in ("samples", "field") else ""  # (stats.over)
    title = f"Statistics (stats.json, split {reference}{over}; used by normalize=True)" if reference else "Statistics"
    description = textwrap.wrap(stats.get("description", ""), 100, initial_indent="  ", subsequent_indent="  ")
    return [title, *description, *_table(rows, align="<<" + ">" * (len(rows[0]) - 2))]


def config_lines(schema: Schema) -> list[str]:
    import yaml

    text = yaml.safe_dump(schema.config, sort_keys=False, default_flow_style=None).rstrip()
    return ["Config (resolved, as built)", *(f"  {line}" for line in text.splitlines())]


def summary(path: str, only_split: str | None = None) -> str:
    from schemas.metadata import load_schema, load_stats
    from schemas.stored_order import describe_order
    from schemas.verify import list_files

    schema = load_schema(path)
    if only_split and only_split not in schema.splits:
        raise UserError(f"{path}: no split {only_split!r}; it has: {', '.join(schema.splits)}; choose one of those")
    files = list_files(path)
    try:
        stats = load_stats(path)
    except FileNotFoundError:
        stats = None
    compression = schema.compression or "uncompressed"
    packing = f", {schema.examples_per_record} samples per record" if schema.examples_per_record > 1 else ""
    head = [
        f"{path}: {schema.created_by or 'xarray-tfrecords'} output",
        f"  {schema.num_examples():,} samples in {sum(len(s) for s in schema.splits.values())} shard(s), "
        f"{_megabytes(sum(files.values()))} on disk ({compression}{packing}), shuffle seed {schema.seed}",
        f"  records stored {describe_order(schema.sample)}",
    ]
    dropped = dropped_line(schema.counts)
    if dropped:
        head.append(dropped)
    sections = [
        head,
        feature_lines(schema),
        split_lines(schema, files, only_split),
        geometry_lines(schema),
        scalar_lines(schema),
        config_lines(schema),
        stats_lines(stats, schema),
    ]
    return "\n\n".join("\n".join(map(printable, section)) for section in sections if section)


# ---------------------------------------------------------------------------------------------
# The command


def _check_is_directory(path: str) -> None:
    import fsspec

    fs, root = fsspec.core.url_to_fs(path)
    if fs.isfile(root):
        raise UserError(f"{path}: is a file, not an output; pass the directory that holds schema.json")


def run(args: argparse.Namespace) -> int:
    path = str(args.output).rstrip("/") or "/"
    _check_is_directory(path)
    if args.verify:
        from schemas.verify import VerifyError, verify_output

        try:
            report = verify_output(path, args.split, source_samples=args.source or 0, seed=args.seed)
            print(report.summary())
        except VerifyError as error:
            print(f"error: {error}", file=sys.stderr)
            return EXIT_VERIFY_FAILED
    if args.plot:
        from pipelines.plots import plot_output

        written = plot_output(path, args.plot, args.split, samples=args.samples, seed=args.seed, with_map=args.map)
        print(f"Wrote {written}")
    if not args.verify and not args.plot:
        print(summary(path, args.split))
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m pipelines.inspect``: describe an output, verify it (``--verify``, ``--source N``) or plot it.

    Args:
        argv: the command line without the program name (default: ``sys.argv[1:]``).

    Returns:
        The exit status: 0 as described or verified, 1 a check failed (one line naming the file and the fix),
        2 not a complete output or bad arguments.
    """
    args = parse_args(argv)
    configure_logging(args.verbose)
    try:
        status = run(args)
        sys.stdout.flush()  # (a closed pipe shows here, not at exit, where Python would print its own message)
        return status
    except BrokenPipeError:
        return _closed_pipe()
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as error:
        from schemas.tfrecord import CorruptRecordError

        if isinstance(error, CorruptRecordError):  # met while plotting; --verify reports it the same way
            from schemas.verify import with_fix

            print(f"error: {with_fix(str(error), 'the shard is damaged: build the output again')}", file=sys.stderr)
            return EXIT_VERIFY_FAILED
        return report_failure(error, args.verbose, subject=args.output)


def _closed_pipe() -> int:
    """Stop quietly once whoever read our output has gone: the rest of it goes nowhere (as Python's docs on
    SIGPIPE advise), so flushing at exit raises nothing more."""
    import os

    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return EXIT_CLOSED_PIPE


if __name__ == "__main__":
    sys.exit(main())
