"""A user's RMSNorm, written independently of gradcheck_bi, and single-defect variants of it.

Loaded by path (``tests/kernels/user_rmsnorm.py:Correct``) the way a team points the CI gate
at its own kernel file. Only torch is imported.

For rows ``x`` of length D: ``r = (Σx²/D + eps)^(-1/2)``, ``γ = w (+1 under zcg)``,
``y = x r γ``; ``dx = g γ r - x r³ (Σ g x γ) / D``; ``dw = Σ_rows g x r``.

Row sums use a pairwise tree of elementwise adds over a zero-padded power-of-two width,
so a row's bits never depend on how many rows share the batch.

Each variant below breaks exactly one thing:

* ``ForwardIgnoresZcg``   the forward scales by the raw w under zcg (backward uses w + 1);
* ``DxDoubleWeight``      the variance term of dx carries γ twice (blind at γ = ones);
* ``DwTimesGamma``        dw carries an extra γ (blind at γ = ones);
* ``Fp32Compute``         computes in fp32 whatever the input dtype (``x.float()``);
* ``HalfCompute``         computes in the input dtype (bf16 inside: correct, but rounded
                          at every step, where a gate asks for fp32 inside);
* ``HalfComputeGradSlip`` HalfCompute whose dx slips by one part in 10³ on a strided
                          cotangent (a layout defect among rounding failures);
* ``NoEpsInBackward``     the backward recomputes r without eps (shows only when Σx²/D ≲ eps);
* ``NotBatchInvariant``   the reduction order depends on the number of rows;
* ``RaisesInBackward``    the backward raises.
"""

from __future__ import annotations

from typing import Any

import torch


def tree_sum(t: torch.Tensor) -> torch.Tensor:
    """Σ over the last dim by pairwise halving: the order depends on D only."""
    d = t.shape[-1]
    width = 1 << max(0, (d - 1).bit_length())
    if width != d:
        t = torch.nn.functional.pad(t, (0, width - d))
    while t.shape[-1] > 1:
        half = t.shape[-1] // 2
        t = t[..., :half] + t[..., half:]
    return t[..., 0]


def _batch_dependent_sum(t: torch.Tensor) -> torch.Tensor:
    # Large batches take torch's own reduction, small ones the tree: a row's bits then
    # depend on the batch size.
    rows = t.numel() // max(1, t.shape[-1])
    return t.sum(-1) if rows > 16 else tree_sum(t)


def _make(name: str, *, ignore_zcg_forward: bool = False, dx_double_weight: bool = False,
          dw_times_gamma: bool = False, fp32: bool = False, no_eps_backward: bool = False,
          batch_dependent: bool = False, raise_in_backward: bool = False, half: bool = False,
          grad_slip: bool = False) -> type:
    reduce = _batch_dependent_sum if batch_dependent else tree_sum

    def compute_dtype(x: torch.Tensor) -> torch.dtype:
        if half:
            return x.dtype
        return torch.float32 if fp32 else torch.promote_types(x.dtype, torch.float32)

    class Fn(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, eps: float,
                    zero_centered_gamma: bool) -> torch.Tensor:
            cdt = compute_dtype(x)
            xc = x.to(cdt)
            d = x.shape[-1]
            r = torch.rsqrt(reduce(xc * xc) / d + eps)
            gamma = weight.to(cdt)
            if zero_centered_gamma and not ignore_zcg_forward:
                gamma = gamma + 1
            ctx.save_for_backward(x, weight, r)
            ctx.zcg, ctx.eps = bool(zero_centered_gamma), float(eps)
            return (xc * r[..., None] * gamma).to(x.dtype)

        @staticmethod
        def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:
            if raise_in_backward:
                raise ValueError("user kernel: backward not implemented for this layout")
            x, weight, r = ctx.saved_tensors
            cdt = r.dtype
            xc, gc = x.to(cdt), g.to(cdt)
            d = x.shape[-1]
            if no_eps_backward:
                r = torch.rsqrt(reduce(xc * xc) / d)
            gamma = weight.to(cdt) + (1 if ctx.zcg else 0)
            r_ = r[..., None]
            s = reduce(gc * xc * gamma)[..., None]
            var = xc * r_ * r_ * r_ * s / d
            if dx_double_weight:
                var = var * gamma
            dx = gc * gamma * r_ - var
            if grad_slip and not g.is_contiguous():
                dx = dx * (1 + 1e-3)
            dw_rows = gc * xc * r_
            if dw_times_gamma:
                dw_rows = dw_rows * gamma
            dw = dw_rows.reshape(-1, d).sum(0)
            return dx.to(x.dtype), dw.to(weight.dtype), None, None

    Fn.__name__ = Fn.__qualname__ = name
    Fn.__doc__ = f"user RMSNorm variant {name}"
    return Fn


Correct = _make("Correct")
ForwardIgnoresZcg = _make("ForwardIgnoresZcg", ignore_zcg_forward=True)
DxDoubleWeight = _make("DxDoubleWeight", dx_double_weight=True)
DwTimesGamma = _make("DwTimesGamma", dw_times_gamma=True)
Fp32Compute = _make("Fp32Compute", fp32=True)
NoEpsInBackward = _make("NoEpsInBackward", no_eps_backward=True)
NotBatchInvariant = _make("NotBatchInvariant", batch_dependent=True)
RaisesInBackward = _make("RaisesInBackward", raise_in_backward=True)
HalfCompute = _make("HalfCompute", half=True)
HalfComputeGradSlip = _make("HalfComputeGradSlip", half=True, grad_slip=True)
NOT_A_FUNCTION = 3
