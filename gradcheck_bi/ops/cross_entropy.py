"""``cross_entropy``: class-index targets over the last axis, as torch and Liger define it.

With ``z`` the logits (softcapped: ``z ← c·tanh(z / c)`` when a softcap ``c`` is given),
``lse = log Σ_j exp z_j`` and ``p = softmax z`` per row::

    loss_i = (1 − ε)(lse − z_{t_i}) · w_{t_i} + ε mean_j w_j (lse − z_j) + s · lse²
    dz_ij  = g_i [ (1 − ε) w_{t_i} (p_ij − δ_{j t_i}) + ε (W p_ij − w_j)/V + 2 s lse p_ij ]

(``ε`` label smoothing, ``w`` class weights (all 1 when none are given; ``W = Σ_j w_j``),
``s`` the z-loss scale ``lse_square_scale``), for every row whose target is not
``ignore_index`` (−100); an ignored row has loss 0 and no gradient. ``reduction``:
``none`` (a loss per row), ``sum``, ``mean`` (over the rows not ignored; with class
weights, the cross-entropy terms over their targets' weights, the z-loss over the rows,
as Liger computes it). Under a softcap the gradient goes on through ``1 − tanh²``.

The blind controls, each swept beside its sensitive value: a scalar loss's cotangent of
1.0 (what ``loss.backward()`` sends) and per-row cotangents that are all 1 under ``none``;
no ignored target; no smoothing; no softcap, no z-loss, no class weights; unpeaked logits
(``peaked``: the target's p ≈ 0.999, where a low-precision ``p − 1`` cancels). The stride-0
cotangent of a ``.sum()`` is the layout ``grad-expanded``. ``--shape`` is
``(…rows, V)``; batch invariance is defined under ``none`` only (a mean couples the rows).

>>> import torch
>>> z = torch.tensor([[2.0, 0.0], [0.0, 1.0]], dtype=torch.float64)
>>> t = torch.tensor([0, 1])
>>> opts = dict(reduction="none", ignore_index=-100, label_smoothing=0.0, softcap=None,
...             lse_square_scale=0.0)
>>> OP.reference({"logits": z, "target": t, "weight": None}, opts)["loss"]
tensor([0.1269, 0.3133], dtype=torch.float64)
"""

from __future__ import annotations

import math
from typing import Any

import torch

from gradcheck_bi.ops import shaped
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

IGNORE = -100


def reference(t: dict[str, torch.Tensor | None], options: dict[str, Any]
              ) -> dict[str, torch.Tensor]:
    z, target, w = t["logits"], t["target"], t.get("weight")
    assert z is not None and target is not None
    cap = options.get("softcap")
    if cap:
        z = cap * torch.tanh(z / cap)
    m = z.amax(-1, keepdim=True).detach()
    lse = (m + torch.log(torch.exp(z - m).sum(-1, keepdim=True))).squeeze(-1)
    valid = target != options.get("ignore_index", IGNORE)
    safe = torch.where(valid, target, torch.zeros_like(target))
    picked = z.gather(-1, safe.unsqueeze(-1)).squeeze(-1)
    eps = float(options.get("label_smoothing") or 0.0)
    scale = w.gather(0, safe) if w is not None else torch.ones_like(lse)
    loss = (1 - eps) * (lse - picked) * scale
    if eps:  # the uniform target's share, each class at its weight (torch, Liger)
        spread = lse.unsqueeze(-1) - z
        loss = loss + eps * ((spread * w).mean(-1) if w is not None else spread.mean(-1))
    zero = torch.zeros_like(loss)
    loss = torch.where(valid, loss, zero)
    zs = float(options.get("lse_square_scale") or 0.0)
    z_loss = torch.where(valid, zs * lse * lse, zero) if zs else None
    reduction = options["reduction"]
    if reduction == "none":
        return {"loss": loss + z_loss if z_loss is not None else loss}
    if reduction == "sum":
        return {"loss": (loss + z_loss if z_loss is not None else loss).sum()}
    # the mean over the rows not ignored, each at its target's weight; the z-loss over
    # those rows unweighted (Liger's, the one kernel that takes both)
    mean = loss.sum() / torch.where(valid, scale, zero).sum()
    if z_loss is not None:
        mean = mean + z_loss.sum() / valid.sum()
    return {"loss": mean}


def sizes(shape: tuple[int, ...]) -> Sizes:
    if len(shape) < 2:
        raise ValueError("cross_entropy takes --shape as (…rows, V)")
    return {"n": math.prod(shape[:-1]), "v": shape[-1]}


def loss_cotangent(variant: Variant, n: int, gen: torch.Generator) -> torch.Tensor:
    """A loss's cotangent (fp64): all ones (the blind control), else a scalar that is not 1
    for a reduced loss, or random per row under ``reduction="none"``."""
    scalar = variant["reduction"] != "none"
    if variant["cotangent"] == "ones":
        return torch.ones(() if scalar else (n,), dtype=torch.float64)
    if scalar:
        return 0.37 + 0.5 * torch.rand((), generator=gen, dtype=torch.float64)
    return torch.randn(n, generator=gen, dtype=torch.float64)


def draw(s: Sizes, variant: Variant, dtype: torch.dtype, device: str,
         gen: torch.Generator) -> Drawn:
    n, v = s["n"], s["v"]
    z = 2.0 * shaped.normal((n, v), gen, device)  # on a GPU point, drawn there
    target = torch.randint(0, v, (n,), generator=gen)
    if variant["peaked"]:  # the target's probability ≈ 0.999
        z[torch.arange(n, device=z.device), target.to(z.device)] = \
            z.amax(-1) + math.log(v) + 7.0
    if variant["ignore"] == "some":
        target[torch.arange(n) % 3 == 1] = IGNORE
    weight = (0.5 + torch.rand(v, generator=gen, dtype=torch.float64)
              if variant["weight"] else None)
    g = loss_cotangent(variant, n, gen)
    options = {"reduction": variant["reduction"], "ignore_index": IGNORE,
               "label_smoothing": variant["label_smoothing"], "softcap": variant["softcap"],
               "lse_square_scale": variant["lse_square_scale"]}
    return Drawn({"logits": z.to(dtype).to(device), "target": target.to(device),
                  "weight": weight.to(dtype).to(device) if weight is not None else None},
                 options, {"loss": g.to(dtype).to(device)}, s)


def rows(t: dict[str, torch.Tensor | None], options: dict[str, Any]
         ) -> dict[str, torch.Tensor | None]:
    z = t.get("logits")
    return {**t, "logits": z.reshape(-1, z.shape[-1]) if z is not None else None}


def risky(drawn: Drawn, role: str) -> list[torch.Tensor]:
    """Per row: the target's column, the largest logits, the first and last columns, the
    edges of 128- and 1024-wide blocks."""
    z = drawn.tensors["logits"]
    target = drawn.tensors["target"]
    assert z is not None and target is not None
    z = z.reshape(-1, z.shape[-1])
    n, v = z.shape
    t = target.reshape(-1).cpu().clamp(min=0)
    # on the logits' device: a (4096, 128256) copy to the host and a host topk took seconds
    top = z.double().topk(min(3, v), dim=-1).indices.cpu()
    edges = [c for b in (128, 1024) for c in (b - 1, b) if c < v]
    cols = [t, *top.unbind(-1), torch.zeros(n, dtype=torch.long),
            torch.full((n,), v - 1), *(torch.full((n,), c) for c in edges)]
    return [c.long() for c in cols]


OP = ShapedOp(
    "cross_entropy", "loss = −log softmax(z)[target] (reductions, ignore_index, smoothing, "
    "class weights, z-loss, softcap)",
    roles=(Role("logits", ("n", "v"), names=("logits", "input", "_input", "x", "inp",
                                             "hidden", "z")),
           Role("target", ("n",), kind="index", names=("target", "targets", "labels",
                                                        "label", "y")),
           Role("weight", ("v",), grad=False, optional=True,
                names=("weight", "class_weight", "weights"))),
    outputs=(Output("loss", ()),),
    axes=(Axis("reduction", ("mean", "none", "sum"), passed=True, names=("reduction",),
               words="the reduction"),
          cotangent_axis("the loss's cotangent: random (a scalar ≠ 1; per row), or 1.0"),
          Axis("ignore", ("some", "none"), blind="none",
               words="targets equal to ignore_index: every third row, or none"),
          Axis("label_smoothing", (0.0, 0.1), passed=True, blind=0.0,
               names=("label_smoothing",), words="label smoothing ε"),
          Axis("softcap", (None, 5.0), passed=True, blind=None,
               names=("softcap", "logit_softcap", "final_logit_softcapping"),
               words="a tanh softcap of the logits"),
          Axis("lse_square_scale", (0.0, 1e-2), passed=True, blind=0.0,
               names=("lse_square_scale", "z_loss_scale"), words="the z-loss scale"),
          Axis("weight", (False, True), blind=False, words="class weights given"),
          Axis("peaked", (False, True), blind=False,
               words="the target's logit raised until p ≈ 0.999")),
    reference=reference, canonical=rows, draw=draw, sizes=sizes,
    default_shape=(2, 8, 512), shape_words="(…rows, V)",
    batch_axis=lambda values: "n" if values.get("reduction") == "none" else None,
    column="cotangent", fills={"ignore_index": IGNORE}, risky=risky,
    marks=("cross_entropy", "crossentropy", "ce_loss"),
    output_axes=lambda values: {"loss": ("n",) if values.get("reduction") == "none" else ()},
    crossed=(("reduction", "cotangent"),),
    size_names={"v": ("vocab_size", "num_classes", "n_classes")},
)
