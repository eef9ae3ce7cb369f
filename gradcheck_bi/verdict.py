"""Measurements + expectations → verdicts, and verdicts → the contract's exit code.

A :class:`Result` is one row of the contract's JSON: what was checked (kernel, check,
device, dtype, shape, eps, seed, γ control, zero_centered_gamma), what was measured
(``max_abs_err`` against ``tolerance``), the status (``pass | fail | error |
unsupported``), what the kernel declared (``expected``) and whether they agree.

Exit codes: 0 every result as expected; 1 a result not as expected (including errors
raised by a kernel's forward or backward); 3 nothing wrong but something asked for could
not run here. (2, bad usage or input, is decided before anything runs.)
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from gradcheck_bi.checks import Config, Measurement

EXIT_OK = 0
EXIT_UNEXPECTED = 1
EXIT_USAGE = 2
EXIT_UNSUPPORTED = 3
EXIT_INTERRUPTED = 130


@dataclass
class Result:
    """One verdict: a check of one kernel at one configuration."""

    kernel: str
    check: str
    device: str
    dtype: str
    shape: list[int]
    eps: float
    seed: int
    weight: str
    zero_centered_gamma: bool
    max_abs_err: float | None
    tolerance: float | None
    status: str
    expected: str
    as_expected: bool
    message: str = ""
    worst: list[int] | None = None
    input_scale: float = 1.0
    weight_scale: float = 1.0
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for key in ("max_abs_err", "tolerance"):
            v = d[key]
            if isinstance(v, float) and not math.isfinite(v):
                d[key] = str(v)  # JSON has no inf/nan literals
        if not d["message"]:
            del d["message"]
        return d


def judge(
    kernel: str,
    expected: str,
    cfg: Config,
    measurement: Measurement | None = None,
    status: str | None = None,
    message: str = "",
) -> Result:
    """Turn a measurement (or an error/unsupported status) into a :class:`Result`."""
    if measurement is not None:
        status = "pass" if measurement.passed else "fail"
        message = measurement.message
    assert status is not None
    return Result(
        kernel=kernel,
        check=cfg.check,
        device=cfg.device,
        dtype=cfg.dtype,
        shape=list(cfg.shape),
        eps=cfg.eps,
        seed=cfg.seed,
        weight=cfg.weight,
        zero_centered_gamma=cfg.zcg,
        max_abs_err=measurement.max_abs_err if measurement else None,
        tolerance=measurement.tolerance if measurement else None,
        status=status,
        expected=expected,
        as_expected=status == expected,
        message=message,
        worst=measurement.worst if measurement else None,
        input_scale=cfg.input_scale,
        weight_scale=cfg.weight_scale,
        details=measurement.details if measurement else {},
    )


def exit_code(results: list[Result]) -> int:
    """0 all as expected; 1 anything not as expected; 3 only unsupported results remain."""
    if any(not r.as_expected and r.status != "unsupported" for r in results):
        return EXIT_UNEXPECTED
    if any(r.status == "unsupported" for r in results):
        return EXIT_UNSUPPORTED
    return EXIT_OK


def discrimination_ratio(randn_err: float | None, ones_err: float | None) -> float | None:
    """``randn error / ones error``: how far the sensitive control moves past the blind one."""
    if randn_err is None or ones_err is None:
        return None
    if ones_err == 0:
        return math.inf if randn_err > 0 else None
    return randn_err / ones_err
