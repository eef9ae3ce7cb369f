"""The closing block every run ends with, whatever the format: failures ranked, then the verdict.

Where a CI log is read is its last lines. Results not as expected are grouped per kernel
and check, and each group is named by its worst result — one whose kernel raised first,
then the one furthest past its tolerance (error / tolerance) — with everything needed to
reproduce it: shape, device/dtype, γ control, zcg, input and γ scales, eps, seed, error,
tolerance and element. ``verbose`` lists every result instead. Baseline drift follows,
without repeating the results already listed; the verdict is the last line.

>>> from gradcheck_bi.vocab import Result
>>> bad = Result("k", "dx", "cpu", "fp64", [3, 64], 1e-6, 0, "randn", False, 5.1e4, 2e-11,
...              "fail", "pass", False, worst=[0, 7], input_scale=1e-4)
>>> print(plain(closing_lines([bad], [])).splitlines()[0])
not as expected: 1 result, the worst per kernel and check
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Sequence
from pathlib import Path

from gradcheck_bi.gate import EXIT_UNSUPPORTED, precision_only, summarize, verdict_line
from gradcheck_bi.gate.baseline import Drift, drifted_results, key_of
from gradcheck_bi.report.baseline import verdict as drift_verdict
from gradcheck_bi.report.tables import describe
from gradcheck_bi.report.text import Line, plain
from gradcheck_bi.vocab import Result

__all__ = ["closing_lines", "plain", "ranked"]


def declared_mutations(results: list[Result]) -> list[str]:
    """One note per kernel and declared write (a kernel that writes into a tensor it owns
    by declaration passes, but never in silence)."""
    seen: dict[tuple[str, str], int] = {}
    for r in results:
        for line in r.details.get("declared_mutation", ()):
            seen[(r.kernel, line)] = seen.get((r.kernel, line), 0) + 1
    return [f"{kernel}: declared mutation: {line} in {n} result{'s' if n != 1 else ''}; "
            "its gradients were checked on copies" for (kernel, line), n in seen.items()]


def severity(r: Result) -> tuple[int, float]:
    """Sort key, most telling first: a kernel that raised, then the error furthest past its
    tolerance (a declared defect missed has a ratio below 1 and comes last), and a failure
    on rounding alone (:func:`~gradcheck_bi.gate.precision_only`) after every other."""
    if r.status == "error":
        return (0, 0.0)
    rank = 2 if precision_only(r) else 1
    err, tol = r.max_abs_err, r.tolerance
    if err is None or math.isnan(err):
        return (rank, -math.inf)
    ratio = math.inf if not tol else err / tol
    return (rank, -ratio)


def ranked(results: list[Result], verbose: bool = False,
           strict: bool = False) -> list[tuple[Result, int]]:
    """(worst result, how many in its kernel/check group), most telling group first.

    With ``verbose`` every result not as expected, each as its own entry.
    """
    bad = sorted(summarize(results, strict).unexpected, key=severity)
    if verbose:
        return [(r, 1) for r in bad]
    groups: dict[tuple[str, str, bool], list[Result]] = {}
    for r in bad:  # one kernel error, however many results it broke, is one entry
        groups.setdefault((r.kernel, r.message if r.status == "error" else r.check,
                           precision_only(r)), []).append(r)
    return [(members[0], len(members)) for members in groups.values()]


def _excess(r: Result) -> str:
    err, tol = r.max_abs_err, r.tolerance
    if r.status != "fail" or err is None or not tol or not math.isfinite(err):
        return ""
    return f" ({err / tol:.1e}× tol)"


def failure_line(r: Result, group: int) -> str:
    """One line for a ranked entry: the result, how far past its tolerance, its group size."""
    text = describe(r, scales=True) + _excess(r)
    if r.status == "error" and group > 1:
        return text + f" — the same error in {group} results"
    where = f"{r.check}, rounding only" if precision_only(r) else r.check
    return text + (f" — worst of {group} in {where}" if group > 1 else "")


WIDTH = 80  # a CI log read in a terminal


def wrapped(text: str, width: int = WIDTH) -> list[str]:
    """A failure line at ``width`` columns: the point on the first line(s), then what went
    wrong, indented by two (the ``✗ `` before the first line takes the same two).

    >>> wrapped("after dx cpu/fp64 shape (3, 16): fail (expected pass), max |err| 1 > tol 0",
    ...         40)
    ['after dx cpu/fp64 shape (3, 16)', '  fail (expected pass), max |err| 1 >', '  tol 0']
    """
    where, sep, what = text.partition(": ")
    lines = textwrap.wrap(where, width - 2, subsequent_indent="  ", break_on_hyphens=False)
    if sep:
        lines += textwrap.wrap(what, width - 2, initial_indent="  ", subsequent_indent="  ",
                               break_on_hyphens=False, break_long_words=False)
    return lines


def closing_lines(results: list[Result], drifts: list[Drift],
                  baseline: str | Path | None = None, verbose: bool = False,
                  strict: bool = False, notes: list[str] | None = None,
                  unchecked: Sequence[tuple[str, str]] = ()) -> list[Line]:
    """What was not run, failures ranked, unsupported results, drift, and the verdict (the
    last line)."""
    summary = summarize(results, strict, unchecked, drifted_results(drifts))
    out: list[Line] = [[("note: " + note, "yellow")]
                       for note in [*(notes or []), *declared_mutations(results)]]
    entries = ranked(results, verbose, strict)
    if entries:
        n = len(summary.unexpected)
        how = (", each listed, worst first" if verbose else
               ", the worst per kernel and check" + (" (--verbose: all)" if n > len(entries)
                                                     else ""))
        head = f"not as expected: {n} result{'s' if n != 1 else ''}{how}"
        out += [[(line, "bold")] for line in textwrap.wrap(head, WIDTH)]
        for r, g in entries:
            first, *rest = wrapped(failure_line(r, g))
            out.append([("✗ ", "bold red"), (first, "red")])
            out += [[("  " + line, "red")] for line in rest]
    reasons: dict[tuple[str, str], int] = {}
    for r in summary.unsupported:
        reasons[(r.kernel, r.message)] = reasons.get((r.kernel, r.message), 0) + 1
    for (kernel, message), count in reasons.items():
        out.append([("· ", "yellow"), (f"{kernel}: {count} result{'s' if count != 1 else ''} "
                                        f"unsupported here: {message}", "yellow")])
    if baseline is not None:
        listed = {key_of(r) for r in summary.unexpected}
        shown = [d for d in drifts if verbose or d.key not in listed]
        out += [[("✗ ", "bold red"), (d.line, "red")] for d in shown]
        repeat = len(drifts) - len(shown)
        note = f" ({repeat} of them listed above)" if repeat else ""
        out.append([(drift_verdict(drifts, baseline) + note,
                     "bold red" if drifts else "bold green")])
    style = ("bold green" if summary.ok else
             "bold yellow" if summary.code == EXIT_UNSUPPORTED else "bold red")
    out.append([(verdict_line(summary), style)])
    return out
