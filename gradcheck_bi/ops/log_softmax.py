"""``log_softmax`` over the last axis: ``y = x − log Σ_j exp(x_j)``.

With ``p = softmax(x) = exp(y)`` and ``S = Σ_j g_j`` (the cotangent's row sum)::

    dx = g − p · S

A backward that drops ``S`` (``dx = g − p``, right only where every row's cotangent sums to
1, as for a cross-entropy) or reads ``S`` of another row (right where every row shares one
cotangent: the all-ones control) is what the random cotangents catch. Every output element
of a row depends on every element of it (the axis ``d`` is coupled: one colour per
column, every row at once). The reference is written as a kernel computes it,
``y = (x − m) − log Σ exp(x − m)`` with ``m`` the row's maximum (a constant of the
gradient), so that every rounding — the subtraction's, the sum's, the division's in the
backward — is derived from it (:mod:`gradcheck_bi.errors`). A kernel's ``dim`` is given
-1. ``x`` is drawn at the point's input scale (a case's ``input_scales``; 1 by default);
the step along it is softmax's bend, 1, at any scale. ``--shape`` is ``(…rows, D)``.

>>> import torch
>>> x = torch.tensor([[0.0, 0.0]], dtype=torch.float64)
>>> OP.reference({"x": x}, {})["y"]
tensor([[-0.6931, -0.6931]], dtype=torch.float64)
"""

from __future__ import annotations

from typing import Any

import torch

from gradcheck_bi.ops.shaped import (
    Drawn,
    Output,
    Role,
    ShapedOp,
    Sizes,
    Variant,
    cotangent,
    cotangent_axis,
    last_axis_rows,
    rows_back,
    rows_sizes,
    rows_view,
)


def reference(t: dict[str, torch.Tensor | None], options: dict[str, Any]
              ) -> dict[str, torch.Tensor]:
    x = t["x"]
    assert x is not None
    shifted = x - x.amax(-1, keepdim=True).detach()
    return {"y": shifted - torch.log(torch.exp(shifted).sum(-1, keepdim=True))}


def sizes(shape: tuple[int, ...]) -> Sizes:
    return rows_sizes(shape, "log_softmax")


def draw(s: Sizes, variant: Variant, dtype: torch.dtype, device: str,
         gen: torch.Generator) -> Drawn:
    lead = tuple(s[f"lead{i}"] for i in range(s["lead"]))
    x = torch.randn(*lead, s["d"], generator=gen, dtype=torch.float64)
    g = cotangent(variant, s["n"], s["d"], gen)
    return Drawn({"x": x.to(dtype).to(device)}, {"dim": -1}, {"y": g.to(dtype).to(device)},
                 s)


OP = ShapedOp(
    "log_softmax", "y = x − log Σ exp(x) over the last axis",
    roles=(Role("x", ("n", "d"), names=("x", "input", "logits", "hidden_states")),),
    outputs=(Output("y", ("n", "d")),),
    axes=(cotangent_axis("the cotangent of y: random, or all ones (every row's sum alike)"),),
    reference=reference, canonical=last_axis_rows, draw=draw, sizes=sizes,
    default_shape=(2, 8, 256), shape_words="(…rows, D)", coupled=("d",),
    batch_axis=lambda options: "n", column="cotangent", fills={"dim": -1},
    marks=("log_softmax",), scaled=("x",), bend=lambda role, options: 1.0,
    output_view=rows_view,
    restore=rows_back,
)
