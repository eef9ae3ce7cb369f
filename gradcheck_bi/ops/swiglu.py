"""``swiglu``: ``y = silu(a) · b``, elementwise (Liger's form).

With ``s = silu(a) = a σ(a)`` and ``silu'(a) = σ(a) (1 + a (1 − σ(a)))``::

    da = g · b · silu'(a),    db = g · silu(a)

A ``silu'`` without its product term (``σ(a)`` alone) is the classic defect; with random
cotangents on every row, a backward that reads another row's cotangent or stores into
another row shows too. No parameter, no option; every output element depends on one
element of each input (the finite differences perturb a whole column of rows at once and
each output element reaches only itself).

**Forward**: ``OPS_SILU`` roundings of silu and one of the product, per element.
**Rounding of da**: ``OPS_SILU`` roundings of ``|g b| S`` (``S``: the size of the terms of
``silu'``, :func:`~gradcheck_bi.ops.norms.silu_grad_size`); **of db**: of ``|g silu(a)|``.
The magnitudes are the same terms.

>>> import torch
>>> a, b = torch.tensor([[0.0, 1.0]]), torch.tensor([[2.0, 2.0]])
>>> OP.reference({"a": a, "b": b}, {}, {})["y"]
tensor([[0.0000, 1.4621]])
"""

from __future__ import annotations

from typing import Any

import torch

from gradcheck_bi.ops.norms import silu_grad_size
from gradcheck_bi.ops.record import Op, Point, Sums, Tensors

OPS_SILU = 8.0  # exp (not always correctly rounded), an add, a division, the products


def reference(inputs: Tensors, params: Tensors, options: dict[str, Any]) -> Tensors:
    return {"y": torch.nn.functional.silu(inputs["a"]) * inputs["b"]}


def step_scale(point: Point, name: str) -> torch.Tensor:
    """``a``: silu bends over a unit; ``b``: ``y`` is linear in it, so the row's largest
    ``|b|`` (at least 1) costs no truncation and keeps the step above ``b``'s ulps."""
    t = point.inputs64[name]
    rows = t.reshape(-1, t.shape[-1])
    if name == "a":
        return torch.ones(rows.shape[0], dtype=torch.float64, device=t.device)
    return rows.abs().amax(-1).clamp(min=1.0)


def elementwise(point: Point, name: str, output: str) -> int:
    return 1


def terms(a: torch.Tensor, b: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The sizes of the terms of ``da`` and ``db`` (fp64): ``|g b| S(a)``, ``|g silu(a)|``."""
    return (g * b).abs() * silu_grad_size(a), (g * torch.nn.functional.silu(a)).abs()


def _terms(point: Point, name: str) -> torch.Tensor:
    ins, g = point.inputs64, point.cotangents["y"].to(torch.float64)
    return terms(ins["a"], ins["b"], g)[0 if name == "a" else 1]


def input_rounding(point: Point, name: str, exact: Tensors, sums: Sums) -> torch.Tensor:
    return OPS_SILU**0.5 * _terms(point, name)


def input_magnitude(point: Point, name: str, sums: Sums) -> torch.Tensor:
    return _terms(point, name)


def one_term(point: Point) -> int:
    return 1


OP = Op(
    "swiglu", "y = silu(a) · b",
    inputs=("a", "b"), params=(), options=(), outputs=("y",), reference=reference,
    step_scale=step_scale, input_rounding=input_rounding, input_magnitude=input_magnitude,
    needs=("a", "b"), names={"a": ("a", "gate", "x"), "b": ("b", "up")}, reach=elementwise,
    forward_terms=one_term, forward_extra=OPS_SILU + 1.0,
    statistic="silu and the product (one term)")
