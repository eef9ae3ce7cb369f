"""``silu_and_mul``: ``x (…, 2D) -> silu(x[..., :D]) · x[..., D:]`` (the vLLM / TorchTitan
form): :mod:`.swiglu` at its multipliers' 1.0 on the two halves of one input, its output
half as wide.

With ``a = x[..., :D]``, ``b = x[..., D:]`` and ``silu'(a) = σ(a) (1 + a (1 − σ(a)))``::

    dx[..., :D] = g · b · silu'(a),    dx[..., D:] = g · silu(a)

A ``silu'`` without its product term (``σ(a)`` alone) is the classic defect; a backward
that reads another row's cotangent or stores into another row shows under random
cotangents and is right under the all-ones one (the blind control). Canonically ``x`` is
``(n, two, d)`` — its halves on the axis ``two``, which ``y (n, d)`` lacks: an element of
x reaches the one output element of its row and column, each half one colour. Every
rounding is derived from the reference (:mod:`gradcheck_bi.errors`). ``x`` is drawn at the
point's input scale (a case's ``input_scales``; 1 by default); the step along it is silu's
bend, 1, at any scale (the ``b`` half is linear). ``--shape`` is x's, ``(…rows, 2D)``.

>>> import torch
>>> x = torch.tensor([[0.0, 1.0, 2.0, 2.0]], dtype=torch.float64)
>>> OP.reference({"x": x.reshape(1, 2, 2)}, {})["y"]
tensor([[0.0000, 1.4621]], dtype=torch.float64)
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
    halves_back,
    halves_rows,
    halves_sizes,
    rows_view,
)


def reference(t: dict[str, torch.Tensor | None], options: dict[str, Any]
              ) -> dict[str, torch.Tensor]:
    x = t["x"]
    assert x is not None
    return {"y": torch.nn.functional.silu(x[:, 0]) * x[:, 1]}


def sizes(shape: tuple[int, ...]) -> Sizes:
    return halves_sizes(shape, "silu_and_mul")


def draw(s: Sizes, variant: Variant, dtype: torch.dtype, device: str,
         gen: torch.Generator) -> Drawn:
    lead = tuple(s[f"lead{i}"] for i in range(s["lead"]))
    x = torch.randn(*lead, 2 * s["d"], generator=gen, dtype=torch.float64)
    g = cotangent(variant, s["n"], s["d"], gen)
    return Drawn({"x": x.to(dtype).to(device)}, {}, {"y": g.to(dtype).to(device)}, s)


OP = ShapedOp(
    "silu_and_mul", "y = silu(x[..., :D]) · x[..., D:] for x of last dim 2D",
    roles=(Role("x", ("n", "two", "d"), names=("x", "input", "hidden_states")),),
    outputs=(Output("y", ("n", "d")),),
    axes=(cotangent_axis("the cotangent of y: random, or all ones"),),
    reference=reference, canonical=halves_rows, draw=draw, sizes=sizes,
    default_shape=(2, 8, 256), shape_words="(…rows, 2D)",
    batch_axis=lambda options: "n", column="cotangent",
    marks=("silu_and_mul",), scaled=("x",), bend=lambda role, options: 1.0,
    output_view=rows_view,
    restore=halves_back,
)
