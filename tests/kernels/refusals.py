"""Plain-torch stand-ins for Liger-Kernel 0.8.5 and fla-core 0.6.0 autograd Functions that are
no op of the tool, each with the real ``forward`` signature (the real ones run on CUDA only).

Each computes what the real kernel computes (approximately: the math, not the Triton), and
its backward is autograd's through a plain-torch forward (:func:`_through`), so that a
refusal, not a failed check, is what a test of them sees. Where a real one is a gated norm
with an ``is_rms_norm`` switch, both branches are here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F


def _through(fn: Callable[..., Any], ctx: Any, *args: Any) -> Any:
    """``fn(*args)`` with its graph kept for :func:`_back` (a Function's backward by
    autograd)."""
    with torch.enable_grad():
        leaves = [a.detach().requires_grad_() if isinstance(a, torch.Tensor)
                  and a.is_floating_point() else a for a in args]
        out = fn(*leaves)
    ctx.leaves, ctx.out = leaves, out
    return tuple(o.detach() for o in out) if isinstance(out, tuple) else out.detach()


def _back(ctx: Any, *grads: Any) -> tuple[Any, ...]:
    outs = ctx.out if isinstance(ctx.out, tuple) else (ctx.out,)
    pairs = [(o, g) for o, g in zip(outs, grads, strict=True) if g is not None]
    wanted = [a for a in ctx.leaves if isinstance(a, torch.Tensor) and a.requires_grad]
    got = iter(torch.autograd.grad([o for o, _ in pairs], wanted, [g for _, g in pairs],
                                   allow_unused=True))
    return tuple(next(got) if isinstance(a, torch.Tensor) and a.requires_grad else None
                 for a in ctx.leaves)


def _rms(u: torch.Tensor, eps: float) -> torch.Tensor:
    return u * torch.rsqrt(u.pow(2).mean(-1, keepdim=True) + eps)


def _powglu(x: torch.Tensor, y: torch.Tensor, power: float) -> torch.Tensor:
    s = torch.sigmoid(x)
    xp = torch.where(x > 0, x, torch.ones_like(x))
    return torch.where(x > 0, xp.pow(power / (xp.sqrt() + 1)) * s, x * s) * y


class PowGLUFunction(torch.autograd.Function):
    """fla.modules.activations.ops: ``g(x) · y``, ``g(x) = x^(p/(√x+1))·σ(x)`` for x > 0,
    else ``x·σ(x)``."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, y: torch.Tensor, power: float) -> torch.Tensor:
        return _through(lambda a, b: _powglu(a, b, power), ctx, x, y)  # type: ignore[no-any-return]

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor) -> Any:
        return (*_back(ctx, dout), None)


def _glu_linear(act: Any, ctx: Any, x: torch.Tensor, y: torch.Tensor, weight: torch.Tensor,
                bias: torch.Tensor) -> torch.Tensor:
    """``(act(x) · y) Wᵀ + b`` through :func:`_through`."""
    return _through(lambda a, b, w, c: F.linear(act(a) * b, w, c),  # type: ignore[no-any-return]
                    ctx, x, y, weight, bias)


class SwiGLULinearFunction(torch.autograd.Function):
    """fla: ``(swish(x) · y) Wᵀ + b``."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, y: torch.Tensor, weight: torch.Tensor,
                bias: torch.Tensor) -> torch.Tensor:
        return _glu_linear(F.silu, ctx, x, y, weight, bias)

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor, *args: Any) -> Any:
        return _back(ctx, dout)


class SigmoidGLULinearFunction(SwiGLULinearFunction):
    """fla: ``(σ(x) · y) Wᵀ + b`` (the same backward)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, y: torch.Tensor, weight: torch.Tensor,
                bias: torch.Tensor) -> torch.Tensor:
        return _glu_linear(torch.sigmoid, ctx, x, y, weight, bias)


class LigerDyTFunction(torch.autograd.Function):
    """Liger's DyT: ``γ·tanh(α x) + β``, α a 1-element tensor."""

    @staticmethod
    def forward(ctx, x, alpha, gamma, beta):  # type: ignore[no-untyped-def]
        return _through(lambda a, al, g, b: g * torch.tanh(al * a) + b, ctx, x, alpha, gamma,
                        beta)

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> Any:
        return _back(ctx, dy)


class LigerFusedCETVDFunction(torch.autograd.Function):
    """Liger: per-token cross-entropy and total variation distance ``(ce, tvd)``, both
    ``(BT,)``; the teacher's logits a constant."""

    @staticmethod
    def forward(ctx: Any, student_logits: torch.Tensor, teacher_logits: torch.Tensor,
                target: torch.Tensor, ignore_index: int = -100
                ) -> tuple[torch.Tensor, torch.Tensor]:
        if student_logits.shape != teacher_logits.shape:
            raise ValueError("student_logits and teacher_logits must have the same shape. "
                             f"Got {tuple(student_logits.shape)} and "
                             f"{tuple(teacher_logits.shape)}.")
        if student_logits.ndim != 2:
            raise ValueError(f"student_logits must be 2D (BT, V); got {student_logits.ndim}D.")

        def both(s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            keep = target != ignore_index
            ce = F.cross_entropy(s, target.clamp(min=0), reduction="none") * keep
            p, q = s.softmax(-1), teacher_logits.detach().softmax(-1)
            return ce, 0.5 * (p - q).abs().sum(-1) * keep

        return _through(both, ctx, student_logits)  # type: ignore[no-any-return]

    @staticmethod
    def backward(ctx: Any, dce: torch.Tensor, dtvd: torch.Tensor) -> Any:
        return (*_back(ctx, dce, dtvd), None, None, None)


class LigerLlama4RopeFunction(torch.autograd.Function):
    """Liger: Llama-4's rotary embedding of q and k by complex ``freqs_cis``
    ``(seq, head_dim/2)``."""

    @staticmethod
    def forward(ctx, q, k, freqs_cis, BLOCK_SIZE: int | None = None):  # type: ignore[no-untyped-def]
        def rotate(t: torch.Tensor) -> torch.Tensor:
            pairs = torch.view_as_complex(t.reshape(*t.shape[:-1], -1, 2).contiguous())
            f = freqs_cis.reshape(1, pairs.shape[1], 1, -1)
            return torch.view_as_real(pairs * f).flatten(-2)

        return _through(lambda a, b: (rotate(a), rotate(b)), ctx, q, k)

    @staticmethod
    def backward(ctx: Any, dq: torch.Tensor, dk: torch.Tensor) -> Any:
        return (*_back(ctx, dq, dk), None, None)


class LigerMHCPostResFunction(torch.autograd.Function):
    """Liger's manifold hyper-connection post/residual step: ``x`` ``(…, HC, C)`` mixed by
    ``h_res`` ``(…, HC, HC)`` plus ``h_post`` ``(…, HC)`` times ``f_out`` ``(…, C)``."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, f_out: torch.Tensor, h_post: torch.Tensor,
                h_res: torch.Tensor) -> torch.Tensor:
        n_hc, c = x.shape[-2], x.shape[-1]
        x_flat = x.reshape(-1, n_hc, c)
        f_flat = f_out.view(-1, c)
        h_post_flat = h_post.view(-1, n_hc)
        h_res_flat = h_res.view(-1, n_hc, n_hc)

        def mix(a: torch.Tensor, f: torch.Tensor, hp: torch.Tensor, hr: torch.Tensor
                ) -> torch.Tensor:
            return (hr @ a + hp[..., None] * f[:, None, :]).view(x.shape)

        return _through(mix, ctx, x_flat, f_flat, h_post_flat, h_res_flat)  # type: ignore[no-any-return]

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> Any:
        dx, df, dhp, dhr = _back(ctx, grad_out)
        return dx, df, dhp, dhr


class LigerPolyNormFunction(torch.autograd.Function):
    """Liger's PolyNorm: ``w₀·rms(x³) + w₁·rms(x²) + w₂·rms(x) + b``, ``W`` of shape (3,)."""

    @staticmethod
    def forward(ctx, X, W, B, eps=1e-6, in_place=True):  # type: ignore[no-untyped-def]
        assert W.shape == (3,), "Weight tensor must have shape (3,)"
        return _through(lambda x, w, b: w[0] * _rms(x ** 3, eps) + w[1] * _rms(x ** 2, eps)
                        + w[2] * _rms(x, eps) + b, ctx, X, W, B)

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> Any:
        return (*_back(ctx, grad_output), None, None)


def _gated_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                eps: float, is_rms_norm: bool) -> torch.Tensor:
    u = x if is_rms_norm else x - x.mean(-1, keepdim=True)
    y = _rms(u, eps) * weight
    return y if bias is None else y + bias


class LayerNormGatedFunction(torch.autograd.Function):
    """fla.modules.norm.fused_norm_gate: ``(norm(x)·γ + β) · act(g)`` with ``act`` swish
    (silu) or sigmoid; a layer norm unless ``is_rms_norm``."""

    @staticmethod
    def forward(ctx, x, g, weight, bias, activation, residual=None, eps=1e-6,  # type: ignore[no-untyped-def]
                prenorm=False, residual_in_fp32=False, is_rms_norm=False):
        if activation not in ("swish", "silu", "sigmoid"):
            raise ValueError(f"Unsupported activation: {activation}")
        act = torch.sigmoid if activation == "sigmoid" else F.silu

        def fwd(a, gate, w, b, r):  # type: ignore[no-untyped-def]
            s = a if r is None else a + r
            y = _gated_norm(s, w, b, eps, is_rms_norm) * act(gate)
            return (y, s) if prenorm else y

        return _through(fwd, ctx, x, g, weight, bias, residual)

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor, *args: Any) -> Any:
        dx, dg, dw, db, dres = _back(ctx, dy, *args)
        return dx, dg, dw, db, None, dres, None, None, None, None


class LayerNormFn(torch.autograd.Function):
    """fla.modules.norm.layernorm_gated (Mamba-2's): norm then ``· silu(z)``
    (``norm_before_gate``), or the norm of ``x · silu(z)``; per group of ``group_size``;
    a layer norm unless ``is_rms_norm``."""

    @staticmethod
    def forward(ctx, x, weight, bias, z=None, eps=1e-6, group_size=None,  # type: ignore[no-untyped-def]
                norm_before_gate=True, is_rms_norm=False):
        d = x.shape[-1]
        g = d if group_size is None else group_size

        def fwd(a, w, b, gate):  # type: ignore[no-untyped-def]
            if gate is not None and not norm_before_gate:
                a = a * F.silu(gate)
            parts = a.unflatten(-1, (d // g, g))
            y = _gated_norm(parts, torch.ones(g, dtype=a.dtype), None, eps, is_rms_norm)
            y = y.flatten(-2) * w + (0 if b is None else b)
            return y * F.silu(gate) if gate is not None and norm_before_gate else y

        return _through(fwd, ctx, x, weight, bias, z)

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> Any:
        return (*_back(ctx, dy), None, None, None, None)


# Refused today with a norm's wording ("name the parameters x, weight, eps"): one input,
# or parameters no op of the tool takes.


class SigmoidFunction(torch.autograd.Function):
    """fla: ``σ(x)``."""

    @staticmethod
    def forward(ctx, x):  # type: ignore[no-untyped-def]
        return _through(torch.sigmoid, ctx, x)

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> Any:
        return _back(ctx, dy)


class LigerSoftmaxFunction(torch.autograd.Function):
    """Liger: softmax over the last axis."""

    @staticmethod
    def forward(ctx, input_: torch.Tensor):  # type: ignore[no-untyped-def]
        return _through(lambda a: a.softmax(-1), ctx, input_)

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> Any:
        return _back(ctx, grad_output)


class LigerRopeFunction(torch.autograd.Function):
    """Liger: rotary embedding of q and k ``(B, H, T, D)`` by cos, sin ``(B, T, D)``."""

    @staticmethod
    def forward(ctx, q, k, cos, sin, position_ids=None, unsqueeze_dim=1, rotary_dim=None):  # type: ignore[no-untyped-def]
        c, s = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)

        def rot(t: torch.Tensor) -> torch.Tensor:
            a, b = t.chunk(2, -1)
            return t * c + torch.cat((-b, a), -1) * s

        return _through(lambda a, b: (rot(a), rot(b)), ctx, q, k)

    @staticmethod
    def backward(ctx: Any, dq: torch.Tensor, dk: torch.Tensor) -> Any:
        return (*_back(ctx, dq, dk), None, None, None, None, None)


class LigerFusedMoEFunction(torch.autograd.Function):
    """Liger: a mixture of experts, ``x`` routed to ``top_k_index`` experts."""

    @staticmethod
    def forward(ctx, x, gate_up_proj, down_proj, top_k_index, top_k_weights):  # type: ignore[no-untyped-def]
        def moe(a, gu, dn, wts):  # type: ignore[no-untyped-def]
            out = torch.zeros_like(a)
            for j in range(top_k_index.shape[-1]):
                e = top_k_index[:, j]
                gate, up = (a[:, None, :] @ gu[e]).squeeze(1).chunk(2, -1)
                out = out + wts[:, j, None] * (
                    (F.silu(gate) * up)[:, None, :] @ dn[e]).squeeze(1)
            return out

        return _through(moe, ctx, x, gate_up_proj, down_proj, top_k_weights)

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> Any:
        dx, dgu, ddn, dw = _back(ctx, dy)
        return dx, dgu, ddn, None, dw
