"""A random direction's finite-difference level in one pass over the tensor (Triton).

A direction is ``t = a bᵀ`` (rows by columns, never formed); level ``o`` with step ``h``
perturbs the point's tensor to ``x₊ = x + v a bᵀ`` and then ``x₋ = x − v a bᵀ`` (``v = o h``),
each computed in fp64 and rounded once to the tensor's dtype. Per element ``(r, c)``::

    write:    x_rc ← fl(x⁰_rc + (v a_r) b_c)
    project:  x_rc ← fl(x⁰_rc − (v a_r) b_c)   and   P_r = Σ_c d_rc (x₊_rc − x₋_rc)

with ``x₊`` recomputed where ``x₋`` is written (the same expression, the same bits), the
difference taken in fp64 (exact for an fp32 tensor) and ``P_r`` summed in fp64 per row,
``BLOCK_D`` columns at a time. What the torch path does in five passes over the tensor
(two writes, an fp64 step buffer copied and subtracted, a dot: 64 bytes an fp32 element)
takes two here: 8 bytes an element to write ``x₊``, 16 to write ``x₋`` and project (the
fp64 gradient read once). ``(v a_r)`` is formed on the host side, as torch's
``addcmul(x, a, b, value=v)`` forms ``v · a_r`` first.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gradcheck_bi.sums._triton import launch_kernel
from gradcheck_bi.sums.blocking import block_d

# Columns per tile: one fp64 (BLOCK_M, BLOCK_D) accumulator and three operand tiles.
MAX_BLOCK_D = 256


@triton.jit
def _moved(x0, va, b, out_dtype: tl.constexpr):
    """``fl(x0 + va bᵀ)`` over a tile: the product and the sum in fp64, one rounding."""
    return (x0 + va[:, None] * b[None, :]).to(out_dtype)


def _level_kernel(
    x0_ptr,
    va_ptr,
    b_ptr,
    x_ptr,
    d_ptr,
    out_ptr,
    n_rows,
    n_cols,
    PROJECT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    pid = tl.program_id(0)
    rows = pid.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M).to(tl.int64)
    row_ok = rows < n_rows
    va = tl.load(va_ptr + rows, mask=row_ok, other=0.0).to(tl.float64)
    cols = tl.arange(0, BLOCK_D)
    acc = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float64)
    for start in range(0, n_cols, BLOCK_D):
        c = start + cols
        ok = row_ok[:, None] & (c[None, :] < n_cols)
        offs = rows[:, None] * n_cols + c[None, :]
        b = tl.load(b_ptr + c, mask=c < n_cols, other=0.0).to(tl.float64)
        x0 = tl.load(x0_ptr + offs, mask=ok, other=0.0).to(tl.float64)
        plus = _moved(x0, va, b, x_ptr.dtype.element_ty)
        if PROJECT:
            minus = _moved(x0, -va, b, x_ptr.dtype.element_ty)
            tl.store(x_ptr + offs, minus, mask=ok)
            d = tl.load(d_ptr + offs, mask=ok, other=0.0).to(tl.float64)
            acc += d * (plus.to(tl.float64) - minus.to(tl.float64))
        else:
            tl.store(x_ptr + offs, plus, mask=ok)
    if PROJECT:
        tl.store(out_ptr + rows, tl.sum(acc, axis=1), mask=row_ok)


def level(x0: torch.Tensor, va: torch.Tensor, b: torch.Tensor, x: torch.Tensor,
          d: torch.Tensor | None = None) -> torch.Tensor | None:
    """Write ``x₊ = fl(x0 + va bᵀ)`` into ``x`` or, given ``d`` (fp64, ``x``'s shape), write
    ``x₋ = fl(x0 − va bᵀ)`` and return ``Σ d (x₊ − x₋)`` (a 0-d fp64 tensor, on the device).
    ``x0``, ``x``, ``d`` contiguous, the last axis the columns; ``va`` (fp64, one per row)
    and ``b`` (fp64, one per column) contiguous."""
    n_cols = x.shape[-1]
    n_rows = x.numel() // n_cols
    out = torch.empty(n_rows if d is not None else 1, dtype=torch.float64, device=x.device)
    launch_kernel(_level_kernel, n_rows, x.is_cuda, x0, va, b, x,
                  d if d is not None else out, out, n_rows, n_cols, PROJECT=d is not None,
                  BLOCK_D=min(MAX_BLOCK_D, block_d(n_cols)))
    return out.sum() if d is not None else None
