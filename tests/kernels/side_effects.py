"""RMSNorm Functions whose numbers are right on fresh tensors but which break the contract
around them: they write into tensors they do not own, or return no gradient / one of the
wrong shape. Each must fail (never pass, never be an ``error``) in a default fp64 CPU run.

``Correct`` is the same math with none of that; ``InPlaceDeclared`` writes dx into its
grad_output by design (as Liger's ``in_place=True`` does) and passes when declared.
"""

from __future__ import annotations

from typing import Any

import torch


def _forward(x: torch.Tensor, w: torch.Tensor, eps: float, zcg: bool
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gamma = w + 1 if zcg else w
    r = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return x * r * gamma, r, gamma


def _grads(x: torch.Tensor, g: torch.Tensor, r: torch.Tensor, gamma: torch.Tensor
           ) -> tuple[torch.Tensor, torch.Tensor]:
    s = (g * x * gamma).sum(-1, keepdim=True)
    dx = g * gamma * r - r.pow(3) * x * s / x.shape[-1]
    dw = (g * x * r).reshape(-1, x.shape[-1]).sum(0)
    return dx, dw


class Correct(torch.autograd.Function):
    """The same math with every contract kept: the twin the others are measured against."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor,  # type: ignore[override]
                eps: float, zero_centered_gamma: bool) -> torch.Tensor:
        y, r, gamma = _forward(x, weight, eps, zero_centered_gamma)
        ctx.save_for_backward(x, r, gamma)
        return y

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        x, r, gamma = ctx.saved_tensors
        dx, dw = _grads(x, g, r, gamma)
        return dx, dw, None, None


class BackwardWritesGradOutput(Correct):
    """dx computed into the cotangent's memory: a caller that reuses grad_output breaks."""

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        x, r, gamma = ctx.saved_tensors
        dx, dw = _grads(x, g, r, gamma)
        g.copy_(dx)
        return g, dw, None, None


class InPlaceDeclared(BackwardWritesGradOutput):
    """The same write, declared (``--allow-mutation grad_output``): a note, not a failure."""


class ForwardWritesX(Correct):
    """The forward normalises x in place (the numbers it returns are right)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor,  # type: ignore[override]
                eps: float, zero_centered_gamma: bool) -> torch.Tensor:
        y, r, gamma = _forward(x, weight, eps, zero_centered_gamma)
        ctx.save_for_backward(x.clone(), r, gamma)
        x.mul_(r)
        return y


class BackwardWritesWeight(Correct):
    """The backward adds its dw into the weight (an optimiser step fused where it must not)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor,  # type: ignore[override]
                eps: float, zero_centered_gamma: bool) -> torch.Tensor:
        ctx.weight = weight
        return Correct.forward(ctx, x, weight, eps, zero_centered_gamma)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        x, r, gamma = ctx.saved_tensors
        dx, dw = _grads(x, g, r, gamma)
        with torch.no_grad():
            ctx.weight.sub_(1e-3 * dw)
        return dx, dw, None, None


class NoWeightGradient(Correct):
    """dw returned as None while the weight requires grad."""

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        x, r, gamma = ctx.saved_tensors
        dx, _ = _grads(x, g, r, gamma)
        return dx, None, None, None


class ColumnWeightGradient(Correct):
    """dw returned as a (D, 1) column (a keepdim slip). A per-row (rows, D) dw would not do:
    autograd sums a gradient that broadcasts to the input's shape, so that one is right."""

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        x, r, gamma = ctx.saved_tensors
        dx, dw = _grads(x, g, r, gamma)
        return dx, dw.unsqueeze(-1), None, None


def _as_if_contiguous(t: torch.Tensor) -> torch.Tensor:
    """What a kernel that takes a data pointer and assumes row-major strides reads."""
    strides, step = [], 1
    for size in reversed(t.shape):
        strides.insert(0, step)
        step *= size
    return torch.as_strided(t, t.shape, strides, t.storage_offset())


class ReadsGradAsContiguous(Correct):
    """The backward reads grad_output through its data pointer as if it were contiguous
    (right on fresh tensors; garbage on a strided or transposed cotangent)."""

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        x, r, gamma = ctx.saved_tensors
        dx, dw = _grads(x, _as_if_contiguous(g), r, gamma)
        return dx, dw, None, None


class ReadsXAsContiguous(Correct):
    """The forward reads x through its data pointer as if it were contiguous."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor,  # type: ignore[override]
                eps: float, zero_centered_gamma: bool) -> torch.Tensor:
        return Correct.forward(ctx, _as_if_contiguous(x), weight, eps, zero_centered_gamma)


class AssumesTwoDims(Correct):
    """dw reduced over the first dim only, as a kernel written for 2-D (rows, D) inputs
    does with ``grid = x.shape[0]``: a 3-D or 4-D input loses every row past the first
    slice of each leading index."""

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        x, r, gamma = ctx.saved_tensors
        dx, _ = _grads(x, g, r, gamma)
        rows = x.shape[0]
        dw = (g * x * r).reshape(-1, x.shape[-1])[:rows].sum(0)
        return dx, dw, None, None
