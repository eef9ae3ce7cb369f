"""``gelu_and_mul_halves``: :mod:`.gelu_and_mul` on the two halves of one input (vLLM's
and SGLang's ``GeluAndMul`` module): ``x (…, 2D) -> gelu(x[..., :D]) · x[..., D:]``, GELU
exact (erf) or its tanh form (``approximate``, which those modules take when built).

With ``a = x[..., :D]``, ``b = x[..., D:]``::

    dx[..., :D] = g · b · gelu'(a),    dx[..., D:] = g · gelu(a)

Canonically ``x`` is ``(n, two, d)`` — its halves on the axis ``two``, which ``y (n, d)``
lacks: an element of x reaches the one output element of its row and column, each half one
colour. The gate half is drawn at 3× the unit scale, as :mod:`.gelu_and_mul` draws ``a``.
``--shape`` is x's, ``(…rows, 2D)``.

>>> import torch
>>> x = torch.tensor([[0.0, 1.0, 1.0, 1.0]], dtype=torch.float64)
>>> OP.reference({"x": x.reshape(1, 2, 2)}, {"approximate": "none"})["y"]
tensor([[0.0000, 0.8413]], dtype=torch.float64)
"""

from __future__ import annotations

from typing import Any

import torch

from gradcheck_bi.ops import gelu_and_mul
from gradcheck_bi.ops.shaped import (
    Drawn,
    Output,
    Role,
    ShapedOp,
    Sizes,
    Variant,
    cotangent,
    halves_back,
    halves_rows,
    halves_sizes,
    rows_view,
)


def reference(t: dict[str, torch.Tensor | None], options: dict[str, Any]
              ) -> dict[str, torch.Tensor]:
    x = t["x"]
    assert x is not None
    return gelu_and_mul.reference({"a": x[:, 0], "b": x[:, 1]}, options)


def sizes(shape: tuple[int, ...]) -> Sizes:
    return halves_sizes(shape, "gelu_and_mul_halves")


def draw(s: Sizes, variant: Variant, dtype: torch.dtype, device: str,
         gen: torch.Generator) -> Drawn:
    lead = tuple(s[f"lead{i}"] for i in range(s["lead"]))
    a = 3.0 * torch.randn(*lead, s["d"], generator=gen, dtype=torch.float64)
    b = torch.randn(*lead, s["d"], generator=gen, dtype=torch.float64)
    g = cotangent(variant, s["n"], s["d"], gen)
    return Drawn({"x": torch.cat([a, b], -1).to(dtype).to(device)},
                 {"approximate": variant["approximate"]}, {"y": g.to(dtype).to(device)}, s)


OP = ShapedOp(
    "gelu_and_mul_halves", "y = gelu(x[..., :D]) · x[..., D:] (erf or tanh form)",
    roles=(Role("x", ("n", "two", "d"), names=("x", "input", "hidden_states")),),
    outputs=(Output("y", ("n", "d")),),
    axes=gelu_and_mul.OP.axes,  # the same options and controls as the two-input form
    reference=reference, canonical=halves_rows, draw=draw, sizes=sizes,
    default_shape=(2, 8, 256), shape_words="(…rows, 2D)",
    batch_axis=lambda options: "n", column="approximate",
    marks=("gelu",), output_view=rows_view,
    restore=halves_back,
)
