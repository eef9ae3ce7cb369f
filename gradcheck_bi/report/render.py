"""Tables and verdicts → Markdown and the contract's JSON (terminals and logs: :mod:`.text`).

Markdown shows the tables: rows kernel × device/dtype, columns γ = randn | ones (control) |
zeros, each cell the error and its status (for dx and dw, at the element with the largest
error / tolerance), then the tolerance,
where the worst γ=randn element is, and the discrimination ratio (randn / ones). JSON is
every result; anything that varies from run to run goes under ``"timing"`` only.
"""

from __future__ import annotations

import json
from typing import Any

from gradcheck_bi._version import __version__
from gradcheck_bi.fd import CENTRAL4
from gradcheck_bi.gate import Summary, verdict_line
from gradcheck_bi.ops import ROWS
from gradcheck_bi.report.tables import (
    Row,
    Table,
    describe,
    format_detectable,
    format_index,
    format_ratio,
    format_tolerance,
    shown,
    ulp_unit,
)
from gradcheck_bi.tolerance.notes import HALF_NOTES, LIKE, NOTES, forward_note
from gradcheck_bi.vocab import Result

# The default stencil's words, after the tolerance's (gradcheck_bi.tolerance.notes).
_STENCIL = f"{CENTRAL4.order}th-order central stencil"
_STENCIL_NOTES = {"dx": f"{_STENCIL}, step per row", "dw": _STENCIL}


def _steps(table: Table) -> str:
    found = [r.details for row in table.rows for c in row.cells.values() for r in c.results
             if "step_min" in r.details]
    lo = [float(d["step_min"]) for d in found]
    hi = [float(d["step_max"]) for d in found]
    if not lo:
        return ""
    a, b = min(lo), max(hi)
    return f"step h = {a:.3g}" if a == b else f"step h ∈ [{a:.3g}, {b:.3g}]"


def method_line(table: Table) -> str:
    if table.column is not None:
        return _shaped_method(table)
    if table.half:
        parts = [HALF_NOTES[table.check]]
    else:
        stencil = _STENCIL_NOTES.get(LIKE.get(table.check, table.check))
        note = forward_note(ROWS[table.op]) if table.check == "forward" else NOTES[table.check]
        parts = [note + (f"; {stencil}" if stencil else "")]
    step = _steps(table)
    if step:
        parts.append(step)
    return " · ".join(parts)


def _shaped_method(table: Table) -> str:
    """An op of any shape: the tolerance's words, and how many elements its gradient
    results checked each way."""
    found = [r.details for row in table.rows for c in row.cells.values() for r in c.results]
    if table.check == "forward":
        return "tolerance: per element, 8σ of the rounding derived from the fp64 reference"
    if table.check == "batch_invariance":
        return "bitwise"
    per = [int(d["checked_per_element"]) for d in found if "checked_per_element" in d]
    every = [int(d["elements"]) for d in found if "elements" in d]
    dirs = [int(d["directions"]) for d in found if "directions" in d]
    words = ("tolerance: per element, 8σ of the FD noise and the kernel's rounding derived "
             "from the reference, in quadrature, + 2× Richardson truncation; 4th-order "
             "central differences")
    if per and sum(per) < sum(every):
        words += (f"; {sum(per)} of {sum(every)} elements checked per element, the rest by "
                  f"{max(dirs)} random directions each")
    return words


def ratio_line(table: Table) -> str:
    """The discrimination ratio per row; empty for an op without a weight (no controls)."""
    if not table.weighted:
        return ""
    return "discrimination ratio (γ=randn error / γ=ones error): " + " · ".join(
        f"{row.kernel} {row.target} {format_ratio(row.ratio)}" for row in table.rows
        if row.has_ratio  # a layout row runs γ = randn only: no ratio
    )


def _md_cell(table: Table, row: Any, w: str) -> str:
    cell = row.cells[w]
    text = cell.text()
    if cell.worst is None:
        return text
    return text if cell.as_expected else f"**{text}**"


def _md_tolerance(row: Row) -> str:
    r = row.loosest
    if r is None or ulp_unit(r) is None:
        return format_tolerance(None if r is None else r.tolerance)
    return shown(r, r.tolerance)


def render_markdown(tables: list[Table], summary: Summary, plot: str | None = None,
                    notes: list[str] | None = None) -> str:
    """The same tables as GitHub-flavoured Markdown, ready to paste into a pull request."""
    out = []
    for table in tables:
        out.append(f"#### {table.title}")
        out.append("")
        out.append(f"_{table.subtitle}; {method_line(table)}_")
        out.append("")
        method = table.per_row_method
        sees = any(row.detectable_randn is not None for row in table.rows)
        gamma = " γ=randn" if table.weighted else " at"
        out.append("| kernel | device dtype | "
                   + " | ".join(table.column_title(w) for w in table.controls)
                   + f" | tolerance | worst{gamma} |" + (" method |" if method else "")
                   + ((" catches (rel., γ=randn) |" if table.weighted else " catches (rel.) |")
                      if sees else ""))
        out.append("| --- | --- | " + " | ".join("---:" for _ in table.controls)
                   + " | ---: | ---: |"
                   + (" --- |" if method else "") + (" ---: |" if sees else ""))
        for row in table.rows:
            out.append(f"| {row.kernel} | {row.target} | "
                       + " | ".join(_md_cell(table, row, w) for w in table.controls)
                       + f" | {_md_tolerance(row)} | {format_index(row.worst_randn)} |"
                       + (f" {'; '.join(row.methods)} |" if method else "")
                       + (f" {format_detectable(row.detectable_randn)} |" if sees else ""))
        out.append("")
        ratios = ratio_line(table)
        if ratios:
            out.append(ratios)
            out.append("")
    if plot:
        out.append(f"![finite-difference error against step size]({plot})")
        out.append("")
    lines = [f"note: {n}" for n in notes or []]
    lines += [f"nothing checked: {k} — {why}" for k, why in summary.unchecked]
    for line in lines + [describe(r) for r in summary.unexpected + summary.unsupported]:
        out.append(f"- {line}")
    if lines or summary.unexpected or summary.unsupported:
        out.append("")
    out.append(f"**{verdict_line(summary)}**")
    return "\n".join(out) + "\n"


def to_json(results: list[Result], ok: bool, environment: dict[str, Any],
            timing: dict[str, Any] | None = None, notes: list[str] | None = None,
            dropped: list[dict[str, str]] | None = None,
            unchecked: list[tuple[str, str]] | None = None,
            shard: dict[str, Any] | None = None) -> str:
    """The contract's JSON: tool, version, ok, environment, results; timing kept apart;
    ``"not_run"``: one line per kernel and zcg setting left out, ``"dropped"``: one entry
    per target a case's skip_missing_devices left out, ``"nothing_checked"``: one entry per
    kernel that ran no point, ``"shard"``: which part of the run this report is, for
    ``gradcheck-bi merge`` (each only when there is one)."""
    doc: dict[str, Any] = {
        "tool": "gradcheck-bi",
        "version": __version__,
        "ok": ok,
        "environment": environment,
        "results": [r.to_dict() for r in results],
    }
    if notes:
        doc["not_run"] = list(notes)
    if dropped:
        doc["dropped"] = [dict(d) for d in dropped]
    if unchecked:
        doc["nothing_checked"] = [{"kernel": k, "reason": why} for k, why in unchecked]
    if shard:
        doc["shard"] = shard
    if timing is not None:
        doc["timing"] = timing
    return json.dumps(doc, indent=2) + "\n"
