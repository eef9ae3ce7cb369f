"""``swiglu``: ``y = silu(m_g · a) · b · m_d``, elementwise (Liger's form, its
``gate_multiplier`` m_g and ``down_multiplier`` m_d; both 1 in a plain SwiGLU).

With ``s = silu(m_g a)`` and ``silu'(t) = σ(t) (1 + t (1 − σ(t)))``::

    da = g · m_d · b · m_g · silu'(m_g a),    db = g · m_d · s

A ``silu'`` without its product term (``σ(a)`` alone) is the classic defect; with random
cotangents on every row, a backward that reads another row's cotangent or stores into
another row shows too. A multiplier at 1.0 is a blind control: a backward that drops it is
right there, so each is swept at another value too (a kernel without one runs at 1.0).
Every output element depends on one element of each input (the finite differences
perturb a whole column of rows at once and each output element reaches only itself).

**Forward**: ``OPS_SILU`` roundings of silu and one of the product per element (a
multiplier's own rounding is within that margin). **Rounding of da**: ``OPS_SILU``
roundings of ``|g m_d b m_g| S`` (``S``: the size of the terms of ``silu'``,
:func:`~gradcheck_bi.ops.norms.silu_grad_size`); **of db**: of ``|g m_d s|``; at
``m_g ≠ 1`` also the one rounding of ``t = m_g a``, which silu's tail scales by ``|t|``
(:func:`_scaled_gate`). The magnitudes are the same terms.

>>> import torch
>>> a, b = torch.tensor([[0.0, 1.0]]), torch.tensor([[2.0, 2.0]])
>>> OP.reference({"a": a, "b": b}, {}, {})["y"]
tensor([[0.0000, 1.4621]])
>>> OP.reference({"a": a, "b": b}, {}, {"gate_multiplier": 2.0, "down_multiplier": 0.5})["y"]
tensor([[0.0000, 1.7616]])
"""

from __future__ import annotations

from typing import Any

import torch

from gradcheck_bi.ops.norms import silu_grad_size
from gradcheck_bi.ops.record import Grads, Op, Point, Sums, Tensors
from gradcheck_bi.ops.shaped import Axis

OPS_SILU = 8.0  # exp (not always correctly rounded), an add, a division, the products
# Liger's multipliers; the other value is no power of two, nor one the reciprocal of the
# other's, so a multiplier applied twice, inverted or swapped shows.
MULTIPLIERS = (
    Axis("gate_multiplier", (1.0, 0.7), passed=True, blind=1.0, names=("gate_multiplier",),
         words="m_g in silu(m_g · a) (1.0: blind to a backward that drops it)"),
    Axis("down_multiplier", (1.0, 1.3), passed=True, blind=1.0, names=("down_multiplier",),
         words="m_d scaling the output (1.0: blind to a backward that drops it)"))


def multipliers(options: dict[str, Any]) -> tuple[float, float]:
    """``(m_g, m_d)`` at a point (1.0 where not given)."""
    return (float(options.get("gate_multiplier", 1.0)),
            float(options.get("down_multiplier", 1.0)))


def reference(inputs: Tensors, params: Tensors, options: dict[str, Any]) -> Tensors:
    gate, down = multipliers(options)
    return {"y": torch.nn.functional.silu(gate * inputs["a"]) * inputs["b"] * down}


def step_scale(point: Point, name: str) -> torch.Tensor:
    """``a``: silu bends over ``1 / m_g``; ``b``: ``y`` is linear in it, so the row's
    largest ``|b|`` (at least 1) costs no truncation and keeps the step above ``b``'s
    ulps."""
    t = point.inputs64[name]
    rows = t.reshape(-1, t.shape[-1])
    if name == "a":
        gate = abs(multipliers(point.options)[0]) or 1.0
        return torch.full((rows.shape[0],), min(1.0, 1.0 / gate), dtype=torch.float64,
                          device=t.device)
    return rows.abs().amax(-1).clamp(min=1.0)


def elementwise(point: Point, name: str, output: str) -> int:
    return 1


def terms(a: torch.Tensor, b: torch.Tensor, g: torch.Tensor, gate: float = 1.0,
          down: float = 1.0) -> tuple[torch.Tensor, ...]:
    """The sizes of the terms of ``da`` and ``db`` (fp64): ``|g m_d b m_g| S(m_g a)``,
    ``|g m_d silu(m_g a)|``."""
    t = gate * a
    return ((g * down * b * gate).abs() * silu_grad_size(t),
            (g * down * torch.nn.functional.silu(t)).abs())


def _terms(point: Point, name: str) -> torch.Tensor:
    ins, g = point.inputs64, point.cotangents["y"].to(torch.float64)
    return terms(ins["a"], ins["b"], g, *multipliers(point.options))[0 if name == "a" else 1]


def _scaled_gate(point: Point, name: str) -> torch.Tensor:
    """What one rounding of ``t = m_g a`` (``u |t|``, none at m_g = 1) moves d<name> by:
    ``|g m_d b m_g silu''(t) t|`` for da, ``|g m_d silu'(t) t|`` for db — in silu's tail
    ``|t|`` times the gradient itself, so held apart from the relative roundings."""
    gate, down = multipliers(point.options)
    ins = point.inputs64
    if gate == 1.0:
        return torch.zeros_like(ins[name])
    t, g = gate * ins["a"], point.cotangents["y"].to(torch.float64) * down
    sig = torch.sigmoid(t)
    if name == "a":
        second = sig * (1 - sig) * (2 + t.abs() * (1 - 2 * sig).abs())  # |silu''|'s terms
        return (g * ins["b"] * gate * second * t).abs()
    return (g * silu_grad_size(t) * t).abs()


def input_rounding(point: Point, name: str, exact: Grads, sums: Sums) -> torch.Tensor:
    return (OPS_SILU * _terms(point, name) ** 2 + _scaled_gate(point, name) ** 2).sqrt()


def input_magnitude(point: Point, name: str, sums: Sums) -> torch.Tensor:
    return _terms(point, name)


def one_term(point: Point) -> int:
    return 1


OP = Op(
    "swiglu", "y = silu(m_g · a) · b · m_d (gate_multiplier, down_multiplier: 1 plain)",
    inputs=("a", "b"), params=(), options=(), outputs=("y",), reference=reference,
    step_scale=step_scale, input_rounding=input_rounding, input_magnitude=input_magnitude,
    needs=("a", "b"), names={"a": ("a", "gate", "x"), "b": ("b", "up")}, reach=elementwise,
    forward_terms=one_term, forward_extra=OPS_SILU + 1.0,
    statistic="silu and the product (one term)", axes=MULTIPLIERS)
