"""Batch-invariant RMSNorm autograd Functions: the defective original and its fixes.

For a row ``x`` of length ``D`` (the last dim; any number of leading dims)::

    r   = (mean_j x_j^2 + eps) ^ (-1/2)          fixed-order row reduction
    γ   = w + 1 if zero_centered_gamma else w     the effective weight
    y_i = x_i * r * γ_i

    dL/dx_k = g_k γ_k r - (r^3 x_k / D) * s,      s = Σ_i g_i x_i γ_i  (fixed-order)
    dL/dw_i = Σ_rows g_i x_i r                    (summed over every leading dim)

Every variant has Megatron's signature ``apply(x, weight, eps, zero_centered_gamma) -> y``
(``y`` in ``x.dtype``) and computes in ``promote(x.dtype, float32)``, so fp64 stays fp64.
The two historical defects are switched by two flags:

* ``forward_ignores_zcg`` — the forward scales by the raw ``w`` even when
  ``zero_centered_gamma`` asks for ``w + 1`` (the backward still applies the +1);
* ``dx_double_weight`` — the variance term of ``dx`` is multiplied by ``γ_k`` a second
  time: ``- γ_k r^3 x_k s / D``. Exactly zero error while every γ is 1.

Both row reductions (``mean x^2`` forward, ``s`` backward) go through
:func:`~gradcheck_bi.sums.reduction.row_sum`, and ``r`` is ``1 / sqrt(·)`` (both
correctly rounded, so no element's bits depend on which vector lane computed it), which
makes ``y`` and ``dx`` bitwise batch-invariant. ``dw`` sums over rows, so it cannot be
batch-invariant; it is bitwise deterministic run to run.

>>> import torch
>>> x = torch.randn(2, 3, 8, dtype=torch.float64, requires_grad=True)
>>> w = torch.randn(8, dtype=torch.float64, requires_grad=True)
>>> After.apply(x, w, 1e-6, False).sum().backward()
>>> x.grad.shape, w.grad.shape
(torch.Size([2, 3, 8]), torch.Size([8]))
"""

from __future__ import annotations

import math
from typing import Any

import torch

from gradcheck_bi.ops import ROWS
from gradcheck_bi.sums.reduction import resolve_backend, row_sum

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


class KernelInputError(ValueError):
    """The inputs given to a bundled kernel are not valid for RMSNorm."""


def validate_inputs(x: torch.Tensor, weight: torch.Tensor, eps: float) -> None:
    """Raise :class:`KernelInputError` with a one-line reason if RMSNorm cannot run on these."""
    if x.dtype not in SUPPORTED_DTYPES or weight.dtype not in SUPPORTED_DTYPES:
        raise KernelInputError(
            f"x is {x.dtype} and weight is {weight.dtype}; both must be one of "
            "float16, bfloat16, float32, float64"
        )
    if x.dim() < 1 or x.shape[-1] == 0:
        raise KernelInputError(f"x of shape {tuple(x.shape)} has an empty last dimension")
    if weight.shape != (x.shape[-1],):
        raise KernelInputError(
            f"weight of shape {tuple(weight.shape)} does not match the last dim of x "
            f"{tuple(x.shape)}; expected ({x.shape[-1]},)"
        )
    if x.device != weight.device:
        raise KernelInputError(f"x is on {x.device} but weight is on {weight.device}")
    if not math.isfinite(eps) or eps < 0:
        raise KernelInputError(f"eps must be a finite number >= 0, got {eps!r}")


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """``promote(dtype, float32)``: half types compute in fp32, fp64 stays fp64."""
    return torch.promote_types(dtype, torch.float32)


def _effective_weight(w_c: torch.Tensor, zero_centered_gamma: bool) -> torch.Tensor:
    # The offset is applied after the cast, in the compute dtype (w + 1 in bf16 would round).
    return w_c + 1 if zero_centered_gamma else w_c


def _forward(
    x: torch.Tensor, weight: torch.Tensor, eps: float, zcg: bool, ignore_zcg: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    validate_inputs(x, weight, eps)
    cdt = compute_dtype(x.dtype)
    x_c = x.to(cdt)
    w_c = weight.to(cdt)
    add_one = zcg and not ignore_zcg
    if resolve_backend(x_c) == "triton":  # one fused kernel: the same math, fewer passes
        from gradcheck_bi.kernels.bundled import _triton_rmsnorm

        y_c, r = _triton_rmsnorm.rmsnorm_forward(x_c, w_c, eps, add_one)
        return y_c.to(x.dtype), r
    mean_sq = row_sum(x_c * x_c) / x.shape[-1]
    r = 1.0 / torch.sqrt(mean_sq + eps)
    gamma = _effective_weight(w_c, add_one)
    y = x_c * r.unsqueeze(-1)
    y.mul_(gamma)  # (x·r)·γ in place: the same bits as out of place, one allocation fewer
    return y.to(x.dtype), r


def _backward(
    g: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    r: torch.Tensor,
    zcg: bool,
    double_weight: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    cdt = r.dtype
    n_cols = x.shape[-1]
    x_c, g_c = x.to(cdt), g.to(cdt)
    gamma = _effective_weight(weight.to(cdt), zcg)
    r_ = r.unsqueeze(-1)
    s = row_sum(g_c * x_c * gamma).unsqueeze(-1)
    variance_term = (r_ * r_ * r_ * x_c * s) / n_cols
    if double_weight:
        variance_term = gamma * variance_term
    dx = g_c * gamma * r_ - variance_term
    dw = (g_c * x_c * r_).reshape(-1, n_cols).sum(dim=0)
    return dx.to(x.dtype), dw.to(weight.dtype)


def _make_function(name: str, forward_ignores_zcg: bool, dx_double_weight: bool) -> type:
    class _RMSNorm(torch.autograd.Function):
        @staticmethod
        def forward(  # type: ignore[override]
            ctx: Any, x: torch.Tensor, weight: torch.Tensor, eps: float, zcg: bool
        ) -> torch.Tensor:
            y, r = _forward(x, weight, float(eps), bool(zcg), forward_ignores_zcg)
            ctx.save_for_backward(x, weight, r)
            ctx.zcg = bool(zcg)
            return y

        @staticmethod
        def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
            x, weight, r = ctx.saved_tensors
            dx, dw = _backward(g, x, weight, r, ctx.zcg, dx_double_weight)
            return dx, dw, None, None

    _RMSNorm.__name__ = _RMSNorm.__qualname__ = name
    _RMSNorm.__doc__ = (
        f"BI RMSNorm, forward ignores zcg: {forward_ignores_zcg}, "
        f"dx multiplies the variance term by γ twice: {dx_double_weight}."
    )
    return _RMSNorm


Before = _make_function("Before", forward_ignores_zcg=True, dx_double_weight=True)
FixedForward = _make_function("FixedForward", forward_ignores_zcg=False, dx_double_weight=True)
FixedDx = _make_function("FixedDx", forward_ignores_zcg=True, dx_double_weight=False)
After = _make_function("After", forward_ignores_zcg=False, dx_double_weight=False)


def reference_forward(
    x: torch.Tensor, weight: torch.Tensor, eps: float, zero_centered_gamma: bool
) -> torch.Tensor:
    """Independent fp64 reference ``x * rsqrt(mean(x^2) + eps) * γ`` (torch's own sum): the
    ``rms_norm`` op's reference (:mod:`gradcheck_bi.ops`) at the effective weight."""
    x64 = x.detach().to(torch.float64)
    gamma = weight.detach().to(torch.float64) + (1.0 if zero_centered_gamma else 0.0)
    return ROWS["rms_norm"].reference({"x": x64}, {"weight": gamma}, {"eps": eps})["y"]
