"""Fused linear + cross-entropy Functions with hand-written backwards: a plain one,
``forward(ctx, hidden, weight, target, ignore_index, reduction)``, that walks the rows one
at a time; one with Liger's signature (``_input, weight, target, bias=None, ce_weight=None,
ignore_index=-100, …, reduction="mean", …``) that walks them in chunks of :data:`CHUNK`
and adds each chunk's ``dW`` into one buffer; and mutants (``# MUTANT``).

fp32 inside (fp64 stays fp64), rounded once. A row's logits, loss and ``dh`` come from
calls of one fixed shape per row (``mv`` of ``W`` with that row), so its bits never depend
on how many rows the batch holds.
"""

from __future__ import annotations

import torch

CHUNK = 4  # rows per chunk: the default shape's 10 rows are three chunks


def _wide(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.promote_types(t.dtype, torch.float32))


def _row(h: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None
         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One row's logits, ``lse`` and ``softmax``."""
    z = torch.mv(w, h)
    if b is not None:
        z = z + b
    m = z.max()
    e = torch.exp(z - m)
    s = e.sum()
    return z, m + torch.log(s), e / s


def _losses(h2, w, b, target, ignore_index):
    out = torch.zeros(h2.shape[0], dtype=h2.dtype, device=h2.device)
    for i in range(h2.shape[0]):
        t = int(target[i])
        if t != ignore_index:
            z, lse, _ = _row(h2[i], w, b)
            out[i] = lse - z[t]
    return out


def _reduce(loss, valid, reduction):
    if reduction == "none":
        return loss
    total = loss.sum()
    return total if reduction == "sum" else total / valid.sum().clamp(min=1)


def _scale(grad, valid, reduction, count):
    """Each row's share of the cotangent (0 for an ignored row)."""
    g = grad.reshape(-1) if reduction == "none" else grad.reshape(()).expand(valid.shape)
    if reduction == "mean":
        g = g / count
    return torch.where(valid, g, torch.zeros_like(g))


def _chunks(h2, w, b, target, ignore_index, scale, chunk):
    """``dh`` (row by row) and each chunk's share of ``dW`` and ``db``."""
    n = h2.shape[0]
    dh = torch.zeros_like(h2)
    parts = []
    for start in range(0, n, chunk):
        rows = range(start, min(start + chunk, n))
        d = torch.zeros(len(rows), w.shape[0], dtype=h2.dtype, device=h2.device)
        for j, i in enumerate(rows):
            t = int(target[i])
            if t == ignore_index:
                continue
            _, _, p = _row(h2[i], w, b)
            p[t] -= 1.0
            d[j] = p * scale[i]
            dh[i] = torch.mv(w.t(), d[j])
        parts.append((d.t() @ h2[start:start + len(rows)], d.sum(0)))
    return dh, parts


def _total(parts, k):
    out = torch.zeros_like(parts[0][k])
    for p in parts:  # chunk by chunk, in order
        out += p[k]
    return out


def _saved(ctx):
    hidden, weight, bias, target = ctx.saved_tensors
    h2 = _wide(hidden.reshape(-1, hidden.shape[-1]))
    return (hidden, weight, h2, _wide(weight), _wide(bias) if bias is not None else None,
            target.reshape(-1))


def _forward(ctx, hidden, weight, target, bias, ignore_index, reduction):
    h2 = _wide(hidden.reshape(-1, hidden.shape[-1]))
    b = _wide(bias) if bias is not None else None
    t = target.reshape(-1)
    loss = _reduce(_losses(h2, _wide(weight), b, t, ignore_index), t != ignore_index,
                   reduction)
    ctx.save_for_backward(hidden, weight, bias, target)
    ctx.args = (ignore_index, reduction)
    return (loss.reshape(target.shape) if reduction == "none" else loss).to(hidden.dtype)


def _grads(ctx, grad, chunk, count_all=False, last_chunk_only=False):
    hidden, weight, h2, w, b, t = _saved(ctx)
    ignore_index, reduction = ctx.args
    valid = t != ignore_index
    count = valid.numel() if count_all else valid.sum().clamp(min=1)
    scale = _scale(_wide(grad), valid, reduction, count)
    dh, parts = _chunks(h2, w, b, t, ignore_index, scale, chunk)
    dw = parts[-1][0] if last_chunk_only else _total(parts, 0)
    db = _total(parts, 1).to(hidden.dtype) if b is not None else None
    return dh.reshape(hidden.shape).to(hidden.dtype), dw.to(weight.dtype), db


class FusedLinearCrossEntropy(torch.autograd.Function):
    """Row by row, no bias."""

    @staticmethod
    def forward(ctx, hidden, weight, target, ignore_index, reduction):
        return _forward(ctx, hidden, weight, target, None, ignore_index, reduction)

    @staticmethod
    def backward(ctx, grad):
        dh, dw, _ = _grads(ctx, grad, chunk=1)
        return dh, dw, None, None, None


class ChunkedFusedLinearCrossEntropy(torch.autograd.Function):
    """Liger's signature; rows in chunks of :data:`CHUNK`, ``dW`` and ``db`` added chunk by
    chunk. Takes none of the extra options (class weights, z-loss, smoothing, softcap)."""

    @staticmethod
    def forward(ctx, _input, weight, target, bias=None, ce_weight=None, ignore_index=-100,
                lse_square_scale=0.0, label_smoothing=0.0, reduction="mean", softcap=None,
                return_z_loss=False):
        if ce_weight is not None or lse_square_scale or label_smoothing or softcap:
            raise NotImplementedError("class weights, z-loss, smoothing, softcap")
        return _forward(ctx, _input, weight, target, bias, ignore_index, reduction)

    @staticmethod
    def backward(ctx, grad):
        return _liger_out(ctx, grad)


def _liger_out(ctx, grad, **mutant):
    dh, dw, db = _grads(ctx, grad, CHUNK, **mutant)
    return (dh, dw, None, db, *([None] * 7))


class DweightOneChunk(ChunkedFusedLinearCrossEntropy):
    """dW is the last chunk's share alone (right while every row fits one chunk)."""

    @staticmethod
    def backward(ctx, grad):
        return _liger_out(ctx, grad, last_chunk_only=True)  # MUTANT


class MeanOverAllRows(ChunkedFusedLinearCrossEntropy):
    """The backward's mean divides by every row, ignored ones included."""

    @staticmethod
    def backward(ctx, grad):
        return _liger_out(ctx, grad, count_all=True)  # MUTANT


class AssumesGradOne(ChunkedFusedLinearCrossEntropy):
    """The backward never reads grad_output (right while it is 1.0)."""

    @staticmethod
    def backward(ctx, grad):
        return _liger_out(ctx, torch.ones_like(grad))  # MUTANT
