"""``swiglu``: ``y = silu(m_g · a) · b · m_d``, elementwise (Liger's form, its
``gate_multiplier`` m_g and ``down_multiplier`` m_d; both 1 in a plain SwiGLU).

With ``t = m_g a``, ``s = silu(t)`` and ``silu'(t) = σ(t) (1 + t (1 − σ(t)))``::

    da = g · m_d · b · m_g · silu'(t),    db = g · m_d · s

A ``silu'`` without its product term (``σ(t)`` alone) is the classic defect; with random
cotangents on every row, a backward that reads another row's cotangent or stores into
another row shows too. A multiplier at 1.0 is a blind control: a backward that drops it is
right there, so each is swept at another value too (a kernel without one runs at 1.0, the
value its forward computes). Every output element depends on one element of each input:
one colour each. The rounding of ``t = m_g a``, which silu's tail scales by ``|t|``, and
every other rounding are derived from the reference (:mod:`gradcheck_bi.errors`): a
multiplier of 1.0 is no multiplication there, as in a kernel that has none. ``a`` and
``b`` are drawn at the point's input scale (a case's ``input_scales``; 1 by default); the
step along ``a`` is silu's bend, ``1 / m_g``, at any scale (:func:`bend`). ``--shape`` is
``(…rows, D)``.

>>> import torch
>>> a, b = torch.tensor([[0.0, 1.0]]), torch.tensor([[2.0, 2.0]])
>>> opts = {"gate_multiplier": 1.0, "down_multiplier": 1.0}
>>> OP.reference({"a": a, "b": b}, opts)["y"]
tensor([[0.0000, 1.4621]])
>>> OP.reference({"a": a, "b": b}, {"gate_multiplier": 2.0, "down_multiplier": 0.5})["y"]
tensor([[0.0000, 1.7616]])
"""

from __future__ import annotations

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
    last_axis_rows,
    rows_back,
    rows_sizes,
    rows_view,
)

# Liger's multipliers; the other value is no power of two, nor one the reciprocal of the
# other's, so a multiplier applied twice, inverted or swapped shows.
MULTIPLIERS = (
    Axis("gate_multiplier", (1.0, 0.7), passed=True, blind=1.0, names=("gate_multiplier",),
         words="m_g in silu(m_g · a) (1.0: blind to a backward that drops it)"),
    Axis("down_multiplier", (1.0, 1.3), passed=True, blind=1.0, names=("down_multiplier",),
         words="m_d scaling the output (1.0: blind to a backward that drops it)"))


def reference(t: dict[str, torch.Tensor | None], options: dict[str, Any]
              ) -> dict[str, torch.Tensor]:
    a, b = t["a"], t["b"]
    assert a is not None and b is not None
    gate, down = float(options["gate_multiplier"]), float(options["down_multiplier"])
    y = torch.nn.functional.silu(a if gate == 1.0 else gate * a) * b
    return {"y": y if down == 1.0 else y * down}


def sizes(shape: tuple[int, ...]) -> Sizes:
    return rows_sizes(shape, "swiglu")


def draw(s: Sizes, variant: Variant, dtype: torch.dtype, device: str,
         gen: torch.Generator) -> Drawn:
    lead = tuple(s[f"lead{i}"] for i in range(s["lead"]))

    def randn() -> torch.Tensor:
        t = torch.randn(*lead, s["d"], generator=gen, dtype=torch.float64)
        return t.to(dtype).to(device)

    a, b = randn(), randn()
    g = torch.randn(s["n"], s["d"], generator=gen, dtype=torch.float64)
    return Drawn({"a": a, "b": b}, {k: variant[k] for k in ("gate_multiplier",
                                                             "down_multiplier")},
                 {"y": g.to(dtype).to(device)}, s)



def bend(role: str, options: dict[str, Any]) -> float | None:
    """``a``: silu bends over ``1 / m_g`` whatever the scale of ``a`` (a step set by a
    large ``a``'s RMS would cross that bend near 0); ``b``: ``y`` is linear in it."""
    gate = abs(float(options["gate_multiplier"]))
    return 1.0 / gate if role == "a" and gate > 0 else None


OP = ShapedOp(
    "swiglu", "y = silu(m_g · a) · b · m_d (gate_multiplier, down_multiplier: 1 plain)",
    roles=(Role("a", ("n", "d"), names=("a", "gate", "x")),
           Role("b", ("n", "d"), names=("b", "up"))),
    outputs=(Output("y", ("n", "d")),),
    axes=MULTIPLIERS,
    reference=reference, canonical=last_axis_rows, draw=draw, sizes=sizes,
    default_shape=(2, 8, 256), shape_words="(…rows, D)",
    batch_axis=lambda options: "n", column="gate_multiplier",
    marks=("swiglu",), scaled=("a", "b"), bend=bend,
    output_view=rows_view,
    restore=rows_back,
)
