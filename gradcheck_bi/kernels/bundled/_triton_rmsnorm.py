"""The bundled RMSNorm's forward as one Triton kernel: ``x`` read twice, ``y`` and ``r``
written once.

Its row sum ``Σ x²`` is the fixed-order one (:func:`gradcheck_bi.sums._triton.
blocked_row_sum`), so the fused forward and the torch path sum every row in the same order;
it is compiled on CUDA and run by Triton's interpreter on CPU
(:func:`~gradcheck_bi.sums._triton.launch_kernel`).
"""

from __future__ import annotations

import functools

import torch
import triton.language as tl

from gradcheck_bi.sums._triton import blocked_row_sum, launch_kernel
from gradcheck_bi.sums.blocking import block_d


def _rmsnorm_fwd_kernel(
    x_ptr,
    w_ptr,
    eps_ptr,
    y_ptr,
    r_ptr,
    n_rows,
    n_cols,
    stride_row,
    ADD_ONE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    # Pass 1: Σ x² through the same blocked sum as _row_sum_kernel (a fixed order per row).
    # Pass 2: y = (x · r) · γ. sqrt and the divisions are the correctly rounded ones, like
    # torch's, so every element's bits are independent of where it sits in the launch.
    pid = tl.program_id(0)
    rows = pid.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M).to(tl.int64)
    row_ok = rows < n_rows
    cols = tl.arange(0, BLOCK_D)
    cdt = r_ptr.dtype.element_ty
    total = blocked_row_sum(x_ptr, rows, row_ok, n_cols, stride_row, cdt, True,
                             BLOCK_M, BLOCK_D)
    eps = tl.load(eps_ptr)
    d = tl.full((BLOCK_M,), 0, cdt) + n_cols
    one = tl.full((BLOCK_M,), 1, cdt)
    if cdt == tl.float32:  # fp32 "/" and sqrt are approximate on GPUs: ask for IEEE ones
        r = tl.div_rn(one, tl.sqrt_rn(tl.div_rn(total, d) + eps))
    else:  # fp64 division and sqrt are IEEE already
        r = one / tl.sqrt(total / d + eps)
    tl.store(r_ptr + rows, r, mask=row_ok)
    for start in range(0, n_cols, BLOCK_D):
        c = start + cols
        c_ok = c < n_cols
        ok = row_ok[:, None] & c_ok[None, :]
        offs = rows[:, None] * stride_row + c[None, :]
        tile = tl.load(x_ptr + offs, mask=ok, other=0.0)
        w = tl.load(w_ptr + c, mask=c_ok, other=0.0)
        if ADD_ONE:
            w = w + 1
        tl.store(y_ptr + rows[:, None] * n_cols + c[None, :], (tile * r[:, None]) * w[None, :],
                 mask=ok)


@functools.lru_cache(maxsize=64)
def _eps_tensor(eps: float, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``eps`` as a one-element tensor on ``device``, made once: a fresh one per call was a
    pageable host-to-device copy, and so a stream synchronisation, in every forward."""
    return torch.tensor([eps], dtype=dtype, device=device)


def rmsnorm_forward(
    x_c: torch.Tensor, w_c: torch.Tensor, eps: float, add_one: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused ``y = (x · r) · (w [+ 1])``, ``r = 1/sqrt(mean x² + eps)`` for compute-dtype inputs.

    Returns ``(y, r)`` in ``x_c.dtype`` with ``y`` of ``x_c``'s shape, ``r`` of its leading
    shape.
    """
    n_cols = x_c.shape[-1]
    rows = x_c.reshape(-1, n_cols).contiguous()
    n_rows = rows.shape[0]
    y = torch.empty_like(rows)
    r = torch.empty(n_rows, dtype=x_c.dtype, device=x_c.device)
    eps_t = _eps_tensor(eps, x_c.dtype, x_c.device)
    if n_rows > 0:
        launch_kernel(_rmsnorm_fwd_kernel, n_rows, rows.is_cuda, rows, w_c.contiguous(), eps_t,
                      y, r, n_rows, n_cols, rows.stride(0), ADD_ONE=add_one,
                      BLOCK_D=block_d(n_cols))
    return y.reshape(x_c.shape), r.reshape(x_c.shape[:-1])
