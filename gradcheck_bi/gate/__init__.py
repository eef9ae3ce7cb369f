"""The verdict stage: judging measurements, expectations, exit codes, baseline drift.

* :mod:`.judge` — Measurement + expected status → Result; results → exit code;
* :mod:`.expect` — what each point must show (case rules, ``--expect``, declared defects);
* :mod:`.baseline` — a recorded run, and the drift of a new run from it.
"""

from gradcheck_bi.gate.expect import expected
from gradcheck_bi.gate.judge import (
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_UNEXPECTED,
    EXIT_UNSUPPORTED,
    EXIT_USAGE,
    discrimination_ratio,
    exit_code,
    judge,
)

__all__ = [
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_UNEXPECTED",
    "EXIT_UNSUPPORTED",
    "EXIT_USAGE",
    "discrimination_ratio",
    "exit_code",
    "expected",
    "judge",
]
