"""``fused_add_rms_norm``: ``residual_out = x + residual``; ``y = rms_norm(residual_out) · γ``.

A kernel may return ``y`` alone, or ``(y, residual_out)`` (asked by a ``prenorm`` flag).
In low precision it has two correct references: ``s = x + residual`` as computed, or as
stored (``residual_out`` rounded once, what Liger and vLLM normalise and save).

**Rounding of d<input>**: the RMSNorm ``dx`` model at ``s`` (:func:`~gradcheck_bi.tolerance.
summation.dx_sigma`), and the addition of ``residual_out``'s cotangent (``OPS_ADD``
roundings of ``|d_s|``); ``dresidual`` is the same tensor. **Magnitude**: RMSNorm's at ``s``
plus ``|q|``, ``q`` the cotangent of ``residual_out``.
"""

from __future__ import annotations

from typing import Any

import torch

from gradcheck_bi.ops.norms import norm_op, rms, row_length
from gradcheck_bi.ops.record import WEIGHT, Grads, Op, Point, Stored, Sums, Tensors

OPS_ADD = 2.0  # + the residual_out cotangent, and its share of the output cast


def reference(inputs: Tensors, params: Tensors, options: dict[str, Any]) -> Tensors:
    s = inputs["x"] + inputs["residual"]
    return {"y": rms(s, options["eps"]) * params["weight"], "residual_out": s}


def step_scale(point: Point, name: str) -> torch.Tensor:
    """The length of the row of ``s = x + residual``."""
    ins = {n: t.reshape(-1, t.shape[-1]) for n, t in point.inputs64.items()}
    return row_length(ins["x"] + ins["residual"], point.options["eps"])


def reach(point: Point, name: str, output: str) -> int:
    """The row, through the statistic; ``residual_out`` is elementwise."""
    return 1 if output == "residual_out" else int(point.inputs["x"].shape[-1])


def input_rounding(point: Point, name: str, exact: Grads, sums: Sums) -> torch.Tensor:
    inputs, eff = point.inputs64, point.effective
    s = inputs["x"] + inputs["residual"]
    d_s = exact["x"]
    gy = point.cotangents["y"].to(torch.float64)
    return (sums.dx_sigma(s, eff["weight"], gy, point.options["eps"]) ** 2
            + OPS_ADD * d_s * d_s).sqrt()


def input_magnitude(point: Point, name: str, sums: Sums) -> torch.Tensor:
    inputs, g = point.inputs64, point.cotangents
    return (sums.dx_magnitude(inputs["x"] + inputs["residual"], point.effective["weight"],
                              g["y"].to(torch.float64), point.options["eps"])
            + g["residual_out"].to(torch.float64).abs())


def stored_sum(inputs: Tensors) -> Tensors:
    """``x := x + residual`` (to be rounded once), ``residual := 0``."""
    s = inputs["x"] + inputs["residual"]
    return {"x": s, "residual": torch.zeros_like(s)}


ROWS = Op(
    "fused_add_rms_norm",
    "residual_out = x + residual; y = rms_norm(residual_out) · γ (a kernel may return y "
    "alone)",
    inputs=("x", "residual"), params=(WEIGHT,), options=("eps",),
    outputs=("y", "residual_out"), reference=reference, step_scale=step_scale,
    input_rounding=input_rounding, input_magnitude=input_magnitude,
    needs=("x", "residual", "weight", "eps"), marks=("residual",), reach=reach,
    forward_extra=1.0, statistic="the mean square of x + residual", added=("residual_out",),
    prenorm=True,
    stored=Stored(stored_sum, "s", "x + residual as computed", "residual_out as stored",
                  "the fused add's y against x + residual as computed or as stored"))
OP = norm_op(ROWS)
