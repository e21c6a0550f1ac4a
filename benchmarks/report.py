"""The benchmark's printed report: one table per scale, fixed costs, the read side, scaling and the targets."""

from __future__ import annotations

import statistics
from pathlib import Path

from benchmarks import bytecode
from benchmarks.tables import table
from benchmarks.targets import (
    MAX_DEMO_SECONDS,
    MAX_HELP_SECONDS,
    MAX_WRITER_RSS_OVER_BUDGET,
    MIN_PARSER_VS_EXPERT,
    Target,
    scale_targets,
    scaling_targets,
    wall_ratio,
)

MB = 1e6
_WRITE_HEADERS = (
    "competitor",
    "wall s",
    "samples/s",
    "MB/s",
    "peak RSS MB",
    "wall/floor",
    "rate/floor",
    "RSS/floor",
    "load",
)
#: The docs' table leaves the load column out: the docs speak of the tool, not of the machine's state that day.
_DOCS_WRITE_HEADERS = _WRITE_HEADERS[:-1]


def _num(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _ratio(value: float | None, base: float | None) -> str:
    return "-" if value is None or not base else f"{value / base:.2f}"


def _write_row(row: dict, floor: dict | None) -> list[str]:
    if not row["ok"]:
        return [row["label"], "FAILED", *["-"] * 7]
    base = floor if floor and floor["ok"] else None
    return [
        row["label"],
        _num(row["wall"], 2),
        _num(row["samples_per_second"]),
        _num(row["mb_per_second"], 1),
        _num(row["peak_rss"] / MB),
        _ratio(row["wall"], base and base["wall"]),
        _ratio(row["samples_per_second"], base and base["samples_per_second"]),
        _ratio(row["peak_rss"], base and base["peak_rss"]),
        # The machine is shared: the 1-minute load average when the competitor started says how.
        f"{row['load'][0]:.1f}",
    ]


def _identity_notes(section: dict) -> list[str]:
    words = {True: "byte-identical to the pipeline's", False: "DIFFERENT from the pipeline's"}
    names = {"floor": "floor", "pipeline-2w": "2-worker pipeline"}
    return [
        f"  {names[name]} shards: {words[same]}"
        for name, same in section.get("identical_to_pipeline", {}).items()
        if same is not None
    ]


def _cpu_notes(competitors: dict) -> list[str]:
    """The CPU time of each competitor's kept run: what a wall ratio is made of on 2 cores (the I/O limit's is
    nearly all the kernel's, which the pipeline pays as well; its own work can only overlap it)."""
    spent = {row["label"]: row["cpu"] for row in competitors.values() if row["ok"] and sum(row.get("cpu") or ()) > 0}
    if not spent:  # (runs forked warm, in smoke tests, are not counted)
        return []
    return ["  CPU s, user + system: " + "; ".join(f"{label} {u:.1f} + {s:.1f}" for label, (u, s) in spent.items())]


def _round_notes(competitors: dict) -> list[str]:
    """With --repeat: each competitor's walls by round, and the pipeline's ratios to the others by round."""
    rounds = {name: row.get("walls", []) for name, row in competitors.items()}
    if max((len(walls) for walls in rounds.values()), default=0) < 2:
        return []
    notes = [
        "  walls by round (s; the table keeps each one's fastest): "
        + "; ".join(
            f"{competitors[name]['label']} " + ", ".join(f"{w:.2f}" for w in walls) for name, walls in rounds.items()
        )
    ]
    pipeline = competitors.get("pipeline")
    for name in ("floor", "io-limit"):
        other = competitors.get(name)
        if pipeline and other and pipeline["ok"] and other["ok"]:
            ratios = [a / b for a, b in zip(pipeline["walls"], other["walls"])]
            notes.append(
                f"  pipeline / {other['label']} by round: "
                + ", ".join(f"{r:.2f}" for r in ratios)
                + f" (median {wall_ratio(pipeline, other):.2f}: the targets' ratio;"
                + f" fastest / fastest {min(pipeline['walls']) / min(other['walls']):.2f})"
            )
    return notes


def scale_section(scale: str, section: dict, *, with_load: bool = True) -> str:
    data = section["dataset"]
    per_sample = data["input_bytes"] / max(data["samples"], 1) / 1e3
    title = (
        f"== {scale}x: {data['files']} files, {data['input_bytes'] / MB:,.1f} MB NetCDF -> {data['samples']:,} samples "
        f"(9x9 patch, all levels, 5 variables; ~{per_sample:.1f} KB of input each), {data['num_shards']} shards =="
    )
    competitors = section["competitors"]
    floor = competitors.get("floor")
    rows = [_write_row(row, floor)[: None if with_load else -1] for row in competitors.values()]
    notes = [f"  {row['label']}: {row['note']}" for row in competitors.values() if row.get("note")]
    notes += _identity_notes(section)
    notes += _cpu_notes(competitors)
    notes += _round_notes(competitors)
    phases = (floor or {}).get("details", {}).get("phases")
    if phases:
        notes.append("  floor phases (s): " + ", ".join(f"{k} {v:.2f}" for k, v in phases.items()))
    headers = _WRITE_HEADERS if with_load else _DOCS_WRITE_HEADERS
    parts = [title, table(headers, rows) if rows else "(no write-side competitor selected)"]
    return "\n".join(parts + notes)


def fixed_costs_section(results: dict) -> str | None:
    rows = []
    startup = results.get("startup")
    if startup:
        data = startup["dataset"]
        size = f"{data['files']} file(s), {data['samples']:,} samples"
        if startup.get("from_scale_rows"):
            size += ": the quick rows above"
        for name, label in (("pipeline", "default runner"), ("pipeline-2w", "2 workers")):
            row = startup[name]
            what = f"pipeline start-up ({label}; {size})"
            if row["ok"]:
                rows.append([what, _num(row["wall"], 2), _num(row["peak_rss"] / MB)])
            else:
                rows.append([what, "FAILED", "-"])
    demo = results.get("demo")
    if demo:
        if demo["ok"]:
            runs = ", ".join(f"{w:.2f}" for w in demo["runs"])
            what = f"the demo build, python -m pipelines.build (median of {runs})"
            rows.append([what, _num(demo["median"], 2), _num(demo["peak_rss"] / MB)])
        else:
            rows.append(["the demo build, python -m pipelines.build", "FAILED", "-"])
    help_run = results.get("help")
    if help_run:
        runs = ", ".join(f"{w:.2f}" for w in help_run["runs"])
        rows.append([f"python -m pipelines.build --help (median of {runs})", _num(help_run["median"], 2), "-"])
    if not rows:
        return None
    return "== fixed costs ==\n" + table(("what", "wall s", "peak RSS MB"), rows)


def _read_row(name: str, read: dict) -> list[str]:
    if not read or not read.get("ok"):
        return [name, "FAILED" if read else "-", *["-"] * 6]
    best = read["best"]
    record_kb = read["bytes"] / max(read["records"], 1) / 1e3
    return [
        name,
        f"{read['records']:,}",
        f"{record_kb:.2f}",
        str(read["batch_size"]),
        _num(best["parser"]),
        _num(best["expert"]) if "expert" in best else "-",
        f"{read['ratio']:.3f}" if read.get("ratio") is not None else "-",
        _num(best["parser"] * record_kb / 1e3, 1),
    ]


def _packing_gain(small: dict | None, packed: dict | None) -> str | None:
    """How much faster the parser reads the point series packed several to a record."""
    if not (small and small.get("ok") and packed and packed.get("ok")):
        return None
    plain = statistics.median(small["examples_per_second"]["parser"])
    many = statistics.median(packed["examples_per_second"]["parser"])
    n = packed["examples_per_record"]
    return f"  {n} series per record (output.examples_per_record: {n}): the parser reads {many / plain:.2f}x as fast"


def _reads(results: dict) -> list[dict]:
    reads = [sec["read"] for sec in results["scales"].values() if "read" in sec]
    return reads + ([results["read_small"]] if "read_small" in results else [])


def read_section(results: dict) -> str | None:
    rows = [_read_row(f"patches ({scale}x)", sec["read"]) for scale, sec in results["scales"].items() if "read" in sec]
    small = results.get("read_small")
    packed = results.get("read_small_packed")
    if small:
        rows.append(_read_row("point series (32 steps of t)", small))
    if packed:
        rows.append(_read_row(f"  same, {packed.get('examples_per_record', '?')} per record", packed))
    if not rows:
        return None
    headers = (
        "dataset",
        "records",
        "KB/record",
        "batch",
        "parser ex/s",
        "expert ex/s",
        "parser/expert",
        "parser MB/s",
    )
    rounds = next((r["rounds"] for r in _reads(results) if r.get("ok")), "?")
    title = (
        "== read side: generated parser.make_dataset vs hand-written tf.data "
        f"(ex/s: best of {rounds} alternating rounds; parser/expert: median of the per-round ratios) =="
    )
    lines = [title, table(headers, rows)]
    gain = _packing_gain(small, packed)
    if gain:
        lines.append(gain)
    build = (small or {}).get("build")
    if build and not build["ok"]:
        lines.append("  building the point series with the pipeline FAILED (see the JSON's error)")
    elif build:
        lines.append(
            f"  building the point series with the pipeline took {build['wall']:.1f} s "
            f"({_num(build['samples_per_second'])} samples/s, peak RSS {build['peak_rss'] / MB:,.0f} MB)"
        )
    return "\n".join(lines)


def _pipeline(results: dict, scale: str) -> dict | None:
    row = results["scales"][scale]["competitors"].get("pipeline")
    return row if row and row["ok"] else None


def scaling_section(results: dict) -> str | None:
    if "1" not in results["scales"] or len(results["scales"]) < 2 or not _pipeline(results, "1"):
        return None
    base = _pipeline(results, "1")
    startup = (results.get("startup") or {}).get("pipeline")
    fixed = startup["wall"] if startup and startup["ok"] else None
    rows = []
    for scale in results["scales"]:
        row = _pipeline(results, scale)
        if scale == "1" or row is None:
            continue
        adjusted = None if fixed is None else (row["wall"] - fixed) / (base["wall"] - fixed)
        floor, floor_1 = (results["scales"][s]["competitors"].get("floor") for s in (scale, "1"))
        floor_ratio = floor["wall"] / floor_1["wall"] if floor and floor_1 and floor["ok"] and floor_1["ok"] else None
        rows.append(
            [
                f"{scale}x / 1x",
                f"{row['wall'] / base['wall']:.2f}",
                _num(adjusted, 2),
                f"{row['peak_rss'] / base['peak_rss']:.2f}",
                _num(floor_ratio, 2),
            ]
        )
    headers = ("scaling", "pipeline wall", "wall - start-up", "pipeline RSS", "floor wall")
    note = f"  start-up subtracted: {fixed:.2f} s (pipeline on 1 file)" if fixed is not None else "  (no start-up run)"
    return "== scaling ==\n" + table(headers, rows) + "\n" + note


def all_targets(results: dict) -> list[Target]:
    """Every target the results have a measurement for, the many-files benchmark's included."""
    targets = [t for scale in results["scales"] for t in scale_targets(results, scale)]
    targets += scaling_targets(results)
    small = results.get("read_small")
    if small is not None:
        targets.append(
            Target("parser / expert examples/s (point series)", small.get("ratio"), MIN_PARSER_VS_EXPERT, False)
        )
    writer = results.get("shard_writer")
    for case in (writer or {}).get("cases", {}):
        row = writer["cases"][case]["stream"]
        over = (row["peak_rss"] - writer["baseline_rss"]) / (writer["budget_mb"] * 1e6) if row["ok"] else None
        targets.append(Target(f"shard writer RSS / budget ({case})", over, MAX_WRITER_RSS_OVER_BUDGET, True))
    if "many_files" in results:
        from benchmarks.scale import targets as many_files_targets

        targets += many_files_targets(results["many_files"])
    if "remote_planning" in results:
        from benchmarks.remote_planning import targets as remote_planning_targets

        targets += remote_planning_targets(results["remote_planning"])
    if "cost" in results:
        from benchmarks.cost import targets as cost_targets

        targets += cost_targets(results["cost"])
    if "merge_memory" in results:
        from benchmarks.merge_memory import targets as merge_memory_targets

        targets += merge_memory_targets(results["merge_memory"])
    demo = results.get("demo")
    if demo is not None:
        targets.append(Target("demo build wall", demo.get("median"), MAX_DEMO_SECONDS, True, "s"))
    help_run = results.get("help")
    if help_run is not None:
        targets.append(Target("pipelines.build --help wall", help_run.get("median"), MAX_HELP_SECONDS, True, "s"))
    return targets


def targets_section(targets: list[Target]) -> str:
    rows = []
    for target in targets:
        sign = "<=" if target.at_most else ">="
        value = "-" if target.value is None else f"{target.value:.3f}"
        rows.append([target.name, f"{value} {target.unit}", f"{sign} {target.limit:g} {target.unit}", target.status])
    return "== targets ==\n" + table(("target", "measured", "limit", "result"), rows)


def _install(host: dict) -> str:
    gcp = host.get("beam_gcp")
    if gcp is None:
        return "install not recorded"
    return "Beam with its GCP extras ([build,gcp] or [test])" if gcp else "Beam without its GCP extras ([build])"


def header(results: dict) -> str:
    host = results["host"]
    load = ", ".join(f"{x:.2f}" for x in host["load_at_start"])
    quick = " QUICK (tiny data: a smoke test, not a measurement)" if results["options"]["quick"] else ""
    return (
        f"xarray-tfrecords benchmark{quick} -- {results['started']}, {host['cpus']} CPUs, load {load}, "
        f"{_install(host)}; "
        f"MB = 1e6 bytes; RSS = peak of the summed RSS of each competitor's process tree (polled every 50 ms); "
        "load = 1-minute load average when the competitor started"
    ) + ("\n" + bytecode.note(results["bytecode"]) if "bytecode" in results else "")


def docs_header(results: dict) -> str:
    host = results["host"]
    return (
        f"{host['cpus']} CPUs, {_install(host)}; MB = 1e6 bytes; RSS = peak of the summed RSS of each competitor's "
        "process tree (polled every 50 ms)"
    )


#: Where the docs hold the current table (docs/performance.md).
MARKDOWN_START, MARKDOWN_END = "<!-- benchmark:start -->", "<!-- benchmark:end -->"


def markdown(results: dict, command: str) -> str:
    """The report as the docs' current table: the command that made it, then the report in a fenced block."""
    return f"Written by `{command}`:\n\n```text\n{render(results, for_docs=True)}\n```\n"


def write_markdown(path: Path, results: dict, command: str) -> None:
    """Replace the table between the benchmark markers of ``path`` (a docs page) with this run's."""
    from pipelines.config_reference import replace_between

    path.write_text(replace_between(path.read_text(), MARKDOWN_START, MARKDOWN_END, markdown(results, command)))


def render(results: dict, *, for_docs: bool = False) -> str:
    """The report as printed; ``for_docs``: without the run's date and load (the docs speak of no run's day)."""
    sections = [docs_header(results) if for_docs else header(results)]
    sections += [scale_section(scale, section, with_load=not for_docs) for scale, section in results["scales"].items()]
    for build in (fixed_costs_section, read_section, scaling_section):
        text = build(results)
        if text:
            sections.append(text)
    if "shard_writer" in results:
        from benchmarks.shard_writer import render as shard_writer_section

        sections.append(shard_writer_section(results["shard_writer"]))
    if "many_files" in results:
        from benchmarks.scale import render as many_files_section

        sections.append(many_files_section(results["many_files"], for_docs=for_docs))
    if "inputs" in results:
        from benchmarks.inputs_vs_netcdf import render as inputs_section

        sections.append(inputs_section(results["inputs"], for_docs=for_docs))
    if "remote_planning" in results:
        from benchmarks.remote_planning import render as remote_planning_section

        sections.append(remote_planning_section(results["remote_planning"], for_docs=for_docs))
    if "cost" in results:
        from benchmarks.cost import render as cost_section

        sections.append(cost_section(results["cost"], for_docs=for_docs))
    if "merge_memory" in results:
        from benchmarks.merge_memory import render as merge_memory_section

        sections.append(merge_memory_section(results["merge_memory"], for_docs=for_docs))
    sections.append(targets_section(all_targets(results)))
    if results.get("failed"):
        sections.append("FAILED: " + ", ".join(results["failed"]))
    return "\n\n".join(sections)
