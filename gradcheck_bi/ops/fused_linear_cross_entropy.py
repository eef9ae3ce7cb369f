"""``fused_linear_cross_entropy``: an LM head's projection and cross-entropy in one op.

With ``h`` a row of hidden states, ``W`` the ``(V, H)`` projection, ``b`` its optional bias,
``z = W h + b`` the row's logits and ``p = softmax z``::

    loss_i = lse(z_i) − z_{i t_i}                 (0 where t_i is ignore_index, −100)
    dh_i   = s_i Wᵀ (p_i − e_{t_i})
    dW     = Σ_i s_i (p_i − e_{t_i}) h_iᵀ        db = Σ_i s_i (p_i − e_{t_i})

with ``s_i`` the row's share of the cotangent: ``g_i`` under ``reduction="none"``, ``g``
under ``sum``, ``g / (rows not ignored)`` under ``mean``. The loss of a row is
:mod:`~gradcheck_bi.ops.cross_entropy`'s, options and all — label smoothing, class
weights (``ce_weight``), the z-loss ``lse_square_scale · lse²``, a tanh softcap of the
logits — with ``p_i − e_{t_i}`` replaced by that loss's ``∂loss_i/∂z_i``, as Liger's
``LigerFusedLinearCrossEntropyFunction`` takes them. Fused kernels (Liger's
``LigerFusedLinearCrossEntropyFunction``) never hold the ``(rows, V)`` logits: they walk
the rows in chunks and add each chunk's ``dW`` into one buffer — so a ``dW`` that keeps
one chunk's share is right only while every row fits one chunk (the default shape has
several chunks of 4 rows, as the kernels under tests/kernels cut them).

Every loss depends on every element of ``W`` and ``b``: the finite differences of ``dW``
perturb one element at a time, sampled past the colour budget — the rows of ``W`` of the
first rows' targets and largest logits, the first and last rows, 128- and 1024-row block
edges (each at its first and last column), random ones — plus random directions over the
whole of ``W``. ``dh`` perturbs a column of ``h`` across the rows at once under ``none``.

The blind controls are cross-entropy's: a scalar loss's cotangent of 1.0 (what
``loss.backward()`` sends) and all-ones per-row cotangents under ``none``; no ignored
target (a mean over every row is right there); no smoothing, no softcap, no z-loss, no
class weights (each swept beside its sensitive value). ``--shape`` is ``(…rows, H, V)``; batch
invariance is over the rows under ``none`` only (a mean couples them).

>>> import torch
>>> h = torch.tensor([[1.0, 0.0], [0.0, 1.0]], dtype=torch.float64)
>>> W = torch.tensor([[2.0, 0.0], [0.0, 1.0]], dtype=torch.float64)
>>> t = torch.tensor([0, 1])
>>> opts = {"reduction": "none", "ignore_index": -100}
>>> OP.reference({"hidden": h, "weight": W, "bias": None, "target": t}, opts)["loss"]
tensor([0.1269, 0.3133], dtype=torch.float64)
"""

from __future__ import annotations

import math
from typing import Any

import torch

from gradcheck_bi.ops import cross_entropy
from gradcheck_bi.ops.shaped import (
    Axis,
    Drawn,
    Output,
    Role,
    ShapedOp,
    Sizes,
    Variant,
    cotangent_axis,
)

IGNORE = cross_entropy.IGNORE


OPTIONS = ("label_smoothing", "softcap", "lse_square_scale")  # cross_entropy's, passed on


def reference(t: dict[str, torch.Tensor | None], options: dict[str, Any]
              ) -> dict[str, torch.Tensor]:
    h, w, b, target = t["hidden"], t["weight"], t.get("bias"), t["target"]
    assert h is not None and w is not None and target is not None
    z = h @ w.t()
    if b is not None:
        z = z + b
    return cross_entropy.reference(
        {"logits": z, "target": target, "weight": t.get("class_weight")},
        {"reduction": options["reduction"],
         "ignore_index": options.get("ignore_index", IGNORE),
         **{k: options.get(k) for k in OPTIONS}})


def sizes(shape: tuple[int, ...]) -> Sizes:
    if len(shape) < 3:
        raise ValueError("fused_linear_cross_entropy takes --shape as (…rows, H, V), e.g. "
                         "4,1024,4096,128256")
    return {"n": math.prod(shape[:-2]), "h": shape[-2], "v": shape[-1],
            "lead": len(shape) - 2, **{f"lead{i}": s for i, s in enumerate(shape[:-2])}}


def _lead(s: Sizes) -> tuple[int, ...]:
    return tuple(s[f"lead{i}"] for i in range(s["lead"]))


def draw(s: Sizes, variant: Variant, dtype: torch.dtype, device: str,
         gen: torch.Generator) -> Drawn:
    n, hd, v = s["n"], s["h"], s["v"]
    hidden = torch.randn(n, hd, generator=gen, dtype=torch.float64)
    # logits of unit-scale rows about 2 wide, as cross_entropy draws them
    weight = torch.randn(v, hd, generator=gen, dtype=torch.float64) * (2.0 / math.sqrt(hd))
    bias = (0.5 * torch.randn(v, generator=gen, dtype=torch.float64)
            if variant["bias"] else None)
    target = torch.randint(0, v, (n,), generator=gen)
    if variant["ignore"] == "some":
        target[torch.arange(n) % 3 == 1] = IGNORE
    g = cross_entropy.loss_cotangent(variant, n, gen)
    classes = (0.5 + torch.rand(v, generator=gen, dtype=torch.float64)
               if variant["class_weight"] else None)
    lead = _lead(s)

    def put(x: torch.Tensor | None) -> torch.Tensor | None:
        return x.to(dtype).to(device) if x is not None else None

    return Drawn({"hidden": put(hidden.reshape(*lead, hd)), "weight": put(weight),
                  "bias": put(bias), "target": target.reshape(lead).to(device),
                  "class_weight": put(classes)},
                 {"reduction": variant["reduction"], "ignore_index": IGNORE,
                  **{k: variant[k] for k in OPTIONS}},
                 {"loss": g.to(dtype).to(device)}, s)


def canonical(t: dict[str, torch.Tensor | None], options: dict[str, Any]
              ) -> dict[str, torch.Tensor | None]:
    """Hidden as ``(n, h)`` and the targets as ``(n,)`` (leading dims flattened)."""
    h, target = t.get("hidden"), t.get("target")
    return {"hidden": h.reshape(-1, h.shape[-1]) if h is not None else None,
            "weight": t.get("weight"), "bias": t.get("bias"),
            "target": target.reshape(-1) if target is not None else None,
            "class_weight": t.get("class_weight")}


def restore(name: str, part: torch.Tensor, like: torch.Tensor, options: dict[str, Any]
            ) -> torch.Tensor:
    """A few canonical rows with the kernel's leading rank (one batch of ``k`` rows)."""
    lead = like.dim() - (1 if name == "hidden" else 0)
    return part.reshape(*([1] * (lead - 1)), *part.shape).contiguous()


def output_view(name: str, y: torch.Tensor) -> torch.Tensor:
    return y.reshape(-1) if y.dim() else y


def _classes(drawn: Drawn, rows: int = 8) -> list[int]:
    """Rows of ``W`` a sampled ``dW`` must hold: the first rows' targets and largest
    logits, the first and last, the edges of 128- and 1024-row blocks."""
    h, w, b, target = (drawn.tensors[k] for k in ("hidden", "weight", "bias", "target"))
    assert h is not None and w is not None and target is not None
    v = w.shape[0]
    first = h.reshape(-1, h.shape[-1])[:rows].double().cpu()
    z = first @ w.double().cpu().t()
    if b is not None:
        z = z + b.double().cpu()
    t = target.reshape(-1)[:rows].cpu()
    found = [int(c) for c in t[t >= 0]] + [int(c) for c in z.argmax(-1)]
    found += [0, v - 1, *(c for blk in (128, 1024) for c in (blk - 1, blk) if c < v)]
    return list(dict.fromkeys(found))


def risky(drawn: Drawn, role: str) -> list[torch.Tensor]:
    """``hidden``: per row its first and last columns and 128/1024 block edges. ``weight``,
    ``bias`` (no axis shared with the loss): one-element tensors, each the flat index of an
    element (the engine reads a one-element pick as row 0's index: the flat index itself)
    — :func:`_classes`' rows of ``W``, each at its first and last column."""
    if role == "hidden":
        h = drawn.tensors["hidden"]
        assert h is not None
        n, width = h.reshape(-1, h.shape[-1]).shape
        cols = [0, width - 1, *(c for blk in (128, 1024) for c in (blk - 1, blk)
                                if c < width)]
        return [torch.full((n,), c, dtype=torch.long) for c in dict.fromkeys(cols)]
    classes = _classes(drawn)
    if role == "bias":
        return [torch.tensor([c]) for c in classes]
    w = drawn.tensors["weight"]
    assert w is not None
    width = w.shape[1]
    flat = [c * width + k for c in classes for k in dict.fromkeys((0, width - 1))]
    return [torch.tensor([f]) for f in flat[:48]]  # leaves random colours in the sample


OP = ShapedOp(
    "fused_linear_cross_entropy",
    "loss = cross_entropy(hidden @ Wᵀ + b, target) (reductions, ignore_index, smoothing, "
    "class weights, z-loss, softcap), fused",
    roles=(Role("hidden", ("n", "h"), names=("hidden", "_input", "input", "x", "inp",
                                             "hidden_states", "h", "e")),
           Role("weight", ("v", "h"), names=("weight", "lin_weight", "w", "lm_head_weight",
                                             "classifier")),
           Role("bias", ("v",), optional=True, names=("bias", "lin_bias", "b")),
           Role("target", ("n",), kind="index", names=("target", "targets", "labels",
                                                        "label", "y")),
           Role("class_weight", ("v",), grad=False, optional=True,
                names=("ce_weight", "class_weight", "class_weights"))),
    outputs=(Output("loss", ()),),
    axes=(Axis("reduction", ("mean", "none", "sum"), passed=True, names=("reduction",),
               words="the reduction"),
          cotangent_axis("the loss's cotangent: random (a scalar ≠ 1; per row), or 1.0"),
          Axis("ignore", ("some", "none"), blind="none",
               words="targets equal to ignore_index: every third row, or none"),
          Axis("bias", (True, False), words="a bias given (on) or None"),
          *(cross_entropy.OP.axis(k) for k in OPTIONS),
          Axis("class_weight", (False, True), blind=False,
               words="class weights given (ce_weight)")),
    reference=reference, canonical=canonical, draw=draw, sizes=sizes,
    default_shape=(10, 16, 320), shape_words="(…rows, H, V)",
    batch_axis=lambda values: "n" if values.get("reduction") == "none" else None,
    column="cotangent", fills={"ignore_index": IGNORE}, risky=risky,
    marks=("fused_linear_cross_entropy", "linear_cross_entropy", "flce"),
    output_view=output_view, restore=restore,
    output_axes=lambda values: {"loss": ("n",) if values.get("reduction") == "none" else ()},
    crossed=(("reduction", "cotangent"),),
)
