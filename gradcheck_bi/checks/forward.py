"""The forward check: ``y`` against an independent fp64 reference with the effective weight γ,
and the training forward (grad enabled) against the checked one (no grad), bitwise."""

from __future__ import annotations

from typing import Any

import torch

from gradcheck_bi.checks._measure import bitwise_diff, measured, nonfinite
from gradcheck_bi.checks.tolerance import forward_tolerance
from gradcheck_bi.fd import unit_roundoff
from gradcheck_bi.inputs import make_inputs
from gradcheck_bi.kernels.call import call_forward
from gradcheck_bi.kernels.rmsnorm import compute_dtype, reference_forward
from gradcheck_bi.vocab import Config, Measurement


def check_forward(fn: Any, cfg: Config) -> Measurement:
    """``y`` vs. ``x · rsqrt(mean(x²) + eps) · γ`` computed independently in fp64.

    Tolerance: :func:`~gradcheck_bi.checks.tolerance.forward_tolerance`. The details
    report the precision the forward delivers (:func:`delivered_precision`). The forward
    that training runs (grad enabled, x and w requiring grad) must give the same ``y``
    bitwise (:func:`training_forward_note`); a difference fails the check.
    """
    x, w, _ = make_inputs(cfg)
    with torch.no_grad():
        y = call_forward(fn, x, w, cfg.eps, cfg.zero_centered_gamma)
    ref = reference_forward(x, w, cfg.eps, cfg.zero_centered_gamma)
    err = (y.to(torch.float64) - ref).abs()
    scale = float(ref.abs().max())
    tol = forward_tolerance(scale, unit_roundoff(y.dtype),
                            unit_roundoff(compute_dtype(x.dtype)), cfg.shape[-1])
    details = {"reference": "fp64 torch, effective weight γ", "max_abs_ref": scale,
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
    xr = x.detach().clone().requires_grad_(True)
    wr = w.detach().clone().requires_grad_(True)
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
