"""Measurements + expectations → verdicts, and verdicts → the contract's exit code.

Exit codes: 0 every result as expected; 1 a result not as expected (including ``error``:
a kernel that raised anything but an explicit refusal; drift from a baseline; and, under
``strict``, any ``unsupported``); 2 bad usage or input (decided before anything runs); 3
nothing wrong found but something asked for could not run here (``unsupported``: no GPU, a
kernel that explicitly refuses the device or dtype).

>>> from gradcheck_bi.vocab import Config, Measurement
>>> r = judge("after", "pass", Config(check="dx"), Measurement(1e-15, 1e-13, True))
>>> r.status, r.as_expected, exit_code([r])
('pass', True, 0)
"""

from __future__ import annotations

import math

from gradcheck_bi.checks import tolerance_settings
from gradcheck_bi.vocab import Config, Measurement, Result

EXIT_OK = 0
EXIT_UNEXPECTED = 1
EXIT_USAGE = 2
EXIT_UNSUPPORTED = 3
EXIT_INTERRUPTED = 130


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
        weight=cfg.control,
        zero_centered_gamma=cfg.zero_centered_gamma,
        max_abs_err=measurement.max_abs_err if measurement else None,
        tolerance=measurement.tolerance if measurement else None,
        status=status,
        expected=expected,
        as_expected=status == expected,
        message=message,
        worst=measurement.worst if measurement else None,
        input_scale=cfg.input_scale,
        weight_scale=cfg.weight_scale,
        **tolerance_settings(cfg),
        details=measurement.details if measurement else {},
    )


def exit_code(results: list[Result], drifted: bool = False, strict: bool = False) -> int:
    """0 all as expected; 1 anything not as expected (or ``drifted``, or any unsupported
    when ``strict``: a CI job that must run everything); 3 nothing wrong but unsupported."""
    if drifted or any(not r.as_expected and r.status != "unsupported" for r in results):
        return EXIT_UNEXPECTED
    if any(r.status == "unsupported" for r in results):
        return EXIT_UNEXPECTED if strict else EXIT_UNSUPPORTED
    return EXIT_OK


def discrimination_ratio(randn_err: float | None, ones_err: float | None) -> float | None:
    """``randn error / ones error``: how far the sensitive control moves past the blind one."""
    if randn_err is None or ones_err is None:
        return None
    if ones_err == 0:
        return math.inf if randn_err > 0 else None
    return randn_err / ones_err
