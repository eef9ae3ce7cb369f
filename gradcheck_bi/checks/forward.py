"""The forward check: ``y`` against an independent fp64 reference with the effective weight γ,
and the training forward (grad enabled) against the checked one (no grad), bitwise.

fp32/fp64 outputs are held to an absolute tolerance (output rounding + a summation bound,
× max|ref|). bf16/fp16 outputs are audited element by element in ulps against the
correctly rounded value of the exact reference (:mod:`gradcheck_bi.lowp`): a max|y|-scaled
tolerance cannot see a one-ulp error on the small elements, and one-ulp errors on a fifth of
the elements are exactly what a mis-placed rounding produces.
"""

from __future__ import annotations

from typing import Any

import torch

from gradcheck_bi import lowp
from gradcheck_bi.checks._measure import bitwise_diff, measured, nonfinite
from gradcheck_bi.inputs import make_inputs
from gradcheck_bi.kernels.call import call_forward
from gradcheck_bi.kernels.layout import lay_out
from gradcheck_bi.kernels.rmsnorm import compute_dtype, reference_forward
from gradcheck_bi.tolerance.half import FRAC_THRESHOLD, MAX_ULP_THRESHOLD, higher_margin
from gradcheck_bi.tolerance.noise import judged_roundoff, unit_roundoff
from gradcheck_bi.tolerance.rules import forward_tolerance, overridden
from gradcheck_bi.vocab import HALF_DTYPES, Config, Measurement

REFERENCE = "fp64 torch, effective weight γ"


def check_forward(fn: Any, cfg: Config) -> Measurement:
    """``y`` vs. ``x · rsqrt(mean(x²) + eps) · γ`` computed independently in fp64.

    Tolerance: :func:`~gradcheck_bi.tolerance.rules.forward_tolerance`. The details
    report the precision the forward delivers (:func:`delivered_precision`). The forward
    that training runs (grad enabled, x and w requiring grad) must give the same ``y``
    bitwise (:func:`training_forward_note`); a difference fails the check. bf16/fp16:
    :func:`check_forward_ulp`.
    """
    x, w, _ = make_inputs(cfg)
    with torch.no_grad():
        y = call_forward(fn, lay_out(x, cfg.layout, "x"), lay_out(w, cfg.layout, "weight"),
                         cfg.eps, cfg.zero_centered_gamma)
    ref = reference_forward(x, w, cfg.eps, cfg.zero_centered_gamma)
    if cfg.dtype in HALF_DTYPES:
        m = check_forward_ulp(y, ref, x, cfg)
        if not m.passed:
            m.message += _in_fp64(fn, x, w, cfg)
        note = training_forward_note(fn, x, w, cfg, y)
        if note:
            m.passed = False
            m.message = "; ".join(p for p in (note, m.message) if p)
        return m
    err = (y.to(torch.float64) - ref).abs()
    scale = float(ref.abs().max())
    working = cfg.working_precision  # a kernel computing coarser inside: judged at that
    tol = forward_tolerance(scale, judged_roundoff(y.dtype, working),
                            judged_roundoff(compute_dtype(x.dtype), working), cfg.shape[-1])
    details = {"reference": REFERENCE, "max_abs_ref": scale,
               **delivered_precision(err, ref, y.dtype)}
    notes = [nonfinite("y", y), training_forward_note(fn, x, w, cfg, y)]
    return measured(err, tol, scale, cfg, notes, details)


def training_forward_note(fn: Any, x: torch.Tensor, w: torch.Tensor, cfg: Config,
                          y: torch.Tensor) -> str:
    """"" when the forward with grad enabled gives ``y`` bitwise, else what differs.

    Every other check measures the forward under ``no_grad`` (or its derivative), while
    training runs it with grad enabled and its backward differentiates *that* forward: a
    kernel that branches on ``requires_grad`` or ``torch.is_grad_enabled()`` would have an
    unchecked training path.
    """
    # Laid out as the no_grad call was: a reduction over a transposed view may legitimately
    # sum in another order than over a contiguous one.
    xr = lay_out(x.detach().clone(), cfg.layout, "x").requires_grad_(True)
    wr = lay_out(w.detach().clone(), cfg.layout, "weight").requires_grad_(True)
    with torch.enable_grad():
        y_train = call_forward(fn, xr, wr, cfg.eps, cfg.zero_centered_gamma).detach()
    n, delta, first = bitwise_diff(y_train, y)
    if n == 0:
        return ""
    at = ",".join(str(i) for i in first or [])
    return (f"forward with grad enabled differs from forward under no_grad in {n} of "
            f"{y.numel()} elements (max |Δ| {delta:.3e}, first at [{at}])")


def delivered_precision(err: torch.Tensor, ref: torch.Tensor,
                        dtype: torch.dtype) -> dict[str, float]:
    """The forward's effective unit roundoff beside its output dtype's.

    ``u_eff = ‖y - ref‖₂ / ‖ref‖₂`` (0 for an all-zero reference): a correctly rounded
    output gives about ``u/√3``; a kernel that computes in a narrower type than its dtype
    (fp32 inside an fp64 kernel) shows ``u_eff`` near that type's ``u``. ``u_eff_ratio`` is
    ``u_eff / u``.
    """
    norm = float(torch.linalg.vector_norm(ref))
    u_eff = float(torch.linalg.vector_norm(err)) / norm if norm > 0 else 0.0
    u = unit_roundoff(dtype)
    return {"u_eff": u_eff, "u_dtype": u, "u_eff_ratio": u_eff / u}


def _in_fp64(fn: Any, x: torch.Tensor, w: torch.Tensor, cfg: Config) -> str:
    """Whether the same kernel's forward is right in fp64 at the same inputs: a formula
    error shows in every precision, a precision error vanishes there."""
    x64, w64 = x.to(torch.float64), w.to(torch.float64)
    try:
        with torch.no_grad():
            y64 = call_forward(fn, x64, w64, cfg.eps, cfg.zero_centered_gamma)
    except Exception:  # only a diagnosis: the verdict stands without it
        return ""
    ref = reference_forward(x64, w64, cfg.eps, cfg.zero_centered_gamma)
    scale = float(ref.abs().max())
    # Right formula: within fp64 rounding plus a margin far below the half-precision ulp
    # (gradcheck_bi.tolerance.half).
    tol = forward_tolerance(scale, unit_roundoff(torch.float64), unit_roundoff(torch.float64),
                            cfg.shape[-1]) + scale * higher_margin(unit_roundoff(x.dtype))
    if bool(((y64 - ref).abs() <= tol).all()):
        return "; in fp64 the same forward is right: a precision choice, not the formula"
    return "; its fp64 forward is wrong too: the formula, not precision"


def check_forward_ulp(y: torch.Tensor, ref: torch.Tensor, x: torch.Tensor,
                      cfg: Config) -> Measurement:
    """The ulp audit of a bf16/fp16 ``y``: the error reported is the max error in ulps, held
    to :data:`~gradcheck_bi.tolerance.half.MAX_ULP_THRESHOLD`; the check also fails when more
    than :data:`~gradcheck_bi.tolerance.half.FRAC_THRESHOLD` of the elements are not correctly
    rounded, or any overflows. The diagnosis (rounding choice, overflow, wrong formula) is the
    message of a failure and ``details["diagnosis"]`` always.

    ``--atol`` / ``--rtol`` switch the verdict back to the absolute error (reported in
    ``details["max_abs_err_abs"]``) against the overridden absolute tolerance.
    """
    audit = lowp.audit(y, ref, x)
    diagnosis = lowp.classify(audit)
    abs_err = float(torch.nan_to_num((y.to(torch.float64) - ref).abs(), nan=float("inf"))
                    .max()) if y.numel() else 0.0
    details = {
        "method": "ulp audit",
        "unit": "ulp",
        "reference": f"{REFERENCE}, correctly rounded to {cfg.dtype}",
        "not_correctly_rounded": audit.frac_not_correctly_rounded,
        "not_correctly_rounded_threshold": FRAC_THRESHOLD,
        "mean_signed_ulp": audit.mean_signed_ulp,
        "overflow": audit.n_overflow,
        "max_abs_err_abs": abs_err,
        "diagnosis": diagnosis,
    }
    if cfg.atol is not None or cfg.rtol is not None:
        scale = float(ref.abs().max())
        tol = overridden(forward_tolerance(scale, unit_roundoff(y.dtype),
                                           unit_roundoff(compute_dtype(x.dtype)),
                                           cfg.shape[-1]), scale, cfg)
        passed = audit.n_overflow == 0 and abs_err <= tol
        details["unit"] = "abs (--atol/--rtol given)"
        return Measurement(abs_err, tol, passed, list(audit.worst_index or []) or None,
                           "" if passed else diagnosis, details)
    passed = lowp.passes(audit)
    return Measurement(audit.max_ulp, MAX_ULP_THRESHOLD, passed,
                       list(audit.worst_index) if audit.worst_index is not None else None,
                       "" if passed else diagnosis, details)
