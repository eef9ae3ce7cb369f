"""Fused linear + cross-entropy Functions with hand-written backwards: a plain one,
``forward(ctx, hidden, weight, target, ignore_index, reduction)``, that walks the rows one
at a time; one with Liger 0.8.5's signature (``_input, weight, target, bias=None,
ce_weight=None, ignore_index=-100, lse_square_scale=0.0, label_smoothing=0.0,
reduction="mean", softcap=None, return_z_loss=False, …``, returning ``(loss, z_loss,
token_accuracy, predicted_tokens)``) that takes every option, walks the rows in chunks of
:data:`CHUNK` and adds each chunk's ``dW`` into one buffer; and mutants (``# MUTANT``).

A row's loss, with ``z = W h + b`` (``z ← c·tanh(z/c)`` under a softcap ``c``), ``p =
softmax z``, class weights ``w`` (all 1 when none; ``W = Σ_j w_j``), smoothing ``ε`` and
the z-loss scale ``s``::

    ce = (1 − ε) w_t (lse − z_t) + ε/V Σ_j w_j (lse − z_j)     zl = s lse²
    ∂ce/∂z = (1 − ε) w_t (p − e_t) + ε/V (W p − w)             ∂zl/∂z = 2 s lse p

each through ``1 − tanh²`` under a softcap. ``mean`` divides the ``ce`` terms by the
targets' weights and the z-loss by the rows (both over the rows not ignored).

fp32 inside (fp64 stays fp64), rounded once. A row's logits, loss and ``dh`` come from
calls of one fixed shape per row (``mv`` of ``W`` with that row), so its bits never depend
on how many rows the batch holds.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

CHUNK = 4  # rows per chunk: the default shape's 10 rows are three chunks


@dataclass(frozen=True)
class Options:
    ignore_index: int = -100
    reduction: str = "mean"
    label_smoothing: float = 0.0
    softcap: float | None = None
    lse_square_scale: float = 0.0
    class_weight: torch.Tensor | None = None


def _wide(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.promote_types(t.dtype, torch.float32))


def _row(h, w, b, t, o, chain=True, z_grad=True):
    """One row's ``ce`` and ``zl`` and their gradients with respect to its logits (``chain``:
    through the softcap's ``1 − tanh²``; ``z_grad``: the z-loss's term in it)."""
    z = torch.mv(w, h)
    if b is not None:
        z = z + b
    if o.softcap:
        th = torch.tanh(z / o.softcap)
        z = o.softcap * th
    m = z.max()
    e = torch.exp(z - m)
    s = e.sum()
    lse = m + torch.log(s)
    p = e / s
    v = z.numel()
    cw = o.class_weight
    wt = cw[t] if cw is not None else 1.0
    eps = o.label_smoothing
    ce = (1 - eps) * wt * (lse - z[t])
    dce = (1 - eps) * wt * p
    dce[t] -= (1 - eps) * wt
    if eps:
        if cw is not None:
            ce = ce + eps * (cw * (lse - z)).sum() / v
            dce = dce + eps * (cw.sum() * p - cw) / v
        else:
            ce = ce + eps * (lse - z.mean())
            dce = dce + eps * (p - 1.0 / v)
    zl = o.lse_square_scale * lse * lse
    dzl = 2 * o.lse_square_scale * lse * p if z_grad else torch.zeros_like(p)
    if o.softcap and chain:
        slope = 1 - th * th
        dce, dzl = dce * slope, dzl * slope
    return ce, zl, dce, dzl


def _weights(t, o, dtype):
    """Each row's target weight (0 for an ignored row) and whether it is counted."""
    valid = t != o.ignore_index
    safe = torch.where(valid, t, 0)
    wt = o.class_weight[safe] if o.class_weight is not None else torch.ones(
        t.shape, dtype=dtype, device=t.device)
    return torch.where(valid, wt, 0.0), valid


def _losses(h2, w, b, t, o):
    """Each row's ``ce`` and ``zl`` (0 for an ignored row), one row at a time."""
    ce = torch.zeros(h2.shape[0], dtype=h2.dtype, device=h2.device)
    zl = torch.zeros_like(ce)
    for i in range(h2.shape[0]):
        ti = int(t[i])
        if ti != o.ignore_index:
            ce[i], zl[i], _, _ = _row(h2[i], w, b, ti, o)
    return ce, zl


def _reduce(ce, zl, t, o):
    if o.reduction == "none":
        return ce + zl
    if o.reduction == "sum":
        return (ce + zl).sum()
    wt, valid = _weights(t, o, ce.dtype)
    return ce.sum() / wt.sum() + zl.sum() / valid.sum().clamp(min=1)


def _shares(grad, t, o, dtype, count_all):
    """Each row's share of the cotangent for its ``ce`` and for its ``zl`` (0 for an ignored
    row): ``g_i``, ``g``, or ``g`` over the targets' weights and over the rows (``mean``;
    ``count_all``: over every row, ignored ones included)."""
    wt, valid = _weights(t, o, dtype)
    g = grad.reshape(-1) if o.reduction == "none" else grad.reshape(()).expand(t.shape)
    g_ce, g_zl = g, g
    if o.reduction == "mean":
        g_ce = g / (t.numel() if count_all else wt.sum())
        g_zl = g / (t.numel() if count_all else valid.sum().clamp(min=1))
    zero = torch.zeros_like(g)
    return torch.where(valid, g_ce, zero), torch.where(valid, g_zl, zero)


def _chunks(h2, w, b, t, o, shares, chunk, kept_in=None, **row):
    """``dh`` (row by row) and each chunk's share of ``dW`` and ``db`` (``kept_in``: the
    logits' gradient rounded to that dtype before the products that use it)."""
    n = h2.shape[0]
    dh = torch.zeros_like(h2)
    parts = []
    for start in range(0, n, chunk):
        rows = range(start, min(start + chunk, n))
        d = torch.zeros(len(rows), w.shape[0], dtype=h2.dtype, device=h2.device)
        for j, i in enumerate(rows):
            ti = int(t[i])
            if ti == o.ignore_index:
                continue
            _, _, dce, dzl = _row(h2[i], w, b, ti, o, **row)
            d[j] = dce * shares[0][i] + dzl * shares[1][i]
            if kept_in is not None:
                d[j] = d[j].to(kept_in).to(d.dtype)
            dh[i] = torch.mv(w.t(), d[j])
        parts.append((d.t() @ h2[start:start + len(rows)], d.sum(0)))
    return dh, parts


def _total(parts, k):
    out = torch.zeros_like(parts[0][k])
    for p in parts:  # chunk by chunk, in order
        out += p[k]
    return out


def _forward(ctx, hidden, weight, target, bias, o):
    h2 = _wide(hidden.reshape(-1, hidden.shape[-1]))
    cw = _wide(o.class_weight) if o.class_weight is not None else None
    wide = Options(o.ignore_index, o.reduction, o.label_smoothing, o.softcap,
                   o.lse_square_scale, cw)
    t = target.reshape(-1)
    b = _wide(bias) if bias is not None else None
    loss = _reduce(*_losses(h2, _wide(weight), b, t, wide), t, wide)
    ctx.save_for_backward(hidden, weight, bias, target)
    ctx.options = wide
    return (loss.reshape(target.shape) if o.reduction == "none" else loss).to(hidden.dtype)


def _grads(ctx, grad, chunk, count_all=False, last_chunk_only=False, lowp_grad=False,
           **row):
    hidden, weight, bias, target = ctx.saved_tensors
    o = ctx.options
    h2 = _wide(hidden.reshape(-1, hidden.shape[-1]))
    b = _wide(bias) if bias is not None else None
    t = target.reshape(-1)
    shares = _shares(_wide(grad), t, o, h2.dtype, count_all)
    kept_in = hidden.dtype if lowp_grad else None
    dh, parts = _chunks(h2, _wide(weight), b, t, o, shares, chunk, kept_in, **row)
    dw = parts[-1][0] if last_chunk_only else _total(parts, 0)
    db = _total(parts, 1).to(hidden.dtype) if b is not None else None
    return dh.reshape(hidden.shape).to(hidden.dtype), dw.to(weight.dtype), db


class FusedLinearCrossEntropy(torch.autograd.Function):
    """Row by row, no bias, no options."""

    @staticmethod
    def forward(ctx, hidden, weight, target, ignore_index, reduction):
        return _forward(ctx, hidden, weight, target, None, Options(ignore_index, reduction))

    @staticmethod
    def backward(ctx, grad):
        dh, dw, _ = _grads(ctx, grad, chunk=1)
        return dh, dw, None, None, None


class ChunkedFusedLinearCrossEntropy(torch.autograd.Function):
    """Liger 0.8.5's signature and outputs; rows in chunks of :data:`CHUNK`, ``dW`` and
    ``db`` added chunk by chunk; class weights, z-loss, smoothing and softcap taken (the
    z-loss it returns is the sum of the rows', as Liger's under a scalar reduction)."""

    @staticmethod
    def forward(ctx, _input, weight, target, bias=None, ce_weight=None, ignore_index=-100,
                lse_square_scale=0.0, label_smoothing=0.0, reduction="mean", softcap=None,
                return_z_loss=False, accum_dtype=None, use_token_scaling=False,
                return_token_accuracy=False, return_predicted_tokens=False, ce_impl=None,
                ce_mode=None, chunk_mem_const=1):
        if use_token_scaling or return_token_accuracy or return_predicted_tokens:
            raise NotImplementedError("token scaling, accuracy, predicted tokens")
        o = Options(ignore_index, reduction, label_smoothing, softcap, lse_square_scale,
                    ce_weight)
        loss = _forward(ctx, _input, weight, target, bias, o)
        z_loss = None
        if return_z_loss:
            h2 = _wide(_input.reshape(-1, _input.shape[-1]))
            zl = _losses(h2, _wide(weight), _wide(bias) if bias is not None else None,
                         target.reshape(-1), ctx.options)[1]
            z_loss = (zl if reduction == "none" else zl.sum()).to(_input.dtype)
        return loss, z_loss, None, None

    @staticmethod
    def backward(ctx, grad, *unused):
        return _liger_out(ctx, grad)


def _liger_out(ctx, grad, **mutant):
    dh, dw, db = _grads(ctx, grad, CHUNK, **mutant)
    return (dh, dw, None, db, *([None] * 14))


class DweightOneChunk(ChunkedFusedLinearCrossEntropy):
    """dW is the last chunk's share alone (right while every row fits one chunk)."""

    @staticmethod
    def backward(ctx, grad, *unused):
        return _liger_out(ctx, grad, last_chunk_only=True)  # MUTANT


class MeanOverAllRows(ChunkedFusedLinearCrossEntropy):
    """The backward's mean divides by every row, ignored ones included."""

    @staticmethod
    def backward(ctx, grad, *unused):
        return _liger_out(ctx, grad, count_all=True)  # MUTANT


class AssumesGradOne(ChunkedFusedLinearCrossEntropy):
    """The backward never reads grad_output (right while it is 1.0)."""

    @staticmethod
    def backward(ctx, grad, *unused):
        return _liger_out(ctx, torch.ones_like(grad))  # MUTANT


class SoftcapChainForgotten(ChunkedFusedLinearCrossEntropy):
    """The backward leaves out the softcap's ``1 − tanh²`` (right without a softcap)."""

    @staticmethod
    def backward(ctx, grad, *unused):
        return _liger_out(ctx, grad, chain=False)  # MUTANT


class ZLossGradForgotten(ChunkedFusedLinearCrossEntropy):
    """The backward leaves out the z-loss's ``2 s lse p`` (right at ``s = 0``)."""

    @staticmethod
    def backward(ctx, grad, *unused):
        return _liger_out(ctx, grad, z_grad=False)  # MUTANT


class GradLogitsInInputDtype(ChunkedFusedLinearCrossEntropy):
    """The logits' gradient is stored in the input's dtype (bf16) between the softmax and
    the products that make ``dh``, ``dW`` and ``db`` (right in fp32 and fp64, where that
    dtype is the one it computes in)."""

    @staticmethod
    def backward(ctx, grad, *unused):
        return _liger_out(ctx, grad, lowp_grad=True)  # MUTANT
