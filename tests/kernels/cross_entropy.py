"""Cross-entropy Functions with hand-written backwards: a correct one with the signature
``forward(ctx, logits, target, ignore_index=-100, reduction="mean", label_smoothing=0.0)``
and mutants of the public bug classes (``# MUTANT``).

fp32 inside (fp64 stays fp64), rounded once; every row computed on its own (torch's CPU
``exp`` rounds a vectorised loop's tail differently with the row count: row by row keeps
the kernel batch-invariant).
"""

from __future__ import annotations

import torch


def _probs(z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``softmax`` and ``lse`` per row, row by row."""
    p = torch.empty_like(z)
    lse = torch.empty(z.shape[0], dtype=z.dtype, device=z.device)
    for i in range(z.shape[0]):
        m = z[i].max()
        e = torch.exp(z[i] - m)
        s = e.sum()
        p[i] = e / s
        lse[i] = m + torch.log(s)
    return p, lse


def _lse(z: torch.Tensor) -> torch.Tensor:
    """``lse`` per row, row by row (the forward needs no probabilities)."""
    lse = torch.empty(z.shape[0], dtype=z.dtype, device=z.device)
    for i in range(z.shape[0]):
        m = z[i].max()
        lse[i] = m + torch.log(torch.exp(z[i] - m).sum())
    return lse


class CrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, target, ignore_index=-100, reduction="mean",
                label_smoothing=0.0):
        wide = torch.promote_types(logits.dtype, torch.float32)
        z = logits.to(wide)
        lse = _lse(z)
        valid = target != ignore_index
        safe = torch.where(valid, target, 0)
        picked = z.gather(-1, safe[:, None])[:, 0]
        loss = (1 - label_smoothing) * (lse - picked)
        if label_smoothing:
            loss = loss + label_smoothing * (lse - z.mean(-1))
        loss = torch.where(valid, loss, 0.0)
        count = valid.sum().clamp(min=1)
        ctx.save_for_backward(logits, target)
        ctx.args = (ignore_index, reduction, label_smoothing)
        out = (loss if reduction == "none" else loss.sum() if reduction == "sum"
               else loss.sum() / count)
        return out.to(logits.dtype)

    @staticmethod
    def backward(ctx, grad):
        logits, target = ctx.saved_tensors
        ignore_index, reduction, eps = ctx.args
        wide = torch.promote_types(logits.dtype, torch.float32)
        p, _ = _probs(logits.to(wide))
        valid = target != ignore_index
        safe = torch.where(valid, target, 0)
        onehot = torch.zeros_like(p).scatter_(-1, safe[:, None], 1.0)
        d = (1 - eps) * (p - onehot) + eps * (p - 1.0 / p.shape[-1])
        d = torch.where(valid[:, None], d, 0.0)
        g = grad.to(wide)
        if reduction == "none":
            d = d * g[:, None]
        elif reduction == "sum":
            d = d * g
        else:
            d = d * (g / valid.sum().clamp(min=1))
        return d.to(logits.dtype), None, None, None, None


def _scaled(d, g, reduction, valid):
    """``d`` times the loss's cotangent as the reduction hands it to each row (a mean: over
    the rows not ignored)."""
    return d * (g[:, None] if reduction == "none" else g if reduction == "sum"
                else g / valid.sum().clamp(min=1))


def _grad_parts(ctx):
    logits, target = ctx.saved_tensors
    ignore_index, reduction, eps = ctx.args
    wide = torch.promote_types(logits.dtype, torch.float32)
    p, _ = _probs(logits.to(wide))
    valid = target != ignore_index
    safe = torch.where(valid, target, 0)
    onehot = torch.zeros_like(p).scatter_(-1, safe[:, None], 1.0)
    return logits, p, onehot, valid, reduction, eps, wide


class AssumesGradOne(CrossEntropy):
    """The backward never reads grad_output (right while it is 1.0)."""

    @staticmethod
    def backward(ctx, grad):
        logits, p, onehot, valid, reduction, eps, _wide = _grad_parts(ctx)
        d = torch.where(valid[:, None], (1 - eps) * (p - onehot) + eps * (p - 1 / p.shape[-1]),
                        0.0)
        if reduction == "mean":
            d = d / valid.sum().clamp(min=1)
        return d.to(logits.dtype), None, None, None, None  # MUTANT: grad ignored


class FirstRowCotangent(CrossEntropy):
    """reduction="none": every row scaled by grad_output[0] (right for a uniform one)."""

    @staticmethod
    def backward(ctx, grad):
        logits, p, onehot, valid, reduction, eps, wide = _grad_parts(ctx)
        d = torch.where(valid[:, None], (1 - eps) * (p - onehot) + eps * (p - 1 / p.shape[-1]),
                        0.0)
        g = grad.to(wide)
        if reduction == "none":
            d = d * g.reshape(-1)[0]  # MUTANT
        elif reduction == "sum":
            d = d * g
        else:
            d = d * (g / valid.sum().clamp(min=1))
        return d.to(logits.dtype), None, None, None, None


class IgnoredRowsLeak(CrossEntropy):
    """Ignored rows get the gradient of class 0 (right when nothing is ignored)."""

    @staticmethod
    def backward(ctx, grad):
        logits, p, onehot, valid, reduction, eps, wide = _grad_parts(ctx)
        d = (1 - eps) * (p - onehot) + eps * (p - 1 / p.shape[-1])  # MUTANT: no mask
        return _scaled(d, grad.to(wide), reduction, valid).to(logits.dtype), None, None, None, None


class MeanOverAllRows(CrossEntropy):
    """The backward's mean divides by every row, ignored ones included."""

    @staticmethod
    def backward(ctx, grad):
        logits, p, onehot, valid, reduction, eps, wide = _grad_parts(ctx)
        d = torch.where(valid[:, None], (1 - eps) * (p - onehot) + eps * (p - 1 / p.shape[-1]),
                        0.0)
        g = grad.to(wide)
        d = d * (g[:, None] if reduction == "none" else g if reduction == "sum"
                 else g / valid.numel())  # MUTANT
        return d.to(logits.dtype), None, None, None, None


class SmoothingWithoutOneMinusEps(CrossEntropy):
    """Label smoothing without the (1 − ε) on the target term."""

    @staticmethod
    def backward(ctx, grad):
        logits, p, onehot, valid, reduction, eps, wide = _grad_parts(ctx)
        d = torch.where(valid[:, None], (p - onehot) + eps * (p - 1 / p.shape[-1]),  # MUTANT
                        0.0)
        return _scaled(d, grad.to(wide), reduction, valid).to(logits.dtype), None, None, None, None


class GradIntoLogits(CrossEntropy):
    """Stores the gradient into the saved logits (right values, a corrupted input)."""

    @staticmethod
    def backward(ctx, grad):
        dz, *rest = CrossEntropy.backward(ctx, grad)
        logits = ctx.saved_tensors[0]
        logits.data.copy_(dz)  # MUTANT
        return (logits, *rest)


class TargetProbRoundedLowp(CrossEntropy):
    """The target's probability rounded to the input dtype before 1 is subtracted (a
    no-op in fp32/fp64; 100 % of the gradient where p ≈ 0.999 in bf16)."""

    @staticmethod
    def backward(ctx, grad):
        logits, p, onehot, valid, reduction, eps, wide = _grad_parts(ctx)
        p = p.to(logits.dtype).to(wide)  # MUTANT
        d = torch.where(valid[:, None], (1 - eps) * (p - onehot) + eps * (p - 1 / p.shape[-1]),
                        0.0)
        return _scaled(d, grad.to(wide), reduction, valid).to(logits.dtype), None, None, None, None


class ReadsStorageAsContiguous(CrossEntropy):
    """The backward reads the saved logits' storage as if it were contiguous (right on
    contiguous logits; a strided view's rows come out of the wrong memory) — a kernel that
    takes a pointer and assumes row stride V."""

    @staticmethod
    def backward(ctx, grad):
        logits, target = ctx.saved_tensors
        flat = logits.as_strided(logits.shape, (logits.shape[-1], 1))  # MUTANT
        ignore_index, reduction, eps = ctx.args
        wide = torch.promote_types(logits.dtype, torch.float32)
        p, _ = _probs(flat.to(wide))
        valid = target != ignore_index
        onehot = torch.zeros_like(p).scatter_(-1, torch.where(valid, target, 0)[:, None], 1.0)
        d = torch.where(valid[:, None], (1 - eps) * (p - onehot) + eps * (p - 1 / p.shape[-1]),
                        0.0)
        return _scaled(d, grad.to(wide), reduction, valid).to(logits.dtype), None, None, None, None
