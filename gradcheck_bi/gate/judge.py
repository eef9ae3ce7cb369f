"""A measurement (or an error, or a refusal) + the expected status → a :class:`Result`.

What results add up to — the verdict sentence and the exit code — is
:mod:`gradcheck_bi.gate.verdict`'s.

>>> from gradcheck_bi.vocab import Config, Measurement
>>> r = judge("after", "pass", Config(check="dx"), Measurement(1e-15, 1e-13, True))
>>> r.status, r.as_expected
('pass', True)
"""

from __future__ import annotations

import math
from typing import Any

from gradcheck_bi.checks import tolerance_settings
from gradcheck_bi.kernels.calling.refusal import refusal
from gradcheck_bi.kernels.calling.trace import full_traceback, kernel_frames, located
from gradcheck_bi.ops import SHAPED
from gradcheck_bi.point import public
from gradcheck_bi.vocab import (
    Config,
    ContractViolation,
    Measurement,
    Result,
    Unsupported,
)


def judge(
    kernel: str,
    expected: str,
    cfg: Config,
    measurement: Measurement | None = None,
    status: str | None = None,
    message: str = "",
    details: dict[str, Any] | None = None,
    trace: str = "",
) -> Result:
    """Turn a measurement (or an error/unsupported status, with ``details`` such as the
    kernel's frames and the whole ``trace`` of an error) into a :class:`Result`."""
    if measurement is not None:
        status = "pass" if measurement.passed else "fail"
        message = measurement.message
    assert status is not None
    result = Result(
        kernel=kernel,
        **public(cfg, tolerance_settings(cfg.check)),
        max_abs_err=measurement.max_abs_err if measurement else None,
        tolerance=measurement.tolerance if measurement else None,
        status=status,
        expected=expected,
        as_expected=status == expected,
        message=message,
        worst=measurement.worst if measurement else None,
        details=measurement.details if measurement else dict(details or {}),
        trace=trace,
    )
    if cfg.variant:
        result.variant = dict(cfg.variant)
    result.row_axes = cfg.op not in SHAPED
    return result


def judge_raised(kernel: str, expected: str, cfg: Config, exc: BaseException) -> Result:
    """What a kernel's exception at a point means:

    * :class:`ContractViolation` — a wrong answer (a gradient that is None or of the wrong
      shape, a write into a tensor the kernel does not own): ``fail`` with its message;
    * :class:`Unsupported`, or an explicit refusal of the device or dtype
      (:func:`~gradcheck_bi.checks.probe.refusal`): ``unsupported``;
    * anything else — a crash: ``error`` (exit 1), located at the innermost frame of the
      kernel's own code (``details.traceback``: those frames; the whole traceback kept for
      ``--debug``).
    """
    if isinstance(exc, ContractViolation):
        return judge(kernel, expected, cfg, status="fail", message=str(exc))
    if isinstance(exc, Unsupported):
        return judge(kernel, expected, cfg, status="unsupported", message=str(exc))
    why = refusal(exc)
    if why is not None:
        return judge(kernel, expected, cfg, status="unsupported",
                     message=f"kernel refuses {cfg.device}/{cfg.dtype}: {why}")
    frames = kernel_frames(exc)
    return judge(kernel, expected, cfg, status="error", message=located(exc),
                 details={"traceback": frames} if frames else None,
                 trace=full_traceback(exc))


def discrimination_ratio(randn_err: float | None, ones_err: float | None) -> float | None:
    """``randn error / ones error``: how far the sensitive control moves past the blind one."""
    if randn_err is None or ones_err is None:
        return None
    if ones_err == 0:
        return math.inf if randn_err > 0 else None
    return randn_err / ones_err
