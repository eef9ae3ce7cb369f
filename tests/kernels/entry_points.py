"""Stand-ins for real libraries' entry points, written with torch alone on their shipped
signatures (names, order, defaults): what a user points the tool at with no flags.

Each computes what its library documents, on CPU, in ``promote(dtype, float32)``; a
Function's backward is written out, a module's or a function's is torch's autograd. The
transcendental functions run on padded rows (:func:`lanes`): torch's CPU ``sigmoid``/``exp``
round a vector loop's tail differently with the row count, which would be a true batch
variance of the stand-in, not of the library.

========================  ==========================================================
stand-in                  signature as shipped
========================  ==========================================================
``TritonSiluMul``         a Triton swiglu Function ``forward(ctx, A, B)``
``LigerSiLUMulFunction``  Liger 0.8.5 ``forward(ctx, a, b, gate_multiplier=1.0,
                          down_multiplier=1.0)``: ``silu(m_g a) · b · m_d``
``SiLUMul``               a Liger-style ``forward(ctx, a, b)`` swiglu, no "SwiGLU" name
``swiglu``                fla's ``swiglu = SwiGLUFunction.apply``: a Function's apply
                          exported as a function, ``forward(ctx, x, y)``
``GeluAndMulFn``          a Triton ``GeluAndMul(x, y, approximate="none")``
``l2norm``                ``l2norm(x, eps, output_dtype)``: ``x / ‖x‖``
``LigerStyleCE``          a cross-entropy Function, Liger's ``(_input, target, weight,
                          ignore_index, lse_square_scale, label_smoothing, reduction,
                          softcap, return_z_loss)``
``fused_add_layer_norm``  a fused add + LayerNorm with a bias and no backward
``rmsnorm_fn``            Mamba-2's ``rmsnorm_fn(x, weight, bias, z=None, eps=1e-6,
                          group_size=None, norm_before_gate=True)``
``rms_norm_gated``        fla's ``rms_norm_gated(x, g, weight, bias, activation='swish',
                          residual=None, prenorm=False, residual_in_fp32=False, eps=1e-6)``
``FusedRMSNormGated``     fla's module, ``activation`` in its constructor
``SiluAndMul``            vLLM's module, ``forward(x)``: ``silu(x[..., :d]) · x[..., d:]``
``GeluAndMul``            vLLM's module, ``GeluAndMul(approximate="none")``, ``forward(x)``
========================  ==========================================================

The gated norms add the bias before the gate, as Mamba-2's reference and fla's kernel do:
``norm_before_gate``: ``(rms(x)·w + b) · act(z)``; else ``rms(x·act(z))·w + b``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

LANES = 64


def lanes(fn: Callable[[torch.Tensor], torch.Tensor], t: torch.Tensor) -> torch.Tensor:
    """``fn(t)`` elementwise, every element in the vector loop whatever the batch."""
    n = t.shape[-1]
    pad = -n % LANES
    return fn(torch.nn.functional.pad(t, (0, pad)))[..., :n] if pad else fn(t)


def _wide(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.promote_types(t.dtype, torch.float32))


def _silu_parts(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``silu(a)`` and ``silu'(a) = σ (1 + a (1 − σ))``."""
    sig = lanes(torch.sigmoid, a)
    return a * sig, sig * (1 + a * (1 - sig))


class TritonSiluMul(torch.autograd.Function):
    """``silu(A) · B`` with upper-case parameters."""

    @staticmethod
    def forward(ctx: Any, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        a, b = _wide(A), _wide(B)
        ctx.save_for_backward(a, b)
        ctx.dtype = A.dtype
        return (_silu_parts(a)[0] * b).to(A.dtype)

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor, ...]:  # type: ignore[override]
        a, b = ctx.saved_tensors
        g = dy.to(a.dtype)
        s, ds = _silu_parts(a)
        return (g * b * ds).to(ctx.dtype), (g * s).to(ctx.dtype)


class SiLUMul(TritonSiluMul):
    """``silu(a) · b``: Liger's older signature, a class name without "SwiGLU"."""

    @staticmethod
    def forward(ctx: Any, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return TritonSiluMul.forward(ctx, a, b)


class SwiGLUFunction(TritonSiluMul):
    """``silu(x) · y``: fla's parameter names, exported below as its bound ``apply``."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return TritonSiluMul.forward(ctx, x, y)


swiglu = SwiGLUFunction.apply  # its signature is (*args, **kwargs)


class LigerSiLUMulFunction(torch.autograd.Function):
    """``y = silu(m_g a) · b · m_d``::

        da = g m_d b m_g silu'(m_g a),    db = g m_d silu(m_g a)
    """

    @staticmethod
    def forward(ctx: Any, a: torch.Tensor, b: torch.Tensor,  # type: ignore[override]
                gate_multiplier: float = 1.0, down_multiplier: float = 1.0) -> torch.Tensor:
        wa, wb = _wide(a), _wide(b)
        ctx.save_for_backward(wa, wb)
        ctx.m = (float(gate_multiplier), float(down_multiplier), a.dtype)
        return (_silu_parts(wa * gate_multiplier)[0] * wb * down_multiplier).to(a.dtype)

    @staticmethod
    def backward(ctx: Any, dc: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        a, b = ctx.saved_tensors
        gate, down, dtype = ctx.m
        g = dc.to(a.dtype) * down
        s, ds = _silu_parts(a * gate)
        return (g * b * ds * gate).to(dtype), (g * s).to(dtype), None, None


class LigerSiLUMulDropsGate(LigerSiLUMulFunction):
    """MUTANT: ``da`` without the gate multiplier's chain-rule factor (right at ``m_g = 1``)."""

    @staticmethod
    def backward(ctx: Any, dc: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        a, b = ctx.saved_tensors
        gate, down, dtype = ctx.m
        g = dc.to(a.dtype) * down
        s, ds = _silu_parts(a * gate)
        return (g * b * ds).to(dtype), (g * s).to(dtype), None, None  # MUTANT: no · gate


class LigerSiLUMulDropsDown(LigerSiLUMulFunction):
    """MUTANT: the backward ignores the down multiplier (right at ``m_d = 1``)."""

    @staticmethod
    def backward(ctx: Any, dc: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        a, b = ctx.saved_tensors
        gate, _, dtype = ctx.m
        g = dc.to(a.dtype)  # MUTANT: no · down
        s, ds = _silu_parts(a * gate)
        return (g * b * ds * gate).to(dtype), (g * s).to(dtype), None, None


def _gelu_parts(a: torch.Tensor, approximate: str) -> tuple[torch.Tensor, torch.Tensor]:
    if approximate == "tanh":
        c = math.sqrt(2 / math.pi)
        t = lanes(torch.tanh, c * (a + 0.044715 * a**3))
        return (0.5 * a * (1 + t),
                0.5 * (1 + t) + 0.5 * a * (1 - t * t) * c * (1 + 3 * 0.044715 * a * a))
    cdf = 0.5 * (1 + lanes(torch.erf, a / math.sqrt(2)))
    pdf = lanes(torch.exp, -0.5 * a * a) / math.sqrt(2 * math.pi)
    return a * cdf, cdf + a * pdf


class GeluAndMulFn(torch.autograd.Function):
    """``gelu(x) · y``, GELU's erf or tanh form."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, y: torch.Tensor,  # type: ignore[override]
                approximate: str = "none") -> torch.Tensor:
        a, b = _wide(x), _wide(y)
        ctx.save_for_backward(a, b)
        ctx.cfg = (approximate, x.dtype)
        return (_gelu_parts(a, approximate)[0] * b).to(x.dtype)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        a, b = ctx.saved_tensors
        approximate, dtype = ctx.cfg
        gelu, grad = _gelu_parts(a, approximate)
        gw = g.to(a.dtype)
        return (gw * b * grad).to(dtype), (gw * gelu).to(dtype), None


def l2norm(x: torch.Tensor, eps: float = 1e-6, output_dtype: torch.dtype | None = None
           ) -> torch.Tensor:
    """``x / sqrt(Σ x² + eps)`` over the last axis."""
    w = _wide(x)
    y = (w / torch.sqrt((w * w).sum(-1, keepdim=True) + eps)).to(x.dtype)
    return y if output_dtype is None else y.to(output_dtype)


def _ce(z: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None,
        ignore_index: int, lse_square_scale: float, label_smoothing: float, reduction: str,
        softcap: float | None) -> torch.Tensor:
    """Cross-entropy per Liger's documented options, row by row (batch-invariant)."""
    if softcap is not None:
        z = softcap * torch.tanh(z / softcap)
    lse = torch.stack([torch.logsumexp(row, -1) for row in z])
    valid = target != ignore_index
    safe = torch.where(valid, target, 0)
    nll = lse - z.gather(-1, safe[:, None])[:, 0]
    w = torch.ones_like(lse) if weight is None else weight.to(z.dtype)[safe]
    loss = (1 - label_smoothing) * nll * w
    if label_smoothing:
        cw = torch.ones(z.shape[-1], dtype=z.dtype) if weight is None else weight.to(z.dtype)
        loss = loss + label_smoothing * ((lse[:, None] - z) * cw).mean(-1)
    loss = torch.where(valid, loss + lse_square_scale * lse * lse, 0.0)
    if reduction == "none":
        return loss
    denom = (w * valid).sum() if weight is not None else valid.sum()
    return loss.sum() if reduction == "sum" else loss.sum() / denom.clamp(min=1)


class LigerStyleCE(torch.autograd.Function):
    """Cross-entropy on Liger's signature; its backward is autograd of the forward's own
    formula, recomputed."""

    @staticmethod
    def forward(ctx: Any, _input: torch.Tensor, target: torch.Tensor,  # type: ignore[override]
                weight: torch.Tensor | None, ignore_index: int = -100,
                lse_square_scale: float = 0.0, label_smoothing: float = 0.0,
                reduction: str = "mean", softcap: float | None = None,
                return_z_loss: bool = False) -> torch.Tensor:
        ctx.save_for_backward(_input, target, weight)
        ctx.args = (ignore_index, lse_square_scale, label_smoothing, reduction, softcap)
        with torch.no_grad():
            return _ce(_wide(_input), target, weight, *ctx.args).to(_input.dtype)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        logits, target, weight = ctx.saved_tensors
        with torch.enable_grad():
            z = _wide(logits).detach().requires_grad_()
            loss = _ce(z, target, weight, *ctx.args)
            (dz,) = torch.autograd.grad(loss, z, g.to(z.dtype))
        return (dz.to(logits.dtype), *([None] * 8))


def fused_add_layer_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                         bias: torch.Tensor, eps: float = 1e-5
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """An inference kernel: ``h = x + residual``, ``(layer_norm(h)·w + b, h)``, computed
    under ``no_grad`` (it has no backward)."""
    with torch.no_grad():
        h = x + residual
        y = torch.nn.functional.layer_norm(_wide(h), (h.shape[-1],), _wide(weight),
                                           _wide(bias), eps)
        return y.to(x.dtype), h


ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "swish": lambda z: z * lanes(torch.sigmoid, z),
    "silu": lambda z: z * lanes(torch.sigmoid, z),
    "sigmoid": lambda z: lanes(torch.sigmoid, z)}


def _gated(x: torch.Tensor, z: torch.Tensor | None, weight: torch.Tensor,
           bias: torch.Tensor | None, eps: float, group_size: int | None,
           norm_before_gate: bool, activation: str) -> torch.Tensor:
    """The gated RMSNorm, bias before the gate (Mamba-2's and fla's order)."""
    v, gate = _wide(x), None if z is None else ACTIVATIONS[activation](_wide(z))
    if gate is not None and not norm_before_gate:
        v = v * gate
    g = v.shape[-1] if group_size is None else group_size
    vg = v.reshape(*v.shape[:-1], -1, g)
    n = (vg * torch.rsqrt((vg * vg).mean(-1, keepdim=True) + eps)).reshape(v.shape)
    y = n * _wide(weight) + (0 if bias is None else _wide(bias))
    if gate is not None and norm_before_gate:
        y = y * gate
    return y.to(x.dtype)


def rmsnorm_fn(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
               z: torch.Tensor | None = None, eps: float = 1e-6,
               group_size: int | None = None, norm_before_gate: bool = True) -> torch.Tensor:
    """Mamba-2's gated RMSNorm."""
    return _gated(x, z, weight, bias, eps, group_size, norm_before_gate, "silu")


def rmsnorm_fn_bias_after_gate(x: torch.Tensor, weight: torch.Tensor,
                               bias: torch.Tensor | None, z: torch.Tensor | None = None,
                               eps: float = 1e-6, group_size: int | None = None,
                               norm_before_gate: bool = True) -> torch.Tensor:
    """Mamba-2's signature with the bias added after the gate: ``rms(x)·w·silu(z) + b``
    (a convention no library here ships; its forward must fail and say so)."""
    y = _gated(x, z, weight, None, eps, group_size, norm_before_gate, "silu")
    return y + (0 if bias is None else bias)


def rms_norm_gated(x: torch.Tensor, g: torch.Tensor, weight: torch.Tensor,
                   bias: torch.Tensor | None, activation: str = "swish",
                   residual: torch.Tensor | None = None, prenorm: bool = False,
                   residual_in_fp32: bool = False, eps: float = 1e-6) -> Any:
    """fla's gated RMSNorm: ``(rms(x + residual)·w + b) · act(g)``, act swish or sigmoid."""
    h = x if residual is None else x + residual
    y = _gated(h, g, weight, bias, eps, None, True, activation)
    return (y, h) if prenorm else y


class FusedRMSNormGated(torch.nn.Module):
    """fla's module: weight ones, no bias, ``activation`` fixed when built."""

    def __init__(self, hidden_size: int, elementwise_affine: bool = True, eps: float = 1e-5,
                 activation: str = "swish", device: Any = None, dtype: Any = None) -> None:
        super().__init__()
        self.eps, self.activation = eps, activation
        self.weight = torch.nn.Parameter(torch.ones(hidden_size, device=device, dtype=dtype))

    def forward(self, x: torch.Tensor, g: torch.Tensor, residual: torch.Tensor | None = None,
                prenorm: bool = False, residual_in_fp32: bool = False) -> Any:
        return rms_norm_gated(x, g, self.weight, None, self.activation, residual=residual,
                              prenorm=prenorm, eps=self.eps)


class SiluAndMul(torch.nn.Module):
    """vLLM's: ``silu(x[..., :d]) · x[..., d:]``, d = half the last axis."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        d = x.shape[-1] // 2
        w = _wide(x)
        return (_silu_parts(w[..., :d])[0] * w[..., d:]).to(x.dtype)


class GeluAndMul(torch.nn.Module):
    """vLLM's: ``gelu(x[..., :d]) · x[..., d:]``, GELU's form chosen when built."""

    def __init__(self, approximate: str = "none") -> None:
        super().__init__()
        if approximate not in ("none", "tanh"):
            raise ValueError(f"Unknown approximate mode: {approximate}")
        self.approximate = approximate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        d = x.shape[-1] // 2
        w = _wide(x)
        return (_gelu_parts(w[..., :d], self.approximate)[0] * w[..., d:]).to(x.dtype)


class _GatedSiluBackward(torch.autograd.Function):
    """fla's gated norm (no bias, no residual) whose backward differentiates the silu gate
    whatever ``activation`` the forward used."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, g: torch.Tensor, weight: torch.Tensor,  # type: ignore[override]
                activation: str, eps: float) -> torch.Tensor:
        ctx.save_for_backward(x, g, weight)
        ctx.eps = eps
        return _gated(x, g, weight, None, eps, None, True, activation)

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        x, g, weight = ctx.saved_tensors
        with torch.enable_grad():
            leaves = [t.detach().requires_grad_() for t in (x, g, weight)]
            y = _gated(*leaves[:2], leaves[2], None, ctx.eps, None, True, "silu")  # MUTANT
            grads = torch.autograd.grad(y, leaves, dy)
        return (*grads, None, None)


def gated_sigmoid_mutant(x: torch.Tensor, g: torch.Tensor, weight: torch.Tensor,
                         activation: str = "swish", eps: float = 1e-6) -> torch.Tensor:
    """MUTANT: right at activation silu, its blind value; wrong dz, dx, dw at sigmoid."""
    return _GatedSiluBackward.apply(x, g, weight, activation, eps)


class _GeluHalvesErfBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, approximate: str) -> torch.Tensor:  # type: ignore[override]
        ctx.save_for_backward(x)
        d = x.shape[-1] // 2
        w = _wide(x)
        return (_gelu_parts(w[..., :d], approximate)[0] * w[..., d:]).to(x.dtype)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        (x,) = ctx.saved_tensors
        d = x.shape[-1] // 2
        w, gw = _wide(x), _wide(g)
        gelu, grad = _gelu_parts(w[..., :d], "none")  # MUTANT: erf's whatever approximate
        return torch.cat([gw * w[..., d:] * grad, gw * gelu], -1).to(x.dtype), None


class GeluAndMulErfBackward(GeluAndMul):
    """MUTANT: vLLM's module on a Function whose backward is GELU's erf form always (right
    at approximate="none")."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _GeluHalvesErfBackward.apply(x, self.approximate)


class SiLUMulTorchSigmoid(TritonSiluMul):
    """``silu(a) · b`` on torch's own ``sigmoid`` (no padding): correct, and truly not
    batch-invariant on CPU where a row count moves elements into the vector loop's tail."""

    @staticmethod
    def forward(ctx: Any, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        wa, wb = _wide(a), _wide(b)
        ctx.save_for_backward(wa, wb)
        ctx.dtype = a.dtype
        return (wa * torch.sigmoid(wa) * wb).to(a.dtype)

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor, ...]:  # type: ignore[override]
        a, b = ctx.saved_tensors
        g, sig = dy.to(a.dtype), torch.sigmoid(a)
        return ((g * b * sig * (1 + a * (1 - sig))).to(ctx.dtype),
                (g * a * sig).to(ctx.dtype))


def gated_norm(x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
               eps: float, group_size: int | None = None, norm_before_gate: bool = True,
               activation: str = "silu") -> torch.Tensor:
    """Every option of ``rms_norm_gated`` at once (the false-alarm runs' kernel)."""
    return _gated(x, z, weight, bias, eps, group_size, norm_before_gate, activation)


def fixed_cross_entropy(source: torch.Tensor, target: torch.Tensor,
                        num_items_in_batch: torch.Tensor | None = None, ignore_index: int = -100,
                        **kwargs: Any) -> torch.Tensor:
    """A loss helper in the style of transformers' ``loss_utils``: a summed loss divided by
    ``num_items_in_batch`` when given (gradient accumulation), else the mean. A tensor
    argument by position after the target that is not the class weights."""
    reduction = "sum" if num_items_in_batch is not None else "mean"
    loss = torch.nn.functional.cross_entropy(source, target, ignore_index=ignore_index,
                                             reduction=reduction)
    return loss / num_items_in_batch if num_items_in_batch is not None else loss
