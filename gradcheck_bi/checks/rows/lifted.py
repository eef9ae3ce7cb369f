"""bf16/fp16 gradients of every op, lifted (:mod:`.lift`: the judge, the lift choice and
the diagnosis).

The kernel's half-precision ``d<name>`` (every input and parameter: ``dx``, ``dresidual``,
``dz``, ``dw``, ``dbias``; random cotangents on every output) is compared, element by
element, with finite differences of **its own forward** run in fp64 (else fp32) at exactly
the inputs, parameters and cotangents its backward saw (:func:`lifted_point`), against::

    tol_i = ½ ulp_out(R_i) + u_fp32 · K_OPS · M_i
          + K_SIGMA · sqrt(σ_fd,i² + (u_fp32 σ_k,i)²) + K_TRUNC · T_i

``σ_fd``, ``T``: the lifted estimate's noise and truncation (:mod:`.gradients`); ``σ_k``:
the op's rounding model (:func:`gradcheck_bi.tolerance.rows.
kernel_sigma`; parameters: RMSNorm's ``dw`` model on the terms ``g ∂y/∂p`` the forward
makes); ``M``: the magnitude of the terms (:func:`gradcheck_bi.tolerance.rows.
kernel_magnitude`; parameters ``Σ_rows |terms|``). The formula:
:func:`gradcheck_bi.tolerance.half.lifted_tolerance`. A kernel
that refuses fp64 and fp32 is compared with the exact gradients (autograd through the fp64
reference).

The fused add has two correct references: ``y`` normalises ``s = x + residual`` as
computed, or as stored — ``residual_out`` rounded once to the output dtype, which Liger and
vLLM normalise and save for the backward. A gradient that fails against the first is
lifted again at ``x := round(s)``, ``residual := 0`` (the kernel's forward sees the stored
``s``); it passes if it matches that one (``details["s"]`` says which).
"""

from __future__ import annotations

from typing import Any

import torch

from gradcheck_bi.checks.rows.forward import inaccuracy
from gradcheck_bi.checks.rows.gradients import estimate
from gradcheck_bi.checks.rows.lift import (
    Lift,
    fd_extra,
    first_lift,
    higher_verdict,
    judge_lifted,
)
from gradcheck_bi.checks.rows.point import (
    ExactGrads,
    OpPoint,
    exact_grads,
    lifted_point,
    make_point,
    reference,
    returns_y_alone,
    stored,
)
from gradcheck_bi.kernels.calling.opcall import op_grads
from gradcheck_bi.tolerance.half import U_COMPUTE
from gradcheck_bi.tolerance.rows import kernel_magnitude, kernel_sigma
from gradcheck_bi.tolerance.summation import combined_floor, dw_sigma
from gradcheck_bi.vocab import Config, Measurement, Unsupported

Tensors = dict[str, torch.Tensor]


def param_terms(point: OpPoint, name: str) -> torch.Tensor:
    """``g ∂y/∂p`` per row, ``(R, D)`` fp64, from the reference (``y`` is linear in γ and
    β): the terms of a parameter's gradient where no finite difference measured them."""
    eff, y = point.effective, point.op.outputs[0]  # the output the parameters reach
    d = point.lead.shape[-1]
    y0 = reference(point)[y]
    y1 = point.op.reference(point.inputs64, {**eff, name: eff[name] + 1.0},
                            point.options)[y]
    return (point.cotangents[y].to(torch.float64) * (y1 - y0)).reshape(-1, d)


def _against(fn: Any, cfg: Config, point: OpPoint, name: str, returned: list[str],
             analytic: torch.Tensor) -> Measurement:
    """The kernel's ``analytic`` gradient against the lifted differences at ``point``."""
    is_input = name in point.op.inputs
    lift: Lift = first_lift(lambda dt: inaccuracy(fn, lifted_point(point, dt)))
    extra: dict[str, Any] = {"outputs": returned, **returns_y_alone(point, returned)}
    if lift.dtype is None:
        ref = exact_grads(point, tuple(returned))[name]
        if is_input:
            sigma_k = kernel_sigma(point, name, ExactGrads(point))
            magnitude = kernel_magnitude(point, name)
        else:
            terms = param_terms(point, name)
            sigma_k, magnitude = dw_sigma(terms), terms.abs().sum(0)
        zero = torch.zeros_like(ref)
        floor = combined_floor(zero, zero, U_COMPUTE * sigma_k)
        return judge_lifted(analytic, ref, floor, magnitude, lift, cfg, cfg.check, extra)
    lp = lifted_point(point, lift.dtype)
    est = estimate(fn, lp, name, returned, cfg)
    if is_input:
        sigma_k = kernel_sigma(point, name, ExactGrads(point))
        magnitude = kernel_magnitude(point, name)
    else:  # the forward's own terms g·∂y/∂p, summed over the rows (RMSNorm's dw model)
        assert est.terms is not None
        sigma_k, magnitude = dw_sigma(est.terms), est.terms.abs().sum(0)
    assert est.sigma is not None and est.truncation is not None
    floor = combined_floor(est.sigma, est.truncation, U_COMPUTE * sigma_k)

    def higher() -> str | None:
        try:
            _, grads = op_grads(fn, lp.inputs, lp.params, lp.cotangents, lp.options, lp.zcg)
        except Exception:  # only a diagnosis: the verdict stands without it
            return None
        return higher_verdict(grads[name], est.grad, floor, magnitude, cfg.torch_dtype,
                              lp.lead.dtype)

    return judge_lifted(analytic, est.grad, floor, magnitude, lift, cfg, cfg.check,
                        {**fd_extra(est), **extra}, higher)


def check_op_gradient_lifted(fn: Any, cfg: Config) -> Measurement:
    """``cfg.check`` of ``cfg.op`` in bf16/fp16, against the kernel's own forward lifted to
    fp64 / fp32 (see the module)."""
    if cfg.mode != "full":
        raise Unsupported(
            f"the {cfg.dtype} gradient check compares every element with a lifted reference; "
            "--mode directional is for fp32/fp64")
    point = make_point(cfg)
    name = point.op.gradient_checks[cfg.check]
    outs, grads = op_grads(fn, point.inputs, point.params, point.cotangents, point.options,
                           point.zcg)
    returned, analytic = list(outs), grads[name]
    m = _against(fn, cfg, point, name, returned, analytic)
    kept = point.op.stored
    if kept is not None:  # the fused add: s as computed, else as stored
        m.details[kept.key] = kept.computed
        if not m.passed:
            again = _against(fn, cfg, stored(point), name, returned, analytic)
            if again.passed:
                again.details[kept.key] = f"{kept.label} (rounded to {cfg.dtype})"
                return again
    return m


__all__ = ["check_op_gradient_lifted", "param_terms"]
