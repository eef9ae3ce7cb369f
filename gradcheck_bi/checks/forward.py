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

    Tolerance: :func:`~gradcheck_bi.checks.tolerance.forward_tolerance`.
    """
    x, w, _ = make_inputs(cfg)
    with torch.no_grad():
        y = call_forward(fn, x, w, cfg.eps, cfg.zero_centered_gamma)
    ref = reference_forward(x, w, cfg.eps, cfg.zero_centered_gamma)
    err = (y.to(torch.float64) - ref).abs()
    scale = float(ref.abs().max())
    tol = forward_tolerance(scale, unit_roundoff(y.dtype),
                            unit_roundoff(compute_dtype(x.dtype)), cfg.shape[-1])
    details = {"reference": "fp64 torch, effective weight γ", "max_abs_ref": scale}
    return measured(err, tol, scale, cfg, [nonfinite("y", y)], details)
