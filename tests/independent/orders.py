"""Correct RMSNorms that reduce in other legitimate orders than torch.sum's
(docs/summation_orders.md).

Every reduction — the forward's mean square over D, the backward's row dot
``s = Σ_i g_i x_i γ_i`` over D and dw's sum over the rows — runs in one of these orders:

* ``sequential``: strictly left to right, one element at a time (a naive one-program-per-row
  or per-column kernel);
* ``reversed``: strictly right to left; its backward *recomputes* r (in the forward's
  order, so bitwise the forward's r), as a memory-saving kernel does;
* ``blocked``: ``BLOCK = 37`` lanes (a width dividing none of the usual D or N), lane ``j``
  summing elements ``j, j + 37, …`` in sequence, then the lanes in sequence;
* ``atomic``: a fixed random permutation (seed ``SEED``, drawn per length) walked in
  sequence — the order of atomic adds from split work, frozen.

The math is Megatron's (see DESIGN.md): ``r = (Σ x² / D + eps)^(-1/2)``, ``y = x r γ``,
``dx = g γ r − r³ x s / D``, ``dw = Σ_rows g x r``; compute dtype ``promote(x, fp32)``.
A row's bits never depend on the batch (every reduction over D is elementwise across rows),
so these also pass the batch-invariance check.

>>> import torch
>>> t = torch.randn(3, 100, dtype=torch.float64)
>>> all(torch.allclose(ordered_sum(t, o), t.sum(-1)) for o in ORDERS)
True
"""

from __future__ import annotations

import functools
from typing import Any

import torch

ORDERS = ("sequential", "reversed", "blocked", "atomic")
BLOCK = 37
SEED = 1234


@functools.cache
def _permutation(n: int) -> torch.Tensor:
    return torch.randperm(n, generator=torch.Generator().manual_seed(SEED + n))


def ordered_sum(t: torch.Tensor, order: str) -> torch.Tensor:
    """Sum over the last dim in ``order``, accumulating in ``t``'s dtype."""
    n = t.shape[-1]
    if n == 0:
        return t.sum(-1)
    cols = t.movedim(-1, 0).contiguous()  # (n, ...): one contiguous slab per term
    if order == "blocked":
        pad = (-n) % BLOCK
        if pad:
            cols = torch.cat([cols, cols.new_zeros((pad, *cols.shape[1:]))])
        strips = cols.reshape(-1, BLOCK, *cols.shape[1:])
        lanes = strips[0].clone()
        for j in range(1, strips.shape[0]):
            lanes += strips[j]
        total = lanes[0].clone()
        for k in range(1, BLOCK):
            total += lanes[k]
        return total
    index = {"sequential": range(n), "reversed": range(n - 1, -1, -1),
             "atomic": _permutation(n).tolist()}[order]
    it = iter(index)
    total = cols[next(it)].clone()
    for i in it:
        total += cols[i]
    return total


def _rsigma(x: torch.Tensor, eps: float, order: str) -> torch.Tensor:
    return torch.rsqrt(ordered_sum(x * x, order) / x.shape[-1] + eps).unsqueeze(-1)


def make(order: str, dx_scale: float = 1.0, dw_scale: float = 1.0) -> type[torch.autograd.Function]:
    """The autograd Function whose every reduction runs in ``order``; ``dx_scale`` /
    ``dw_scale`` ≠ 1 make it a mutant whose gradient is off by that relative factor."""

    class OrderedRMSNorm(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, eps: float,  # type: ignore[override]
                    zero_centered_gamma: bool) -> torch.Tensor:
            work = torch.promote_types(x.dtype, torch.float32)
            xw = x.to(work)
            gamma = weight.to(work) + (1.0 if zero_centered_gamma else 0.0)
            r = _rsigma(xw, eps, order)
            ctx.save_for_backward(xw, gamma, r)
            ctx.meta = (x.dtype, weight.dtype, eps)
            return (xw * r * gamma).to(x.dtype)

        @staticmethod
        def backward(ctx: Any, grad_y: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
            xw, gamma, r = ctx.saved_tensors
            x_dtype, w_dtype, eps = ctx.meta
            if order == "reversed":  # recompute r (the same order: the same bits)
                r = _rsigma(xw, eps, order)
            d = xw.shape[-1]
            g = grad_y.to(xw.dtype)
            s = ordered_sum(g * xw * gamma, order).unsqueeze(-1)
            dx = g * gamma * r - r * r * r * xw * s / d
            rows = (g * xw * r).reshape(-1, d).T  # (D, rows): dw sums over the last dim
            dw = ordered_sum(rows, order)
            if dx_scale != 1.0:
                dx = dx * dx_scale
            if dw_scale != 1.0:
                dw = dw * dw_scale
            return dx.to(x_dtype), dw.to(w_dtype), None, None

    OrderedRMSNorm.__name__ = OrderedRMSNorm.__qualname__ = f"{order.capitalize()}RMSNorm"
    return OrderedRMSNorm


SequentialRMSNorm = make("sequential")
ReversedRMSNorm = make("reversed")
BlockedRMSNorm = make("blocked")
AtomicRMSNorm = make("atomic")
KERNELS = {"sequential": SequentialRMSNorm, "reversed": ReversedRMSNorm,
           "blocked": BlockedRMSNorm, "atomic": AtomicRMSNorm}
