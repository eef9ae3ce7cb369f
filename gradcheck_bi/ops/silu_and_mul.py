"""``silu_and_mul``: ``x (..., 2D) -> silu(x[..., :D]) · x[..., D:]`` (the vLLM / TorchTitan
form): :mod:`.swiglu` (at its multipliers' 1.0) on the two halves of one input, its output
half as wide.

With ``a = x[..., :D]``, ``b = x[..., D:]``::

    dx[..., :D] = g · b · silu'(a),    dx[..., D:] = g · silu(a)

Every output element depends on two elements of its row (``j`` and ``D + j``): column ``c``
of x reaches output column ``c mod D`` alone (the finite differences perturb one column of
every row at once). Rounding and magnitudes: SwiGLU's, on the halves.

>>> import torch
>>> OP.reference({"x": torch.tensor([[0.0, 1.0, 2.0, 2.0]])}, {}, {})["y"]
tensor([[0.0000, 1.4621]])
"""

from __future__ import annotations

from typing import Any

import torch

from gradcheck_bi.ops.norms import silu_grad_size
from gradcheck_bi.ops.record import Grads, Op, Point, Sums, Tensors

OPS_SILU = 8.0  # exp (not always correctly rounded), an add, a division, the products


def elementwise(point: Point, name: str, output: str) -> int:
    return 1


def one_term(point: Point) -> int:
    return 1


def terms(a: torch.Tensor, b: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The sizes of the terms of the gradient of ``silu(a) · b`` (fp64): ``|g b| S(a)``
    (``S``: the size of the terms of ``silu'``, :func:`~gradcheck_bi.ops.norms.
    silu_grad_size`) for ``a``, ``|g silu(a)|`` for ``b``."""
    return (g * b).abs() * silu_grad_size(a), (g * torch.nn.functional.silu(a)).abs()


def _halves(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    d = x.shape[-1]
    if d % 2:
        raise ValueError(f"silu_and_mul takes an even last dim, not {d}")
    return x[..., : d // 2], x[..., d // 2:]


def reference(inputs: Tensors, params: Tensors, options: dict[str, Any]) -> Tensors:
    a, b = _halves(inputs["x"])
    return {"y": torch.nn.functional.silu(a) * b}


def step_scale(point: Point, name: str) -> torch.Tensor:
    """silu bends over a unit (``b``'s half is linear)."""
    x = point.inputs64["x"]
    return torch.ones(x.numel() // x.shape[-1], dtype=torch.float64, device=x.device)


def _terms(point: Point) -> torch.Tensor:
    a, b = _halves(point.inputs64["x"])
    return torch.cat(terms(a, b, point.cotangents["y"].to(torch.float64)), dim=-1)


def input_rounding(point: Point, name: str, exact: Grads, sums: Sums) -> torch.Tensor:
    return OPS_SILU**0.5 * _terms(point)


def input_magnitude(point: Point, name: str, sums: Sums) -> torch.Tensor:
    return _terms(point)


def half(d: int) -> int:
    return d // 2


OP = Op(
    "silu_and_mul", "y = silu(x[..., :D]) · x[..., D:] for x of last dim 2D",
    inputs=("x",), params=(), options=(), outputs=("y",), reference=reference,
    step_scale=step_scale, input_rounding=input_rounding, input_magnitude=input_magnitude,
    needs=("x",), reach=elementwise, forward_terms=one_term, forward_extra=OPS_SILU + 1.0,
    statistic="silu and the product (one term)", out_width=half)
