"""A cross-entropy Function with the signature of Liger-Kernel 0.8.5's
``LigerCrossEntropyFunction`` (``_input``, ``target``, class ``weight`` without a default,
z-loss, smoothing, softcap, and a 4-tuple out), in plain torch: what zero glue must bind.
Its backward differentiates a recomputed fp64-exact graph (right by construction); the
mutant (``# MUTANT``) divides a weighted mean by the rows kept instead of Σ weight[target].
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _loss(x, target, weight, ignore_index, lse_square_scale, label_smoothing, reduction,
          softcap, weighted_mean=True):
    z = x if softcap is None else softcap * torch.tanh(x / softcap)
    keep = target != ignore_index
    per_row = F.cross_entropy(z, target, weight=weight, ignore_index=ignore_index,
                              reduction="none", label_smoothing=label_smoothing)
    per_row = per_row + lse_square_scale * torch.logsumexp(z, -1).square() * keep
    if reduction == "none":
        return per_row
    if reduction == "sum":
        return per_row.sum()
    if weight is not None and weighted_mean:
        safe = torch.where(keep, target, torch.zeros_like(target))
        return per_row.sum() / (weight[safe] * keep).sum()
    return per_row.sum() / keep.sum().clamp(min=1)


class CrossEntropyLigerSignature(torch.autograd.Function):
    weighted_mean = True

    @staticmethod
    def forward(ctx, _input, target, weight, ignore_index=-100, lse_square_scale=0.0,
                label_smoothing=0.0, reduction="mean", softcap=None, return_z_loss=False,
                return_token_accuracy=False, return_predicted_tokens=False):
        cls = ctx._forward_cls  # the class .apply was called on (the mutant's own flag)
        x = _input.detach().requires_grad_(True)
        with torch.enable_grad():
            out = _loss(x, target, weight, ignore_index, lse_square_scale, label_smoothing,
                        reduction, softcap, cls.weighted_mean)
        ctx.graph = (x, out)
        return out.detach(), None, None, None

    @staticmethod
    def backward(ctx, grad, *unused):
        x, out = ctx.graph
        (dx,) = torch.autograd.grad(out, x, grad)
        return (dx,) + (None,) * 10


class WeightedMeanOverRows(CrossEntropyLigerSignature):
    weighted_mean = False  # MUTANT: a weighted mean divided by the rows kept, not Σ w[t]
