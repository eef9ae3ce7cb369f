"""The forward check: ``y`` against an independent fp64 reference with the effective weight γ."""

from __future__ import annotations

from typing import Any

import torch

from gradcheck_bi.checks._measure import measured, nonfinite
from gradcheck_bi.checks.tolerance import forward_tolerance
from gradcheck_bi.fd import unit_roundoff
from gradcheck_bi.inputs import make_inputs
from gradcheck_bi.kernels.call import call_forward
from gradcheck_bi.kernels.rmsnorm import compute_dtype, reference_forward
from gradcheck_bi.vocab import Config, Measurement


def check_forward(fn: Any, cfg: Config) -> Measurement:
    """``y`` vs. ``x · rsqrt(mean(x²) + eps) · γ`` computed independently in fp64.

    Tolerance: :func:`~gradcheck_bi.checks.tolerance.forward_tolerance`. The details
    report the precision the forward delivers (:func:`delivered_precision`).
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
    return measured(err, tol, scale, cfg, [nonfinite("y", y)], details)


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
