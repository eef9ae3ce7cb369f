"""The fused finite-difference reduction: one pass over a chunk of perturbed outputs.

For each perturbed row ``m`` (a (column, row) pair of the chunk; its upstream gradient and
unperturbed output are row ``m mod R`` of ``g`` and ``y0``) the kernel reads the ``2·N_LEV``
stencil outputs once, tile by tile, and accumulates in fp64, for each level ``o``,

* with ``ODD``:  ``Σ_i g_i (y_i(+o) - y_i(-o))``
* with ``EVEN``: ``Σ_i g_i ((y_i(-o) - y0_i) + (y_i(+o) - y0_i))``

(each difference taken elementwise in fp64 before the product with ``g``, in the same order
as the torch path), each sum in its own ``(BLOCK_M, BLOCK_D)`` accumulator folded by
``tl.sum`` at the end. The order of every addition depends only on the constexpr block
sizes and ``D``: a row's sums are the same bits in any chunk and any launch, run to run.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gradcheck_bi.sums._triton import launch_kernel
from gradcheck_bi.sums.blocking import block_d

MAX_LEVELS = 3
# Columns per tile: up to six fp64 (BLOCK_M, BLOCK_D) accumulators live in registers, so the
# tile is narrower than the row sum's 1024.
MAX_FD_BLOCK_D = 256


@triton.jit
def _level(y_ptr, offs, ok, stride_p, y0, g, j: tl.constexpr, N_LEV: tl.constexpr):
    plus = tl.load(y_ptr + j * stride_p + offs, mask=ok, other=0.0).to(tl.float64)
    minus = tl.load(y_ptr + (j + N_LEV) * stride_p + offs, mask=ok, other=0.0).to(tl.float64)
    return (plus - minus) * g, ((minus - y0) + (plus - y0)) * g


def _level_sums_kernel(
    y_ptr,
    y0_ptr,
    g_ptr,
    out_ptr,
    n_m,
    n_r,
    n_cols,
    stride_p,
    stride_o,
    N_LEV: tl.constexpr,
    ODD: tl.constexpr,
    EVEN: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    pid = tl.program_id(0)
    rows = pid.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M).to(tl.int64)
    row_ok = rows < n_m
    r_offs = (rows % n_r)[:, None] * n_cols
    cols = tl.arange(0, BLOCK_D)
    odd0 = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float64)
    odd1 = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float64)
    odd2 = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float64)
    even0 = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float64)
    even1 = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float64)
    even2 = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float64)
    for start in range(0, n_cols, BLOCK_D):
        c = start + cols
        ok = row_ok[:, None] & (c[None, :] < n_cols)
        offs = rows[:, None] * n_cols + c[None, :]
        g = tl.load(g_ptr + r_offs + c[None, :], mask=ok, other=0.0)
        y0 = tl.load(y0_ptr + r_offs + c[None, :], mask=ok, other=0.0)
        o, e = _level(y_ptr, offs, ok, stride_p, y0, g, 0, N_LEV)
        odd0 += o
        even0 += e
        if N_LEV >= 2:
            o, e = _level(y_ptr, offs, ok, stride_p, y0, g, 1, N_LEV)
            odd1 += o
            even1 += e
        if N_LEV >= 3:
            o, e = _level(y_ptr, offs, ok, stride_p, y0, g, 2, N_LEV)
            odd2 += o
            even2 += e
    k = 0
    if ODD:
        tl.store(out_ptr + rows, tl.sum(odd0, axis=1), mask=row_ok)
        if N_LEV >= 2:
            tl.store(out_ptr + stride_o + rows, tl.sum(odd1, axis=1), mask=row_ok)
        if N_LEV >= 3:
            tl.store(out_ptr + 2 * stride_o + rows, tl.sum(odd2, axis=1), mask=row_ok)
        k = N_LEV
    if EVEN:
        tl.store(out_ptr + k * stride_o + rows, tl.sum(even0, axis=1), mask=row_ok)
        if N_LEV >= 2:
            tl.store(out_ptr + (k + 1) * stride_o + rows, tl.sum(even1, axis=1), mask=row_ok)
        if N_LEV >= 3:
            tl.store(out_ptr + (k + 2) * stride_o + rows, tl.sum(even2, axis=1), mask=row_ok)


def level_sums(ys: torch.Tensor, y0: torch.Tensor, g: torch.Tensor, odd: bool,
               even: bool, out: torch.Tensor | None = None) -> torch.Tensor:
    """``(odd·L + even·L, *ys.shape[1:-1])`` fp64 sums of ``ys`` ``(2L, ..., R, D)`` with
    ``y0`` and ``g`` of ``(R, D)``; see the module docstring. ``out``, a tensor of that
    shape, receives them (and is returned): written in place where each sum's block is one
    contiguous run (a slice of a larger sums tensor along its first leading dim), else
    copied."""
    n_lev = ys.shape[0] // 2
    if not 1 <= n_lev <= MAX_LEVELS or 2 * n_lev != ys.shape[0] or not (odd or even):
        raise ValueError(f"fused level sums take 1..{MAX_LEVELS} levels (2 points each) and "
                         "odd or even sums")
    n_cols, n_r = ys.shape[-1], g.shape[0]
    ys = ys.contiguous()
    g = g.to(torch.float64).contiguous()
    y0 = y0.to(torch.float64).contiguous()
    n_m = ys[0].numel() // n_cols
    shape = ((odd + even) * n_lev, *ys.shape[1:-1])
    direct = (out is not None and tuple(out.shape) == shape and out.dtype == torch.float64
              and out.device == ys.device and out[0].is_contiguous())
    into = out if direct else torch.empty(shape, dtype=torch.float64, device=ys.device)
    assert into is not None
    launch_kernel(_level_sums_kernel, n_m, ys.is_cuda, ys, y0, g, into, n_m, n_r, n_cols,
                  ys.stride(0), into.stride(0), N_LEV=n_lev, ODD=odd, EVEN=even,
                  BLOCK_D=min(MAX_FD_BLOCK_D, block_d(n_cols)))
    if out is None or direct:
        return into
    return out.copy_(into)
