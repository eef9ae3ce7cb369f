"""``log_softmax`` over the last axis: ``y = x − log Σ_j exp(x_j)``.

With ``p = softmax(x) = exp(y)`` and ``S = Σ_j g_j`` (the cotangent's row sum)::

    dx = g − p · S

A backward that drops ``S`` (``dx = g − p``, right only where every row's cotangent sums to
1, as for a cross-entropy) or reads ``S`` of another row (invisible where every row shares
one cotangent) is what the random cotangents catch. No parameter, no option.

**Forward**: ``y_i = x_i − m − log Σ exp(x_j − m)``: the subtraction rounds relative to
``|x_i| + |lse|`` (:func:`shift`, absolute), the sum of D exponentials as a statistic.
**Rounding of dx**: ``OPS_DIRECT`` roundings of ``g`` and of ``p S``; ``p`` relative
(``OPS_EXP``: exp, the division, the sum's own relative error); ``S``'s any-order sum
(``V(g) + OPS_TERM Σ g²``) times ``p``. **Magnitude**: ``|g| + p Σ|g|``.

>>> import torch
>>> x = torch.tensor([[0.0, 0.0]], dtype=torch.float64)
>>> OP.reference({"x": x}, {}, {})["y"]
tensor([[-0.6931, -0.6931]], dtype=torch.float64)
"""

from __future__ import annotations

from typing import Any

import torch

from gradcheck_bi.ops.record import Grads, Op, Point, Sums, Tensors

OPS_EXP = 4.0  # exp (not always correctly rounded), the division by the sum, its log


def reference(inputs: Tensors, params: Tensors, options: dict[str, Any]) -> Tensors:
    return {"y": torch.log_softmax(inputs["x"], dim=-1)}


def step_scale(point: Point, name: str) -> torch.Tensor:
    """Softmax bends over a unit of its logits, whatever their size."""
    x = point.inputs64["x"]
    return torch.ones(x.numel() // x.shape[-1], dtype=torch.float64, device=x.device)


def shift(point: Point, k: float, sums: Sums) -> float:
    """``k · max(|x| + |lse|)``: the subtraction's rounding, absolute."""
    x = point.inputs64["x"]
    lse = torch.logsumexp(x, dim=-1, keepdim=True)
    return k * float((x.abs() + lse.abs()).max())


def _parts(point: Point, sums: Sums) -> tuple[torch.Tensor, ...]:
    x, g = point.inputs64["x"], point.cotangents["y"].to(torch.float64)
    p = torch.softmax(x, dim=-1)
    return g, p, sums.row_sum(g).unsqueeze(-1)


def input_rounding(point: Point, name: str, exact: Grads, sums: Sums) -> torch.Tensor:
    g, p, s = _parts(point, sums)
    e = torch.exp(point.inputs64["x"] - point.inputs64["x"].amax(-1, keepdim=True))
    total = sums.row_sum(e)
    v_sum = (sums.any_order_var(e) / (total * total)).unsqueeze(-1)
    v_s = (sums.any_order_var(g) + sums.OPS_TERM * sums.row_sum(g * g)).unsqueeze(-1)
    ps = p * s
    return (sums.OPS_DIRECT * (g * g + ps * ps) + (OPS_EXP + v_sum) * ps * ps
            + p * p * v_s).sqrt()


def input_magnitude(point: Point, name: str, sums: Sums) -> torch.Tensor:
    g, p, _ = _parts(point, sums)
    return g.abs() + p * sums.row_sum(g.abs()).unsqueeze(-1)


OP = Op(
    "log_softmax", "y = x − log Σ exp(x) over the last axis",
    inputs=("x",), params=(), options=(), outputs=("y",), reference=reference,
    step_scale=step_scale, input_rounding=input_rounding, input_magnitude=input_magnitude,
    needs=("x",), forward_extra=OPS_EXP, statistic="the log-sum-exp", shift=shift)
