"""Results → GitHub Actions workflow commands (``::error title=…::…``), one per finding.

GitHub shows each as an annotation on the run (and on the kernel's file in the pull
request's diff when the kernel was given as ``PATH.py:ATTR``). The ranked entries of
:mod:`.summary` become errors, unsupported kernels warnings, drift errors, and the verdict
a notice (or an error when the gate fails).

>>> escape_data("50% off\\nnext")
'50%25 off%0Anext'
>>> escape_property("a:b,c")
'a%3Ab%2Cc'
"""

from __future__ import annotations

from collections.abc import Sequence

from gradcheck_bi.gate import EXIT_OK, EXIT_UNSUPPORTED, summarize, verdict_line
from gradcheck_bi.gate.baseline import Drift, drifted_results
from gradcheck_bi.report.summary import failure_line, ranked
from gradcheck_bi.report.tables import short_name
from gradcheck_bi.vocab import Result


def escape_data(text: str) -> str:
    """A message: ``%``, CR and LF escaped as the runner expects."""
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(text: str) -> str:
    """A property value (``title=``, ``file=``): also ``:`` and ``,``."""
    return escape_data(text).replace(":", "%3A").replace(",", "%2C")


def command(kind: str, title: str, message: str, file: str | None = None,
            line: int | None = None) -> str:
    props = ([f"file={escape_property(file)}"] if file else []) + (
        [f"line={line}"] if file and line else []) + [f"title={escape_property(title)}"]
    return f"::{kind} {','.join(props)}::{escape_data(message)}"


def _file(kernel: str) -> str | None:
    """The kernel's source file when it was given by path (for an annotation in the diff)."""
    path, sep, _ = kernel.rpartition(":")
    return path if sep and path.endswith(".py") else None


def _where(r: Result) -> tuple[str | None, int | None]:
    """Where a result's annotation goes: for a kernel that raised, the innermost frame of
    its own code (``details.traceback``: ``path.py:LINE in func``, as its message says);
    otherwise the kernel's file when it was given by path, without a line.

    >>> r = Result("k.py:Fn", "dx", "cpu", "fp64", [2, 8], 1e-6, 0, "randn", False, None,
    ...            None, "error", "pass", False,
    ...            details={"traceback": ["k.py:9 in backward", "helpers.py:4 in scale"]})
    >>> _where(r)
    ('helpers.py', 4)
    """
    for frame in reversed(r.details.get("traceback") or []):
        path, _, line = frame.rsplit(" in ", 1)[0].rpartition(":")
        if path and line.isdigit():
            return path, int(line)
    return _file(r.kernel), None


def to_github(results: list[Result], drifts: list[Drift], verbose: bool = False,
              strict: bool = False, notes: list[str] | None = None,
              unchecked: Sequence[tuple[str, str]] = ()) -> str:
    """One workflow command per ranked failure, unsupported kernel, drift and note of what
    was not run; then the verdict."""
    lines = [command("warning", "gradcheck-bi: not run", note) for note in notes or []]
    for r, group in ranked(results, verbose, strict):
        title = f"gradcheck-bi: {short_name(r.kernel)} {r.check} not as expected"
        lines.append(command("error", title, failure_line(r, group), *_where(r)))
    summary = summarize(results, strict, unchecked, drifted_results(drifts))
    seen: set[tuple[str, str]] = set()
    for r in summary.unsupported:
        if (r.kernel, r.message) not in seen:
            seen.add((r.kernel, r.message))
            lines.append(command("warning", f"gradcheck-bi: {short_name(r.kernel)} unsupported",
                                 f"{r.kernel}: {r.message}", _file(r.kernel)))
    for d in drifts:
        lines.append(command("error", "gradcheck-bi: baseline drift", d.line))
    for kernel, why in unchecked:
        lines.append(command("warning", f"gradcheck-bi: {short_name(kernel)} not checked",
                             f"{kernel}: nothing checked — {why}", _file(kernel)))
    kind = {EXIT_OK: "notice", EXIT_UNSUPPORTED: "warning"}.get(summary.code, "error")
    lines.append(command(kind, "gradcheck-bi verdict", verdict_line(summary)))
    return "\n".join(lines) + "\n"
