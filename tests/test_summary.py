"""The closing block: failures ranked worst first, one per kernel and check, then the verdict."""

from __future__ import annotations

import random

from gradcheck_bi.gate.baseline import Drift, key_of
from gradcheck_bi.report.summary import closing_lines, ranked
from gradcheck_bi.report.text import plain
from gradcheck_bi.vocab import Result


def result(check: str, err: float, tol: float, shape: list[int], scale: float = 1.0,
           expected: str = "pass", status: str = "fail") -> Result:
    return Result("NoEps", check, "cpu", "fp64", shape, 1e-6, 0, "randn", False, err, tol,
                  status, expected, status == expected, worst=[0, 1], input_scale=scale)


def sweep_order(rng: random.Random) -> list[Result]:
    """Many mild failures and one telling one (eps dropped: huge at a tiny input scale)."""
    mild = [result("dx", rng.uniform(1e-9, 1e-8), 1e-11, [rng.randint(2, 9), 256])
            for _ in range(40)]
    telling = result("dx", 5.124e4, 2.5e-11, [3, 4, 64], scale=1e-4)
    dw = [result("dw", rng.uniform(1e-10, 1e-9), 1e-11, [2, 300]) for _ in range(5)]
    passes = [result("forward", 1e-16, 1e-14, [2, 8], status="pass") for _ in range(5)]
    out = mild + dw + passes
    out.insert(rng.randrange(20, 40), telling)  # buried deep, as in sweep order
    return out


def test_the_telling_result_comes_first_with_where_it_happened() -> None:
    results = sweep_order(random.Random(7))
    entries = ranked(results)
    assert [(r.kernel, r.check) for r, _ in entries] == [("NoEps", "dx"), ("NoEps", "dw")]
    worst, group = entries[0]
    assert worst.max_abs_err == 5.124e4 and group == 41
    text = plain(closing_lines(results, []))
    lines = text.rstrip().splitlines()
    marks = [i for i, line in enumerate(lines) if line.startswith("✗ ")]
    assert len(marks) == 2 and marks[0] == 1  # heading, two ranked entries, the verdict
    first = " ".join(" ".join(lines[marks[0]:marks[1]]).split())  # the entry, unwrapped
    for part in ("shape (3, 4, 64)", "fp64", "γ=randn", "zcg=off", "x·0.0001", "γ·1",
                 "5.124e+04", "2.500e-11", "[0,1]", "worst of 41"):
        assert part in first, f"{part!r} not in {first!r}"
    assert lines[-1].startswith("VERDICT: NOT AS EXPECTED — 46 of 51")
    assert max(len(line) for line in lines[:-1]) <= 80, text  # readable in a terminal


def test_verbose_lists_every_failure_worst_first() -> None:
    results = sweep_order(random.Random(3))
    entries = ranked(results, verbose=True)
    assert len(entries) == 46
    ratios = [r.max_abs_err / r.tolerance for r, _ in entries]  # type: ignore[operator]
    assert ratios == sorted(ratios, reverse=True)


def test_errors_rank_above_failures_and_missed_defects_last() -> None:
    crash = result("dx", 0.0, 1e-11, [2, 8], status="error")
    crash.max_abs_err = None
    missed = result("forward", 1e-15, 1e-14, [2, 8], expected="fail", status="pass")
    big = result("dw", 1.0, 1e-11, [2, 8])
    assert [r.check for r, _ in ranked([missed, big, crash])] == ["dx", "dw", "forward"]


def test_drift_lines_do_not_repeat_the_failures_listed() -> None:
    failing = result("dx", 1.0, 1e-11, [2, 8])
    grew = result("dw", 1e-12, 1e-11, [2, 8], status="pass")
    drifts = [Drift(key_of(failing), "status changed", "drift: dx status pass → fail"),
              Drift(key_of(grew), "error grew", "drift: dw error grew 100×")]
    text = plain(closing_lines([failing, grew], drifts, "b.json"))
    assert "drift: dw error grew" in text and "drift: dx status" not in text
    assert "BASELINE: 2 results drifted from b.json (1 of them listed above)" in text
    assert "drift: dx status" in plain(closing_lines([failing, grew], drifts, "b.json",
                                                     verbose=True))


def test_verdict_counts_are_grammatical() -> None:
    from gradcheck_bi.gate import summarize, verdict_line

    one = [result("dx", 1.0, 1e-11, [2, 8], expected="fail"),
           result("dx", 1e-12, 1e-11, [2, 8], status="pass")]
    assert verdict_line(summarize(one)) == (
        "VERDICT: all 2 results as expected: 1 shows a declared defect, every other result "
        "passes")
    assert verdict_line(summarize(one[1:])).endswith("as expected: every result passes")


def test_rounding_failures_rank_below_a_layout_defect_and_are_counted_apart() -> None:
    """A kernel that computes in bf16 fails on rounding by hundreds of tolerances; the one
    layout defect, a few tolerances out, must still lead, and the verdict counts them apart."""
    rounding = [result("dx", 900.0 + i, 1.0, [3, 300]) for i in range(6)]
    for r in rounding:
        r.dtype, r.details = "bf16", {"cause": "precision"}
    layout = result("dx", 3.0, 1.0, [2, 3, 40])
    layout.layout = "grad-strided"
    entries = ranked([*rounding, layout])
    assert [(r.layout, n) for r, n in entries] == [("grad-strided", 1), ("contiguous", 6)]
    lines = plain(closing_lines([*rounding, layout], [])).rstrip().splitlines()
    assert "worst of 6 in dx, rounding only" in " ".join(" ".join(lines).split())
    assert lines[-1].endswith("7 of 7 results differ from what the kernels declare: 1 "
                              "formula, layout or other, 6 rounding only (right in a higher "
                              "precision)")
