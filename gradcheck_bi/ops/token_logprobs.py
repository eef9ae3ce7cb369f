"""``token_logprobs``: the log-probability of each token's target, as RL trainers compute it.

With ``z`` a row of logits over the vocabulary, ``τ`` the sampling temperature and ``t``
the row's target token::

    y_i   = z_{i t_i} / τ − log Σ_j exp(z_ij / τ)          (= log softmax(z_i / τ)[t_i])
    dz_ij = g_i (δ_{j t_i} − p_ij) / τ                      (p = softmax(z / τ))

one value per token (output axes ``(n,)``: the logits' leading dims flattened), each row
its own problem — batch invariance is over the rows. A token whose target is
``ignore_index`` (−100: a prompt or padding token) has ``y_i = 0`` and no gradient, for a
kernel that takes an ``ignore_index``; one that takes none is checked with no ignored
token (recognition fixes ``ignore`` at ``none``). The kernels this describes take
``(logits, labels, temperature=1.0)`` (OpenRLHF's ``log_probs_from_logits``, torchtune's
``logits_to_logprobs``; TRL's ``selective_log_softmax(logits, index)`` and verl's
``logprobs_from_logits`` take no temperature: recognition fixes it at 1.0).

The blind controls, each swept beside its sensitive value: per-token cotangents that are
all 1 (a backward that never reads them, or reads only the first, is right there), a
temperature of 1.0 (a backward that forgets ``1/τ`` is right there), no ignored token (a
backward that leaks gradient into ignored tokens is right there), unpeaked logits
(``peaked``: the target's p ≈ 0.999, where ``δ − p`` cancels in low precision — a sampled
token is often that likely). ``--shape`` is ``(…tokens, V)``.

>>> import torch
>>> z = torch.tensor([[2.0, 0.0], [0.0, 1.0]], dtype=torch.float64)
>>> t = torch.tensor([0, 1])
>>> OP.reference({"logits": z, "target": t}, {"temperature": 1.0})["logprobs"]
tensor([-0.1269, -0.3133], dtype=torch.float64)
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


def reference(t: dict[str, torch.Tensor | None], options: dict[str, Any]
              ) -> dict[str, torch.Tensor]:
    z, target = t["logits"], t["target"]
    assert z is not None and target is not None
    z = z / float(options.get("temperature") or 1.0)
    m = z.amax(-1, keepdim=True).detach()
    lse = (m + torch.log(torch.exp(z - m).sum(-1, keepdim=True))).squeeze(-1)
    valid = target != options.get("ignore", cross_entropy.IGNORE)
    safe = torch.where(valid, target, torch.zeros_like(target))
    y = z.gather(-1, safe.unsqueeze(-1)).squeeze(-1) - lse
    return {"logprobs": torch.where(valid, y, torch.zeros_like(y))}


def sizes(shape: tuple[int, ...]) -> Sizes:
    if len(shape) < 2:
        raise ValueError("token_logprobs takes --shape as (…tokens, V), e.g. 4,512,32000")
    return {"n": math.prod(shape[:-1]), "v": shape[-1], "lead": len(shape) - 1,
            **{f"lead{i}": s for i, s in enumerate(shape[:-1])}}


def _lead(s: Sizes) -> tuple[int, ...]:
    return tuple(s[f"lead{i}"] for i in range(s["lead"]))


def draw(s: Sizes, variant: Variant, dtype: torch.dtype, device: str,
         gen: torch.Generator) -> Drawn:
    n, v = s["n"], s["v"]
    z = 2.0 * torch.randn(n, v, generator=gen, dtype=torch.float64)
    target = torch.randint(0, v, (n,), generator=gen)
    tau = float(variant["temperature"])
    if variant["peaked"]:  # the target's probability ≈ 0.999 at the temperature
        z[torch.arange(n), target] = z.amax(-1) + tau * (math.log(v) + 7.0)
    g = (torch.ones(n, dtype=torch.float64) if variant["cotangent"] == "ones"
         else torch.randn(n, generator=gen, dtype=torch.float64))
    if variant["ignore"] == "some":
        target[torch.arange(n) % 3 == 1] = cross_entropy.IGNORE
    lead = _lead(s)
    # the kernel gets ignore_index −100 either way; the axis says whether a target is it
    return Drawn({"logits": z.reshape(*lead, v).to(dtype).to(device),
                  "target": target.reshape(lead).to(device)},
                 {"temperature": tau, "ignore": cross_entropy.IGNORE},
                 {"logprobs": g.to(dtype).to(device)}, s)


def rows(t: dict[str, torch.Tensor | None], options: dict[str, Any]
         ) -> dict[str, torch.Tensor | None]:
    """The logits as ``(n, v)`` and the targets as ``(n,)``: the leading dims flattened."""
    z, target = t.get("logits"), t.get("target")
    return {"logits": z.reshape(-1, z.shape[-1]) if z is not None else None,
            "target": target.reshape(-1) if target is not None else None}


def restore(name: str, part: torch.Tensor, like: torch.Tensor, options: dict[str, Any]
            ) -> torch.Tensor:
    """A few canonical rows with the kernel's leading rank (one batch of ``k`` tokens)."""
    lead = like.dim() - (1 if name == "logits" else 0)
    return part.reshape(*([1] * (lead - 1)), *part.shape).contiguous()


def output_view(name: str, y: torch.Tensor) -> torch.Tensor:
    return y.reshape(-1)


OP = ShapedOp(
    "token_logprobs", "y = log softmax(z / τ)[target] per token (RL's log-probs; temperature)",
    roles=(Role("logits", ("n", "v"), names=("logits", "input", "_input", "x", "inp", "z",
                                             "hidden")),
           Role("target", ("n",), kind="index",
                names=("target", "targets", "labels", "label", "index", "input_ids", "ids",
                       "sequences", "tokens", "y"))),
    outputs=(Output("logprobs", ("n",)),),
    axes=(cotangent_axis("the per-token cotangent: random, or all ones"),
          Axis("temperature", (0.7, 1.0), passed=True, blind=1.0,
               names=("temperature", "temp", "tau"), words="the sampling temperature τ"),
          # "none" first: a kernel that takes no ignore_index is probed at it whatever
          # other option it fixes (recognition changes one axis at a time)
          Axis("ignore", ("none", "some"), passed=True, blind="none",
               names=("ignore_index", "ignore_idx", "ignore_id"),
               words="targets equal to ignore_index (−100, the value the kernel gets): "
                     "every third token, or none"),
          Axis("peaked", (False, True), blind=False,
               words="the target's logit raised until p ≈ 0.999")),
    reference=reference, canonical=rows, draw=draw, sizes=sizes,
    default_shape=(2, 4, 256), shape_words="(…tokens, V)",
    batch_axis=lambda values: "n", column="cotangent",
    risky=cross_entropy.risky,  # the same roles: a row's target, top logits, edges
    marks=("logprob", "log_prob", "logps"),
    output_view=output_view, restore=restore,
)
