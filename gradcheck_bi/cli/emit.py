"""Where each part of a run's report goes: the report to stdout or ``--output``, and the
closing block (ranked failures, drift, the verdict) to stdout — or to stderr when stdout
carries a machine-readable report — so a CI log always ends with the verdict.

Only routing lives here; every format is built in :mod:`gradcheck_bi.report`.
"""

from __future__ import annotations

import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from gradcheck_bi.cli.options import write_output
from gradcheck_bi.gate import summarize
from gradcheck_bi.gate.baseline import Drift, drifted_results
from gradcheck_bi.report import baseline as drift_report
from gradcheck_bi.report.github import to_github
from gradcheck_bi.report.junit import to_junit
from gradcheck_bi.report.render import render_markdown, to_json
from gradcheck_bi.report.summary import closing_lines
from gradcheck_bi.report.tables import build_tables
from gradcheck_bi.report.text import Line, plain, print_lines, table_lines
from gradcheck_bi.vocab import Result


@dataclass
class Report:
    """What a run produced: results, drift from the baseline compared with, the exit code."""

    results: list[Result]
    drifts: list[Drift]
    baseline: Path | None  # the baseline compared with (None: no comparison)
    code: int
    strict: bool = False
    verbose: bool = False
    environment: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # kernels and zcg settings not run
    dropped: list[dict[str, str]] = field(default_factory=list)  # by skip_missing_devices
    unchecked: list[tuple[str, str]] = field(default_factory=list)  # kernels that ran nothing
    shard: dict[str, Any] | None = None  # which shard of the run this is (--shard K/N)

    def closing(self) -> list[Line]:
        return closing_lines(self.results, self.drifts, self.baseline, self.verbose,
                             self.strict, self.notes, self.unchecked)

    def tables(self, width: int) -> list[Line]:
        """The tables and their legend; nothing at all when there is no result to show."""
        return table_lines(build_tables(self.results), width) if self.results else []


def log_width() -> int:
    """Columns for plain text: ``COLUMNS`` or the terminal's, else 80 (a CI log)."""
    return shutil.get_terminal_size((80, 24)).columns


def render(report: Report, fmt: str, plot: str | None, elapsed: float) -> str:
    """The report in a file format (everything but ``table``, which is drawn live)."""
    results, drifts = report.results, report.drifts
    if fmt == "json":
        text = to_json(results, report.code == 0, report.environment,
                       {"seconds": round(elapsed, 3)}, report.notes, report.dropped,
                       report.unchecked, report.shard)
        return drift_report.add_to_json(text, drifts, report.baseline) if report.baseline \
            else text
    if fmt == "markdown":
        summary = summarize(results, report.strict, report.unchecked,
                            drifted_results(drifts))
        text = render_markdown(build_tables(results), summary, plot=plot, notes=report.notes)
        return text + (drift_report.render_markdown(drifts, report.baseline)
                       if report.baseline else "")
    if fmt == "junit":
        return to_junit(results, drifts, unchecked=report.unchecked)
    if fmt == "github":
        return to_github(results, drifts, report.verbose, report.strict, report.notes,
                         report.unchecked)
    return plain([*report.tables(log_width()), [("", "")], *report.closing()])


def emit(report: Report, fmt: str, output: Path | None, plot: str | None,
         elapsed: float) -> None:
    """Write the report where it belongs and end stdout (or stderr) with the closing block."""
    if output is None and fmt == "table":
        console = Console(highlight=False)
        print_lines([*report.tables(console.width), [("", "")], *report.closing()], console)
        return
    if output is None and fmt == "text":
        sys.stdout.write(render(report, fmt, plot, elapsed))
        return
    text = render(report, fmt if fmt != "table" else "text", plot, elapsed)
    if output is not None:
        write_output(output, text)
        sys.stderr.write(f"wrote {output}\n")
        closing = Console(highlight=False)
    else:
        sys.stdout.write(text)
        sys.stdout.flush()
        closing = Console(stderr=True, highlight=False)
    print_lines(report.closing(), closing)
