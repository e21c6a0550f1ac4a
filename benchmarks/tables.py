"""Plain-text tables of the benchmarks' reports: columns aligned, the first to the left, numbers to the right."""

from __future__ import annotations


def table(headers: tuple[str, ...], rows: list[list[str]]) -> str:
    """Columns aligned: the first to the left, numbers to the right."""
    widths = [max(len(str(r[i])) for r in [list(headers), *rows]) for i in range(len(headers))]

    def line(cells) -> str:
        first = str(cells[0]).ljust(widths[0])
        return "  ".join([first, *(str(c).rjust(w) for c, w in zip(cells[1:], widths[1:]))]).rstrip()

    return "\n".join([line(headers), line(["-" * w for w in widths]), *(line(r) for r in rows)])
