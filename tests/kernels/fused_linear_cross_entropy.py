"""Fused linear + cross-entropy Functions with hand-written backwards: a plain one,
``forward(ctx, hidden, weight, target, ignore_index, reduction)``, that adds ``dW`` row by
row; one with Liger 0.8.5's signature (``_input, weight, target, bias=None,
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

fp32 inside (fp64 stays fp64), rounded once. Every row at once but its two products with
``W``, and a row's bits never depend on how many rows the batch holds or where the row sits
in it: its logits and ``dh`` are one ``mv`` each of a fresh copy of the row
(:func:`_mv_rows`), its sums over V pairwise trees (:func:`tree_sum`, an order fixed by the
length alone), its ``exp`` and ``tanh`` built from +, −, ×, ÷ and exact scalings
(:func:`_reduced`: torch's CPU ``exp``/``tanh`` take a vector or a scalar path by position,
one ulp apart), its ``log`` one Python ``math.log``. ``dW`` and ``db`` add each chunk's
share.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from tests.kernels.log_softmax import tree_sum

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


def _mv_rows(m: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """``m @ a_i`` for each row ``a_i`` of ``a``: one ``mv`` per row, of a fresh copy of the
    row (BLAS's ``gemv`` rounds by where its vector starts: a row at another position in
    its buffer gave other bits, a fresh copy starts aligned alike wherever its row sits)."""
    rows = [torch.mv(m, r.clone(memory_format=torch.contiguous_format)) for r in a]
    return torch.stack(rows) if rows else a.new_zeros(0, m.shape[0])


def _reduced(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(q, k)`` with ``exp(t) = 2^k (1 + q)`` (fp64), from +, −, ×, ÷ only: ``t = k ln2 +
    r``, ``|r| ≤ ln2 / 2``, ``q = exp(r) − 1 = r (1 + r/2 (1 + r/3 (…)))`` by Horner to
    degree 17."""
    t = t.to(torch.float64).clamp(-745.0, 709.0)
    k = torch.round(t * 1.4426950408889634)
    r = (t - k * 0.693145751953125) - k * 1.4286068203094173e-06
    q = torch.ones_like(r)
    for n in range(17, 1, -1):
        q = 1.0 + q * r / n
    return q * r, k


def _exp(t: torch.Tensor) -> torch.Tensor:
    """``exp t`` in fp64, rounded to ``t``'s dtype (:func:`_reduced`)."""
    q, k = _reduced(t)
    return torch.ldexp(1.0 + q, k).to(t.dtype)


def _tanh(x: torch.Tensor) -> torch.Tensor:
    """``tanh x = sign(x) e / (e + 2)``, ``e = expm1(2|x|) = 2^k q + (2^k − 1)`` (fp64,
    :func:`_reduced`; ``tanh = ±1`` past 40), rounded to ``x``'s dtype."""
    q, k = _reduced(2.0 * x.to(torch.float64).abs().clamp(max=40.0))
    e = torch.ldexp(q, k) + (torch.ldexp(torch.ones_like(k), k) - 1.0)
    return (torch.sign(x) * e / (e + 2.0)).to(x.dtype)


def _rows(h, w, b, t, o, chain=True, z_grad=True):
    """Each row's ``ce`` and ``zl`` and their gradients with respect to its logits (``chain``:
    through the softcap's ``1 − tanh²``; ``z_grad``: the z-loss's term in it); ``t``: each
    row's target (any class of an ignored row)."""
    z = _mv_rows(w, h)
    if b is not None:
        z = z + b
    if o.softcap:
        th = _tanh(z / o.softcap)
        z = o.softcap * th
    m = z.max(-1, keepdim=True).values
    e = _exp(z - m)
    s = tree_sum(e)
    log_s = torch.tensor([math.log(v) for v in s.tolist()], dtype=torch.float64)
    lse = m[:, 0] + log_s.to(s.device, s.dtype)
    p = e / s[:, None]
    v = z.shape[-1]
    cw = o.class_weight
    wt = cw[t] if cw is not None else torch.ones_like(lse)
    eps = o.label_smoothing
    at_t = (1 - eps) * wt
    ce = at_t * (lse - z.gather(1, t[:, None])[:, 0])
    dce = at_t[:, None] * p - at_t[:, None] * torch.nn.functional.one_hot(t, v).to(p.dtype)
    if eps:
        if cw is not None:
            ce = ce + eps * tree_sum(cw * (lse[:, None] - z)) / v
            dce = dce + eps * (cw.sum() * p - cw) / v
        else:
            ce = ce + eps * (lse - tree_sum(z) / v)
            dce = dce + eps * (p - 1.0 / v)
    zl = o.lse_square_scale * lse * lse
    dzl = (2 * o.lse_square_scale * lse)[:, None] * p if z_grad else torch.zeros_like(p)
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
    """Each row's ``ce`` and ``zl`` (0 for an ignored row)."""
    valid = t != o.ignore_index
    ce, zl, _, _ = _rows(h2, w, b, torch.where(valid, t, 0), o)
    zero = torch.zeros_like(ce)
    return torch.where(valid, ce, zero), torch.where(valid, zl, zero)


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
    """``dh`` and each chunk's share of ``dW`` and ``db`` (``kept_in``: the logits' gradient
    rounded to that dtype before the products that use it)."""
    valid = t != o.ignore_index
    _, _, dce, dzl = _rows(h2, w, b, torch.where(valid, t, 0), o, **row)
    d = torch.where(valid[:, None], dce * shares[0][:, None] + dzl * shares[1][:, None], 0.0)
    if kept_in is not None:
        d = d.to(kept_in).to(d.dtype)
    dh = _mv_rows(w.t(), d)
    parts = [(d[i:i + chunk].t() @ h2[i:i + chunk], d[i:i + chunk].sum(0))
             for i in range(0, h2.shape[0], chunk)]
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
