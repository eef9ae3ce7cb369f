"""What the compiled one-pass CPU sums (:mod:`._c_fd`, :mod:`._numba_fd`) share: the shape of
their result and the chunks they take, checked alike before either runs."""

from __future__ import annotations

import torch


def result_for(ys: torch.Tensor, odd: bool, even: bool, out: torch.Tensor | None
               ) -> torch.Tensor:
    """``out``, checked (fp64 CPU of ``(odd·L + even·L, *ys.shape[1:-1])``, any strides), or
    a new tensor of that shape; a request for neither odd nor even sums is refused."""
    if not (odd or even):
        raise ValueError("level sums take 2 points per level and odd or even sums")
    shape = ((odd + even) * (ys.shape[0] // 2), *ys.shape[1:-1])
    if out is None:
        return torch.empty(shape, dtype=torch.float64)
    if out.dtype != torch.float64 or tuple(out.shape) != shape or out.device.type != "cpu":
        raise ValueError(f"out must be fp64 CPU of shape {shape}, got {out.dtype} "
                         f"{tuple(out.shape)} on {out.device}")
    return out


def chunk_rows(ys: torch.Tensor, n_rows: int, n_cols: int) -> torch.Tensor:
    """``ys`` ``(2L, ..., R, D)`` as contiguous ``(2L, M, R, D)``, after checking that it is
    fp32 or fp64 on the CPU with two points per level."""
    if ys.dtype not in (torch.float32, torch.float64) or ys.device.type != "cpu":
        raise ValueError(f"compiled level sums take fp32/fp64 CPU outputs, got {ys.dtype} on "
                         f"{ys.device}")
    n_lev = ys.shape[0] // 2
    if n_lev < 1 or 2 * n_lev != ys.shape[0]:
        raise ValueError("level sums take 2 points per level and odd or even sums")
    if tuple(ys.shape[-2:]) != (n_rows, n_cols) or n_cols < 1:
        raise ValueError(f"ys {tuple(ys.shape)} must end in the (rows, D) ({n_rows}, {n_cols}), "
                         "D ≥ 1")
    return ys.detach().contiguous().view(ys.shape[0], -1, n_rows, n_cols)
