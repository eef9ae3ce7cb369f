"""``gelu_and_mul``: ``y = gelu(a) · b``, elementwise, GELU exact (erf) or its tanh form.

``gelu(a) = a Φ(a) = ½ a (1 + erf(a / √2))``; with ``approximate="tanh"``,
``½ a (1 + tanh(√(2/π) (a + 0.044715 a³)))``. Then::

    da = g · b · gelu'(a),    db = g · gelu(a)

Every output element depends on one element of each input: one colour each. ``a`` is
drawn at 3× the unit scale so that the sweep reaches ``a ≈ −3``, where ``1 + erf`` cancels
and a correct forward rounds at hundreds of u relative to ``y`` — the error model derives
that from the formula (:mod:`gradcheck_bi.errors`); nothing here says so. ``--shape`` is
``(…rows, D)``.

>>> import torch
>>> a, b = torch.tensor([[0.0, 1.0]], dtype=torch.float64), torch.ones(1, 2, dtype=torch.float64)
>>> OP.reference({"a": a, "b": b}, {"approximate": "none"})["y"]
tensor([[0.0000, 0.8413]], dtype=torch.float64)
"""

from __future__ import annotations

import math
from typing import Any

import torch

from gradcheck_bi.ops.shaped import (
    Axis,
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
    a, b = t["a"], t["b"]
    assert a is not None and b is not None
    if options["approximate"] == "tanh":
        inner = math.sqrt(2 / math.pi) * (a + 0.044715 * a * a * a)
        gelu = 0.5 * a * (1 + torch.tanh(inner))
    else:
        gelu = 0.5 * a * (1 + torch.erf(a / math.sqrt(2)))
    return {"y": gelu * b}


def sizes(shape: tuple[int, ...]) -> Sizes:
    return rows_sizes(shape, "gelu_and_mul")


def draw(s: Sizes, variant: Variant, dtype: torch.dtype, device: str,
         gen: torch.Generator) -> Drawn:
    lead = tuple(s[f"lead{i}"] for i in range(s["lead"]))

    def randn(scale: float = 1.0) -> torch.Tensor:
        t = scale * torch.randn(*lead, s["d"], generator=gen, dtype=torch.float64)
        return t.to(dtype).to(device)

    g = cotangent(variant, s["n"], s["d"], gen)
    return Drawn({"a": randn(3.0), "b": randn()}, {"approximate": variant["approximate"]},
                 {"y": g.to(dtype).to(device)}, s)



OP = ShapedOp(
    "gelu_and_mul", "y = gelu(a) · b (erf or tanh form)",
    roles=(Role("a", ("n", "d"), names=("a", "x", "gate", "input")),
           Role("b", ("n", "d"), names=("b", "y", "up", "other"))),
    outputs=(Output("y", ("n", "d")),),
    axes=(Axis("approximate", ("none", "tanh"), passed=True, names=("approximate",),
               words="GELU's form: erf (none) or tanh"),
          cotangent_axis("the cotangent of y: random, or all ones")),
    reference=reference, canonical=last_axis_rows, draw=draw, sizes=sizes,
    default_shape=(2, 8, 256), shape_words="(…rows, D)",
    batch_axis=lambda options: "n", column="approximate",
    marks=("gelu",), output_view=rows_view,
    restore=rows_back,
)
