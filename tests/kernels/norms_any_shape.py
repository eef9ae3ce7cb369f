"""RMSNorm and LayerNorm written as ops of any shape (:class:`~gradcheck_bi.ops.shaped.
ShapedOp`): the evidence for moving the norms onto the one record (docs/shaped_ops.md, "A
norm as an op of any shape"). Named ``rms_norm_any`` and ``layer_norm_any`` so that they
never meet the package's own ``rms_norm`` and ``layer_norm`` (:data:`gradcheck_bi.ops.OPS`);
:func:`registered` adds them to :data:`gradcheck_bi.ops.SHAPED` for as long as a test needs
them (recognition then offers them to every kernel it reads, so never for longer).

Both have a row ``x (n, d)``, a weight ``γ (d)`` (LayerNorm a bias ``β (d)`` too) and an
output ``y (n, d)``; the axis ``d`` is coupled (the row's statistic). The sweep's axes:

* ``gamma``: γ's control on the *effective* weight, randn | ones | zeros (ones blind: a
  defect multiplied by γ − 1, or by a γ where none belongs, is zero there);
* ``zero_centered_gamma``: passed to a kernel that takes it (``zcg``, Megatron's name, too);
  the stored weight is then ``γ − 1`` (rounded once to the dtype) and the reference adds
  the 1 back, as a kernel does;
* ``beta`` (LayerNorm): β randn | zeros (zeros blind);
* ``cotangent``: random | ones.

``eps`` is filled at the norms' default, 1e-6. The references are written as a kernel
computes them (``x · (Σ x² / D + eps)^(-1/2) · γ``; LayerNorm centres first), so that the
derived error model (:mod:`gradcheck_bi.errors`) rounds what a kernel rounds.

>>> import torch
>>> x = torch.tensor([[3.0, 4.0]], dtype=torch.float64)
>>> w = torch.zeros(2, dtype=torch.float64)
>>> RMS_NORM_ANY.reference({"x": x, "weight": w}, {"eps": 0.0, "zero_centered_gamma": True})["y"]
tensor([[0.8485, 1.1314]], dtype=torch.float64)
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from gradcheck_bi.ops import SHAPED
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
    rows_back,
    rows_sizes,
)

EPS = 1e-6  # the norms' default (gradcheck_bi.vocab.Config.eps)
GAMMA = Axis("gamma", ("randn", "ones", "zeros"), blind="ones",
             words="γ's control on the effective weight (ones: blind to a defect times γ − 1)")
ZCG = Axis("zero_centered_gamma", (False, True), passed=True,
           names=("zero_centered_gamma", "zcg"),
           words="the stored weight is γ − 1 (the kernel adds the 1)")
BETA = Axis("beta", ("randn", "zeros"), blind="zeros", words="β's control")


def _gamma(t: dict[str, torch.Tensor | None], options: dict[str, Any]) -> torch.Tensor:
    w = t["weight"]
    assert w is not None
    return w + 1 if options.get("zero_centered_gamma") else w


def _normed(c: torch.Tensor, eps: float) -> torch.Tensor:
    """``c · (Σ c² / D + eps)^(-1/2)`` over the last axis, as a kernel computes it."""
    return c * torch.rsqrt((c * c).sum(-1, keepdim=True) / c.shape[-1] + eps)


def rms_reference(t: dict[str, torch.Tensor | None], options: dict[str, Any]
                  ) -> dict[str, torch.Tensor]:
    x = t["x"]
    assert x is not None
    return {"y": _normed(x, options["eps"]) * _gamma(t, options)}


def layer_reference(t: dict[str, torch.Tensor | None], options: dict[str, Any]
                    ) -> dict[str, torch.Tensor]:
    x, b = t["x"], t["bias"]
    assert x is not None and b is not None
    c = x - x.sum(-1, keepdim=True) / x.shape[-1]
    return {"y": _normed(c, options["eps"]) * _gamma(t, options) + b}


def canonical(t: dict[str, torch.Tensor | None], options: dict[str, Any]
              ) -> dict[str, torch.Tensor | None]:
    """``x`` as ``(rows, D)``; the ``(D,)`` parameters as they are."""
    return {k: (v.reshape(-1, v.shape[-1]) if k == "x" and v is not None else v)
            for k, v in t.items()}


def draw(s: Sizes, variant: Variant, dtype: torch.dtype, device: str,
         gen: torch.Generator) -> Drawn:
    lead = tuple(s[f"lead{i}"] for i in range(s["lead"]))
    d = s["d"]
    x = torch.randn(*lead, d, generator=gen, dtype=torch.float64)
    g = cotangent(variant, s["n"], d, gen)
    gamma = {"randn": torch.randn(d, generator=gen, dtype=torch.float64),
             "ones": torch.ones(d, dtype=torch.float64),
             "zeros": torch.zeros(d, dtype=torch.float64)}[variant["gamma"]]
    zcg = bool(variant["zero_centered_gamma"])
    stored = gamma - 1 if zcg else gamma
    tensors: dict[str, torch.Tensor | None] = {"x": x, "weight": stored}
    beta = variant.get("beta")
    if beta is not None:
        b = torch.randn(d, generator=gen, dtype=torch.float64)
        tensors["bias"] = b if beta == "randn" else torch.zeros_like(b)
    placed = {k: v.to(dtype).to(device) for k, v in tensors.items() if v is not None}
    return Drawn(dict(placed), {"eps": EPS, "zero_centered_gamma": zcg},
                 {"y": g.to(dtype).to(device)}, s)


def _op(name: str, summary: str, reference: Any, bias: bool) -> ShapedOp:
    roles = [Role("x", ("n", "d"), names=("x", "input", "hidden_states")),
             Role("weight", ("d",), names=("weight", "w", "gamma"))]
    if bias:
        roles.append(Role("bias", ("d",), names=("bias", "b", "beta")))
    return ShapedOp(
        name, summary, roles=tuple(roles), outputs=(Output("y", ("n", "d")),),
        axes=(GAMMA, ZCG, *((BETA,) if bias else ()),
              cotangent_axis("the cotangent of y: random, or all ones")),
        reference=reference, canonical=canonical, draw=draw,
        sizes=lambda shape: rows_sizes(shape, name), default_shape=(2, 8, 256),
        shape_words="(…rows, D)", coupled=("d",), batch_axis=lambda options: "n",
        column="gamma", fills={"eps": EPS}, crossed=(("gamma", "zero_centered_gamma"),),
        scaled=("x",), output_view=lambda _, y: y.reshape(-1, y.shape[-1]),
        restore=rows_back)


RMS_NORM_ANY = _op("rms_norm_any", "y = x · rsqrt(mean(x²) + eps) · γ", rms_reference, False)
LAYER_NORM_ANY = _op("layer_norm_any", "y = (x − mean x) · rsqrt(var x + eps) · γ + β",
                     layer_reference, True)
ANY = {op.name: op for op in (RMS_NORM_ANY, LAYER_NORM_ANY)}


@contextlib.contextmanager
def registered() -> Iterator[None]:
    """Both ops in :data:`gradcheck_bi.ops.SHAPED` for the block, removed after it."""
    SHAPED.update(ANY)
    try:
        yield
    finally:
        for name in ANY:
            SHAPED.pop(name, None)
