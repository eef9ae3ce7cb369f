"""The verdict stage: judging measurements, expectations, exit codes, baseline drift.

* :mod:`.judge` — Measurement + expected status → Result;
* :mod:`.verdict` — results → summary, the verdict sentence, the exit code;
* :mod:`.expect` — what each point must show (case rules, ``--expect``, declared defects);
* :mod:`.baseline` — a recorded run, and the drift of a new run from it.
"""

from gradcheck_bi.gate.expect import expected
from gradcheck_bi.gate.judge import discrimination_ratio, judge, judge_raised
from gradcheck_bi.gate.verdict import (
    EXIT_BISECT_ABORT,
    EXIT_BISECT_SKIP,
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_UNEXPECTED,
    EXIT_UNSUPPORTED,
    EXIT_USAGE,
    Summary,
    exit_code,
    precision_only,
    summarize,
    verdict_line,
)

__all__ = [
    "EXIT_BISECT_ABORT",
    "EXIT_BISECT_SKIP",
    "EXIT_INTERNAL",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_UNEXPECTED",
    "EXIT_UNSUPPORTED",
    "EXIT_USAGE",
    "Summary",
    "discrimination_ratio",
    "exit_code",
    "expected",
    "judge",
    "judge_raised",
    "precision_only",
    "summarize",
    "verdict_line",
]
