"""Per-token log-probability Functions with hand-written backwards: a correct one with the
signature ``forward(ctx, logits, labels, temperature=1.0, ignore_index=-100)`` (logits
``(…, V)``, labels ``(…)``, log-probs ``(…)``; a token labelled ``ignore_index`` gets 0 and
no gradient) and mutants (``# MUTANT``).

fp32 inside (fp64 stays fp64), rounded once; every row on its own (torch's CPU ``exp``
rounds a vectorised loop's tail differently with its length: one row at a time keeps a
row's bits independent of the batch).
"""

from __future__ import annotations

import torch


def _rows(z: torch.Tensor, labels: torch.Tensor, tau: float
          ) -> tuple[torch.Tensor, torch.Tensor]:
    """``log p(label)`` and ``p = softmax(z / τ)`` for every row of ``z`` (2-D), one row at
    a time (``labels`` already in range: an ignored token's made safe by the caller)."""
    out = torch.empty(z.shape[0], dtype=z.dtype, device=z.device)
    p = torch.empty_like(z)
    for i in range(z.shape[0]):
        s = z[i] / tau
        m = s.max()
        e = torch.exp(s - m)
        total = e.sum()
        p[i] = e / total
        out[i] = s[labels[i]] - m - torch.log(total)
    return out, p


def _safe(labels: torch.Tensor, ignore_index: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The labels with every ignored one at class 0, and which are kept."""
    kept = labels != ignore_index
    return torch.where(kept, labels, 0), kept


def _flat(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor,
                                                                torch.dtype]:
    wide = torch.promote_types(logits.dtype, torch.float32)
    return logits.reshape(-1, logits.shape[-1]).to(wide), labels.reshape(-1), wide


class TokenLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, labels, temperature=1.0, ignore_index=-100):
        z, t, _ = _flat(logits, labels)
        safe, kept = _safe(t, ignore_index)
        out, _p = _rows(z, safe, float(temperature))
        out = torch.where(kept, out, 0.0)
        ctx.save_for_backward(logits, labels)
        ctx.tau, ctx.ignore_index = float(temperature), ignore_index
        return out.reshape(labels.shape).to(logits.dtype)

    @staticmethod
    def backward(ctx, grad):
        logits, d, wide, kept = _parts(ctx)
        g = torch.where(kept, grad.reshape(-1).to(wide), 0.0)
        d = d * (g[:, None] / ctx.tau)
        return d.reshape(logits.shape).to(logits.dtype), None, None, None


def _parts(ctx):
    """The saved logits, ``δ_t − p`` per row (ignored rows' at class 0), the compute
    dtype, and which rows are kept."""
    logits, labels = ctx.saved_tensors
    z, t, wide = _flat(logits, labels)
    safe, kept = _safe(t, ctx.ignore_index)
    _, p = _rows(z, safe, ctx.tau)
    d = -p
    d[torch.arange(d.shape[0]), safe] += 1.0
    return logits, d, wide, kept


class IgnoresCotangent(TokenLogprobs):
    """The backward uses a cotangent of ones (right for ``logprobs.sum().backward()``)."""

    @staticmethod
    def backward(ctx, grad):
        logits, d, _wide, kept = _parts(ctx)
        d = torch.where(kept[:, None], d, 0.0) / ctx.tau  # MUTANT: grad never read
        return d.reshape(logits.shape).to(logits.dtype), None, None, None


class FirstTokenCotangent(TokenLogprobs):
    """Every row scaled by the first token's cotangent (right for a uniform one)."""

    @staticmethod
    def backward(ctx, grad):
        logits, d, wide, kept = _parts(ctx)
        d = torch.where(kept[:, None], d, 0.0) * (grad.reshape(-1)[0].to(wide) / ctx.tau)  # MUTANT
        return d.reshape(logits.shape).to(logits.dtype), None, None, None


class TemperatureForgotten(TokenLogprobs):
    """The backward leaves out the 1/τ of the chain rule (right at τ = 1)."""

    @staticmethod
    def backward(ctx, grad):
        logits, d, wide, kept = _parts(ctx)
        g = torch.where(kept, grad.reshape(-1).to(wide), 0.0)
        d = d * g[:, None]  # MUTANT: no / τ
        return d.reshape(logits.shape).to(logits.dtype), None, None, None


class IgnoredTokensLeak(TokenLogprobs):
    """Ignored tokens get the gradient of class 0 (right when no token is ignored)."""

    @staticmethod
    def backward(ctx, grad):
        logits, d, wide, _kept = _parts(ctx)
        d = d * (grad.reshape(-1).to(wide)[:, None] / ctx.tau)  # MUTANT: no mask
        return d.reshape(logits.shape).to(logits.dtype), None, None, None
