"""A correct batch-invariant GEMM with Megatron-Core's signature ``apply(A, B, bias,
out_dtype, layout)``, in plain torch (CPU and CUDA, any float dtype).

Batch-invariant by construction: every product is accumulated one inner index at a time,
elementwise, in a fixed order (a row's bits cannot depend on the other rows); the compute
dtype is ``promote(dtype, fp32)``, rounded once at the end (bf16/fp16 included).

``layout[0] == "T"``: A is stored ``(O, K)``; else ``(K, O)``. ``layout[1] == "T"``: B is
stored ``(K, N)``; else ``(…, K)``, every leading dim a row. ``Y = op(B) @ op(A) + bias``
in ``(…, O)``; the backward is written by hand:
``dA = opᵀ(gᵀ B)``, ``dB = g A`` (in B's layout), ``dbias = Σ_rows g``.
"""

from __future__ import annotations

import torch


def _op_a(A: torch.Tensor, layout: str) -> torch.Tensor:
    """A as (K, O)."""
    return A.t() if layout[0].upper() == "T" else A


def _rows_of_b(B: torch.Tensor, layout: str) -> torch.Tensor:
    """B as (N, K)."""
    return B.t() if layout[1].upper() == "T" else B.reshape(-1, B.shape[-1])


def fixed_order_mm(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``x @ y`` in ``promote(dtype, fp32)``, summed over the inner index in order."""
    wide = torch.promote_types(x.dtype, torch.float32)
    x, y = x.to(wide), y.to(wide)
    out = torch.zeros(x.shape[0], y.shape[1], dtype=wide, device=x.device)
    for i in range(x.shape[1]):
        out += x[:, i:i + 1] * y[i:i + 1, :]
    return out


class GemmFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, A, B, bias, out_dtype, layout):
        a, b = _op_a(A, layout), _rows_of_b(B, layout)
        y = fixed_order_mm(b, a)
        if bias is not None:
            y = y + bias.to(y.dtype)
        lead = (B.shape[1],) if layout[1].upper() == "T" else tuple(B.shape[:-1])
        ctx.layout, ctx.has_bias = layout, bias is not None
        ctx.save_for_backward(A, B)
        y = y.reshape(*lead, y.shape[-1])
        return y.to(out_dtype if out_dtype is not None else B.dtype)

    @staticmethod
    def backward(ctx, grad):
        A, B = ctx.saved_tensors
        layout = ctx.layout
        g = grad.reshape(-1, grad.shape[-1])
        a, b = _op_a(A, layout), _rows_of_b(B, layout)
        d_a = fixed_order_mm(b.t(), g)  # (K, O): a sum over the rows
        d_b = fixed_order_mm(g, a.t())  # (N, K): per row
        dA = d_a.t() if layout[0].upper() == "T" else d_a
        dB = d_b.t() if layout[1].upper() == "T" else d_b.reshape(B.shape)
        dbias = g.to(d_a.dtype).sum(0).to(grad.dtype) if ctx.has_bias else None
        return dA.to(A.dtype), dB.to(B.dtype), dbias, None, None
