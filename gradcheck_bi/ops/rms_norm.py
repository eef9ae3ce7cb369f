"""``rms_norm``: ``y = x · rsqrt(mean(x²) + eps) · γ (+ β)`` over the last axis.

The functions below describe the op to the one engine (:mod:`gradcheck_bi.checks.rows`):
the statistic over the row, RMSNorm's rounding models. They serve the plain kernel
``(x, weight, eps)`` and its variants alike: no weight ``(x, eps)``, or a bias
``(x, weight, bias, eps)`` (optional: a kernel without one has no β axis). The forward's
bound is RMSNorm's with no further rounding for β: a correct kernel adding β in its compute
dtype and rounding once passes it in fp32, fp16 and bf16 (tests/kernels/variants.py).

>>> import torch
>>> x = torch.tensor([[3.0, 4.0]], dtype=torch.float64)
>>> ROWS.reference({"x": x}, {"weight": torch.ones(2, dtype=torch.float64)}, {"eps": 0.0})["y"]
tensor([[0.8485, 1.1314]], dtype=torch.float64)
"""

from __future__ import annotations

from typing import Any

import torch

from gradcheck_bi.ops.norms import norm_op, rms, row_length
from gradcheck_bi.ops.record import OPTIONAL_BIAS, WEIGHT, Grads, Op, Point, Sums, Tensors


def reference(inputs: Tensors, params: Tensors, options: dict[str, Any]) -> Tensors:
    y = rms(inputs["x"], options["eps"]) * params["weight"]
    return {"y": y + params["bias"] if "bias" in params else y}


def step_scale(point: Point, name: str) -> torch.Tensor:
    x = point.inputs64["x"]
    return row_length(x.reshape(-1, x.shape[-1]), point.options["eps"])


def input_rounding(point: Point, name: str, exact: Grads, sums: Sums) -> torch.Tensor:
    return sums.dx_sigma(point.inputs64["x"], point.effective["weight"],
                         point.cotangents["y"].to(torch.float64), point.options["eps"])


def input_magnitude(point: Point, name: str, sums: Sums) -> torch.Tensor:
    return sums.dx_magnitude(point.inputs64["x"], point.effective["weight"],
                             point.cotangents["y"].to(torch.float64), point.options["eps"])


ROWS = Op(
    "rms_norm", "y = x · rsqrt(mean(x²) + eps) · γ",
    inputs=("x",), params=(WEIGHT, OPTIONAL_BIAS), options=("eps",), outputs=("y",),
    reference=reference, step_scale=step_scale, input_rounding=input_rounding,
    input_magnitude=input_magnitude, needs=("x", "weight", "eps"))
OP = norm_op(ROWS)
