"""Results → what they add up to: the summary, the verdict sentence and the exit code.

One place decides, for the API, the tables, JUnit, GitHub output and the CLI:

* **0** every result as expected;
* **1** a result not as expected (a defect where none was declared, a declared defect
  missed, a kernel that raised: ``error``), or drift from a baseline; with ``strict`` also
  any ``unsupported`` and a run that checked nothing;
* **3** nothing wrong found, but something asked for could not run here (``unsupported``),
  or **nothing was checked** — a run with 0 results, or a kernel every requested point of
  which was dropped (``--zcg on`` for a kernel without zero_centered_gamma). A gate that
  checked nothing must never pass.

(2 bad usage and 4 an internal error are decided before or outside the results; 125 and
255 are what ``--bisect`` makes of 3 and 4.)

>>> from gradcheck_bi.vocab import Result
>>> ok = Result("after", "dx", "cpu", "fp64", [2, 8], 1e-6, 0, "randn", False, 1e-15, 1e-13,
...             "pass", "pass", True)
>>> summarize([ok]).code, summarize([]).code, summarize([], strict=True).code
(0, 3, 1)
>>> verdict_line(summarize([], unchecked=[("Mine", "zcg=on results not run")]))
'VERDICT: NOTHING CHECKED (could not judge) — 1 kernel ran no point: Mine (zcg=on results not run)'
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from gradcheck_bi.vocab import Result

EXIT_OK = 0
EXIT_UNEXPECTED = 1
EXIT_USAGE = 2
EXIT_UNSUPPORTED = 3
EXIT_INTERNAL = 4
EXIT_INTERRUPTED = 130
# `git bisect run` reads 125 as "skip this commit" and anything above 127 as "stop".
EXIT_BISECT_SKIP = 125
EXIT_BISECT_ABORT = 255


@dataclass
class Summary:
    """Counts and lists behind a verdict."""

    total: int
    as_expected: int
    unexpected: list[Result]
    unsupported: list[Result]
    defects_found: int
    strict: bool = False  # --strict: unsupported and nothing checked are not as expected
    # (kernel, why) for each kernel that ran no point at all ("zcg=on results not run …").
    unchecked: list[tuple[str, str]] = field(default_factory=list)
    drifted: int = 0  # results (not lines) that drifted from the baseline

    @property
    def nothing_checked(self) -> bool:
        return self.total == 0 or bool(self.unchecked)

    @property
    def ok(self) -> bool:
        return self.code == EXIT_OK

    @property
    def code(self) -> int:
        """The contract's exit code for these results (see the module docstring)."""
        if self.unexpected or self.drifted:
            return EXIT_UNEXPECTED
        if self.unsupported or self.nothing_checked:
            return EXIT_UNEXPECTED if self.strict else EXIT_UNSUPPORTED
        return EXIT_OK


def summarize(results: Sequence[Result], strict: bool = False,
              unchecked: Sequence[tuple[str, str]] = (), drifted: int = 0) -> Summary:
    unexpected = [r for r in results if not r.as_expected and r.status != "unsupported"]
    unsupported = [r for r in results if r.status == "unsupported"]
    found = sum(1 for r in results if r.expected == "fail" and r.status == "fail")
    return Summary(len(results), sum(r.as_expected for r in results), unexpected,
                   unsupported, found, strict, list(unchecked), drifted)


def exit_code(results: Sequence[Result], drifted: bool | int = False, strict: bool = False,
              unchecked: Sequence[tuple[str, str]] = ()) -> int:
    """0 all as expected; 1 anything not as expected (or ``drifted``, or, when ``strict``,
    anything unsupported or unchecked); 3 nothing wrong but unsupported or nothing checked."""
    return summarize(results, strict, unchecked, int(drifted)).code


def precision_only(r: Result) -> bool:
    """Whether ``r`` failed on rounding alone: a bf16/fp16 result whose check found the
    kernel right in a higher precision at the same inputs and layout (``details["cause"]``:
    the forward audit's fp64 run, the lifted gradient's own backward). Such a kernel rounds
    in the half dtype where the gate demands fp32 inside; a formula or a layout defect
    (wrong in fp64 too) outranks it.
    """
    return r.status == "fail" and r.details.get("cause") == "precision"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def verdict_line(s: Summary) -> str:
    """The closing sentence of every report: the reason for its exit code, first reason first."""
    drift = (f"{_plural(s.drifted, 'result')} drifted from the baseline" if s.drifted else "")
    if s.unexpected:
        errors = sum(r.status == "error" for r in s.unexpected)
        raised = f" ({errors} raised an error)" if errors else ""
        rounding = sum(precision_only(r) for r in s.unexpected)
        apart = (f": {len(s.unexpected) - rounding} formula, layout or other, {rounding} "
                 "rounding only (right in a higher precision)" if rounding else "")
        return (f"VERDICT: NOT AS EXPECTED — {len(s.unexpected)} of {s.total} results differ "
                f"from what the kernels declare{raised}{apart}" + (f"; {drift}" if drift else ""))
    if s.drifted:
        return (f"VERDICT: BASELINE DRIFT — {s.drifted} of {s.total} results drifted from the "
                "baseline; every result is otherwise as expected")
    if s.nothing_checked:
        why = (f"{_plural(len(s.unchecked), 'kernel')} ran no point: " + "; ".join(
            f"{kernel} ({why})" for kernel, why in s.unchecked)
               if s.unchecked else "0 results: no point of the sweep ran")
        others = f" ({s.as_expected} of {s.total} other results as expected)" if s.total else ""
        head = "NOT AS EXPECTED (--strict), NOTHING CHECKED" if s.strict else \
            "NOTHING CHECKED (could not judge)"
        return f"VERDICT: {head} — {why}{others}"
    if s.unsupported and s.strict:
        return (f"VERDICT: NOT AS EXPECTED (--strict) — {len(s.unsupported)} of {s.total} "
                f"results could not run here (unsupported)")
    if s.unsupported:
        return (f"VERDICT: nothing wrong found, but {len(s.unsupported)} of {s.total} results "
                f"could not run here (unsupported)")
    n = s.defects_found
    if not n:
        return f"VERDICT: all {s.total} results as expected: every result passes"
    shows = "1 shows" if n == 1 else f"{n} show"
    return (f"VERDICT: all {s.total} results as expected: {shows} a declared defect, every "
            f"other result passes")
