"""What the norm ops share: the fp64 normalisation, groups of the last axis, the gate.

Over the last axis of size D (or each group of G consecutive features): ``rms(v) = v ·
(mean v² + eps)^(-1/2)``; the gate's activation ``silu(z) = z · σ(z)``, ``silu'(z) = σ(1 +
z(1 − σ))``, or ``σ(z)``, ``σ'(z) = σ(1 − σ)`` (:data:`GATES`).

>>> import torch
>>> rms(torch.tensor([[3.0, 4.0]], dtype=torch.float64), 0.0)
tensor([[0.8485, 1.1314]], dtype=torch.float64)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch


def rms(v: torch.Tensor, eps: float) -> torch.Tensor:
    """``v · (mean v² + eps)^(-1/2)`` over the last axis."""
    return v * torch.rsqrt(v.pow(2).mean(dim=-1, keepdim=True) + eps)


def grouped(v: torch.Tensor, group_size: int | None) -> torch.Tensor:
    """``v`` with its last axis cut into groups: ``(..., D / G, G)``."""
    d = v.shape[-1]
    g = d if group_size is None else int(group_size)
    if g <= 0 or d % g:
        raise ValueError(f"group_size {group_size} does not divide the last dim {d}")
    return v.reshape(*v.shape[:-1], d // g, g)


def normed(v: torch.Tensor, eps: float, group: int | None) -> torch.Tensor:
    """:func:`rms` over each group of the last axis."""
    vg = grouped(v, group)
    return (vg * torch.rsqrt((vg * vg).mean(-1, keepdim=True) + eps)).reshape(v.shape)


def row_length(v: torch.Tensor, eps: float) -> torch.Tensor:
    """``sqrt(Σ v² + n·eps)`` over the last axis: the length over which ``rms(v)`` bends."""
    return torch.sqrt((v * v).sum(-1) + v.shape[-1] * eps)


def silu_grad(z: torch.Tensor) -> torch.Tensor:
    sig = torch.sigmoid(z)
    return sig * (1 + z * (1 - sig))


def silu_grad_size(z: torch.Tensor) -> torch.Tensor:
    """``σ(1 + |z| (1 − σ))``: the size of the terms of ``silu'(z) = σ(1 + z(1 − σ))``, which
    its rounding is relative to (``silu'`` itself cancels to 0 near ``z = −1.28``)."""
    sig = torch.sigmoid(z)
    return sig * (1 + z.abs() * (1 - sig))


def sigmoid_grad(z: torch.Tensor) -> torch.Tensor:
    sig = torch.sigmoid(z)
    return sig * (1 - sig)


def sigmoid_grad_size(z: torch.Tensor) -> torch.Tensor:
    """``σ``: the size of the terms of ``σ' = σ(1 − σ)`` (``1 − σ`` cancels where σ → 1)."""
    return torch.sigmoid(z)


@dataclass(frozen=True)
class Gate:
    """A gate's activation: its value, its derivative and the size of that derivative's
    terms (what its rounding is relative to)."""

    fn: Callable[[torch.Tensor], torch.Tensor]
    grad: Callable[[torch.Tensor], torch.Tensor]
    grad_size: Callable[[torch.Tensor], torch.Tensor]


# By the name a kernel is given (fla's ``activation='swish'`` is silu: the sweep passes
# "silu", which fla takes too).
GATES = {"silu": Gate(torch.nn.functional.silu, silu_grad, silu_grad_size),
         "sigmoid": Gate(torch.sigmoid, sigmoid_grad, sigmoid_grad_size)}
