"""Tables → lines that fit a width, for terminals (Rich, coloured) and CI logs (plain text).

Nothing is ever cut or split: every number and status word is laid out whole, and a table
that cannot fit the width as a grid falls back to one result per line. The grid, per
(check, zcg) table, one block of lines per kernel × device/dtype row::

    kernel  device dtype  γ=randn      γ=ones (control)  γ=zeros
    before  cpu fp64      1.118e+00 x  1.480e-12 ✓       0 ✓
            tol           3.216e-11    3.216e-11         0
            worst at      [0,5,70]     [1,0,188]         —
            randn/ones    7.56e+11

bf16/fp16 cells are in ulps of the output dtype (``0.4998 ulp``), and the gradients' rows
add the method: which precision the kernel's own forward was lifted to for the reference.

A cell shows its worst result (one not as expected first, then the largest error): the
error with a status mark (``x``: a declared defect shown, as expected; ``✗!``: a
failure not expected), below it that result's tolerance and worst element. Long kernel
refs are shortened in the rows and given whole in a footnote. A line is a list of
``(text, style)`` segments: :func:`plain` joins them, the Rich renderer colours them.
"""

from __future__ import annotations

import textwrap

from rich.cells import cell_len
from rich.console import Console
from rich.text import Text

from gradcheck_bi.report.render import method_line
from gradcheck_bi.report.tables import (
    Cell,
    Row,
    Table,
    format_detectable,
    format_index,
    format_ratio,
    short_name,
    shown,
)
from gradcheck_bi.vocab import Result

Segment = tuple[str, str]  # (text, Rich style)
Line = list[Segment]

NAME_MAX = 16  # longer kernel names get an alias in the rows and a footnote
GAP = "  "
# ✗ is kept for what is wrong (here and in the closing block). A declared defect shown where
# it must show is a good thing: pytest's mark for an expected failure, one column wide as ✓.
EXPECTED_FAIL = "x"
_KEYS = (f"✓ pass · {EXPECTED_FAIL} expected failure (a declared defect shown) · ✗! "
         "unexpected failure · ✓! declared defect missed · any ! is not as expected (exit 1) "
         "· a cell is its worst result: max |err|, its tol and worst element · catches ≥ r: "
         "the smallest relative error in the gradient this check detects here")
LEGEND = (f"{_KEYS} · x·s γ·s in a failure: the input and γ scales · randn/ones: "
          "discrimination ratio (γ=randn error / γ=ones error)")
# The legend where no table has γ controls (every op without a weight): no γ, no ratio.
LEGEND_UNWEIGHTED = f"{_KEYS} · x·s in a failure: the input scale"


def glyph(r: Result) -> Segment:
    """The status word or glyph for a result; ``!`` marks anything not as expected."""
    if r.status == "unsupported":
        return ("unsupported", "yellow")
    if r.status == "error":
        return ("error", "red") if r.as_expected else ("ERROR!", "bold red")
    if not r.as_expected:
        return ("✓!" if r.status == "pass" else "✗!", "bold red")
    return ("✓", "green") if r.status == "pass" else (EXPECTED_FAIL, "cyan")


def _cell_lines(cell: Cell) -> tuple[Line, str, str]:
    """(error + glyph, tolerance, worst element) of the cell's worst result."""
    w = cell.worst
    if w is None:
        return [("—", "")], "", ""
    g = glyph(w)
    if w.status in ("error", "unsupported"):
        return [g], "", ""
    where = format_index(w.worst) if w.max_abs_err else "—"  # no worst element of all-zeros
    return [(shown(w, w.max_abs_err) + " ", ""), g], shown(w, w.tolerance), where


def display_names(refs: list[str]) -> dict[str, str]:
    """Full kernel ref → the name its rows show (≤ NAME_MAX characters where possible)."""
    names: dict[str, str] = {}
    for ref in refs:
        name = short_name(ref)
        if len(name) > NAME_MAX:
            name = ref.rpartition(":")[2]
        if len(name) > NAME_MAX or name in names.values():
            name = f"K{len(names) + 1}"
        names[ref] = name
    return names


def _width(line: Line) -> int:
    return sum(cell_len(text) for text, _ in line)


def _pad(segments: Line, width: int) -> Line:
    return [*segments, (" " * max(0, width - _width(segments)), "")]


def _wrap(text: str, width: int, style: str = "", indent: str = "") -> list[Line]:
    """Wrap prose at spaces only: a number or word is never broken."""
    return [[(t, style)] for t in textwrap.wrap(
        text, width, subsequent_indent=indent, break_long_words=False,
        break_on_hyphens=False)] or [[("", "")]]


def _row_ref(row: Row) -> str:
    return next(r.kernel for c in row.cells.values() for r in c.results)


def _grid(table: Table, names: dict[str, str]) -> list[list[Line]]:
    """The table as rows of cells (each a line of segments), before column widths."""
    grid: list[list[Line]] = [[[("kernel", "bold")], [("device dtype", "bold")]]
                              + [[(table.column_title(w), "bold")] for w in table.controls]]
    for row in table.rows:
        cells = [_cell_lines(row.cells[w]) for w in table.controls]
        grid.append([[(names[_row_ref(row)], "bold")], [(row.target, "")]]
                    + [c[0] for c in cells])
        grid.append([[], [("tol", "dim")]] + [[(c[1], "")] for c in cells])
        grid.append([[], [("worst at", "dim")]] + [[(c[2], "")] for c in cells])
        if row.has_ratio:  # a layout row runs γ = randn only: no ratio
            grid.append([[], [("randn/ones", "dim")], [(format_ratio(row.ratio), "")]])
        if table.per_row_method and row.methods:
            grid.append([[], [("method", "dim")], [("; ".join(row.methods), "")]])
        if row.detectable_randn is not None:  # dx, dw: the relative error it would catch
            grid.append([[], [("catches", "dim")],
                         [(format_detectable(row.detectable_randn), "")]])
    return grid


def _fit_grid(grid: list[list[Line]], width: int) -> list[Line] | None:
    """The grid with aligned columns, or None when it is wider than ``width``.

    A row shorter than the header (the ratio) lets its last cell run on past its column.
    """
    cols = len(grid[0])
    widths = [max(_width(r[c]) for r in grid if c < len(r) - (len(r) < cols))
              for c in range(cols)]
    lines = []
    for r in grid:
        line: Line = []
        for c, cell in enumerate(r):
            if c:
                line.append((GAP, ""))
            line += _pad(cell, widths[c]) if c < len(r) - 1 else cell
        while line and not line[-1][0].strip():
            line.pop()
        lines.append(line)
    if sum(widths) + len(GAP) * (cols - 1) > width or any(_width(ln) > width for ln in lines):
        return None
    return lines


def _per_result(table: Table, names: dict[str, str]) -> list[Line]:
    """One line per result: the layout when even the compact grid does not fit."""
    lines: list[Line] = []
    for row in table.rows:
        for w in table.controls:
            for r in row.cells[w].results:
                g = glyph(r)
                gamma = (f" γ={w}" if table.weighted else
                         f" {table.column_title(w)}" if table.column is not None else "")
                line: Line = [(f"{names[r.kernel]} {row.target}{gamma}: ", "")]
                if r.status in ("error", "unsupported"):
                    line.append(g)
                else:
                    line += [(shown(r, r.max_abs_err) + " ", ""), g,
                             (f" tol {shown(r, r.tolerance)} at "
                              f"{format_index(r.worst)}", "")]
                lines.append(line)
    return lines


def table_lines(tables: list[Table], width: int = 80) -> list[Line]:
    """Every table as lines no wider than ``width`` (grid, else one result per line)."""
    refs = list(dict.fromkeys(r.kernel for t in tables for row in t.rows
                              for c in row.cells.values() for r in c.results))
    names = display_names(refs)
    legend = LEGEND if not tables or any(t.weighted for t in tables) else LEGEND_UNWEIGHTED
    out: list[Line] = _wrap(legend, width, "dim")
    for table in tables:
        out.append([("", "")])
        out += _wrap(table.title, width, "bold")
        out += _wrap(f"{table.subtitle} · {method_line(table)}", width, "dim")
        out += _fit_grid(_grid(table, names), width) or _per_result(table, names)
    notes = [f"{name} = {ref}" for ref, name in names.items() if name != ref]
    if notes:
        out.append([("", "")])
        for note in notes:
            out += _wrap(note, width, "dim", indent="  ")
    return out


def plain(lines: list[Line]) -> str:
    """The lines as plain text (no colour), one per line."""
    return "".join("".join(text for text, _ in line).rstrip() + "\n" for line in lines)


def print_lines(lines: list[Line], console: Console) -> None:
    """The lines on a Rich console, coloured, never re-wrapped (they already fit)."""
    for line in lines:
        console.print(Text.assemble(*line), soft_wrap=True, overflow="ignore", crop=False)
