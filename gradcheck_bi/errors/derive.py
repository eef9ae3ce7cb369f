"""A correct kernel's rounding, per element, derived from the op's own fp64 reference.

The reference (and its autograd backward) runs under a torch dispatch mode that carries,
next to every tensor it computes, ``σ``: the standard deviation of the error a kernel
following the same formula at unit roundoff ``u`` would have, in units of ``u`` — first
order, so a kernel at any working precision has ``u·σ``. Op by op:

* an op that moves data (a view, a copy, ``cat``, ``gather``, ``expand``) moves ``σ`` the
  same way;
* a pointwise op carries each input's ``σ`` through its own derivative, ``|∂out/∂in|·σ``
  (in closed form for arithmetic, ``exp``, ``log``, ``where`` (:data:`SLOPES`), else a
  central difference of the aten op itself; either way cancellation shows: ``1 + erf(a)``
  near ``a ≈ -3`` gets the absolute error of ``erf``, not a relative one), adds in
  quadrature and rounds once more: ``c·|out|``, ``c`` from :data:`ROUNDINGS` (1 for IEEE's
  correctly rounded ops, more for transcendentals a GPU computes to a few ulps, 0 for
  exact ones);
* a sum of ``n`` terms ``t`` (``sum``, ``mean``, a matmul's inner product) carries
  ``Σ σ_t²`` and adds its own rounding in an order it does not know: the partial sums of a
  sequential sum (the widest common order) give ``Var = n/3 · S² + n/2 · Σ t²`` (``S``
  the sum: a drift when terms share a sign, a random walk when they do not);
* ``max``/``amax`` take ``σ`` at the maximum; anything else is estimated by the same
  difference along ``σ`` with random signs (its name is kept in :attr:`Propagate.
  unknown`: a new op's test asserts there is none).

Rules are written per aten op, once, for every op; an op's author writes no constant.

``σ`` is first order in ``u`` and blind to the working precision's **range**. Given that
precision ``P`` (``reach=P``), the mode carries a second channel beside it, ``α`` (in
absolute units, :attr:`Propagate.absolute`): what a kernel computing the same formula in
``P`` loses where a value leaves ``P``'s range. An op whose exact result exceeds
``finfo(P).max`` is ``±inf`` in ``P`` (``α = ∞`` marks it) and what consumes it keeps none
of its own value (``1 / (1 + inf) = 0``: ``α = |out|``); a result below ``finfo(P).tiny``
may be flushed or rounded to a subnormal (``α = |out|``). ``α`` moves with the data, is
carried through a pointwise op by ``|∂out/∂in|`` (through a sum by adding) and is zero
wherever every value stays in range — always, at the scales a check draws, for ``P =
fp64``. A pointwise op outside the core ATen set (``silu``, ``silu_backward``,
``gelu_backward``, …) is followed through its torch decomposition into core ops: the
``exp`` that overflows inside ``silu(t) = t · sigmoid(t)`` at ``t ≤ −89`` in fp32 is seen
there, where ``silu``'s own result (−2e-37) is in range.

>>> import torch
>>> a = torch.tensor([-2.8, 0.5], dtype=torch.float64)
>>> s = forward_sigma(lambda t: {"y": 1 + torch.erf(t["a"] / 2**0.5)}, {"a": a})["y"]
>>> bool(s[0] / (1 + torch.erf(a[0] / 2**0.5)) > 100)  # cancellation: far beyond 1 u relative
True
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map
from torch.utils.weak import WeakTensorKeyDictionary

from gradcheck_bi.errors.aten import (
    _STEP,
    _TINY,
    ADDS,
    MAXIMA,
    MOVES,
    PRODUCTS,
    ROUNDINGS,
    SLOPES,
    SUMS,
    TERMS,
    _any,
    _decomposition,
    _is_float,
    _moved,
    _name,
    _slope,
    aten,
)
from gradcheck_bi.errors.reach import Reach

_SIGN_DRAWS = 4


class Propagate(TorchDispatchMode):
    """Within: every floating tensor computed carries ``σ`` (:attr:`sigma`, in u)."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # Nothing under this mode is compiled: left True, torch wraps __torch_dispatch__ in
        # a dynamo guard whose first call imports torch._dynamo (seconds, once a process).
        return False

    def __init__(self, reach: torch.dtype | None = None) -> None:
        super().__init__()
        self.sigma: WeakTensorKeyDictionary = WeakTensorKeyDictionary()
        self.reach = Reach(reach) if reach is not None else None
        self.slopes: dict[int, Any] = {}  # the last pointwise op's, for α too
        self.span: Any = None  # and its result's magnitudes' range (Reach.span)
        self.unknown: set[str] = set()
        self.ran: set[str] = set()  # every aten op's name seen (what precision is plausible)
        self.gen = torch.Generator().manual_seed(0)

    def of(self, t: torch.Tensor) -> torch.Tensor | None:
        return self.sigma.get(t)

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        name = _name(func)
        self.ran.add(name)
        inplace = func._schema.name.endswith("_") or name == "copy"
        before = (args[0].clone() if inplace and _is_float(args[0]) else None)
        out = func(*args, **kwargs)
        if before is not None:  # judge the op as its functional form on the old values
            args = (before, *args[1:])
        result = out[0] if name in ("max", "min") and isinstance(out, tuple) else out
        if isinstance(out, (tuple, list)) and result is out:  # several results
            self._several(func, name, args, kwargs, out)
            return out
        if name in ("split", "split_with_sizes", "unbind", "chunk"):
            sig = _moved(self.sigma, func, args, kwargs)
            for o, s in zip(out, sig or [], strict=False):
                self.sigma[o] = s
            if self.reach is not None:
                self.reach.split(func, args, kwargs, out)
            return out
        if not _is_float(result):
            return out
        self.slopes, self.span = {}, None
        sig = self._rule(func, name, args, kwargs, result, out)
        if sig is not None:
            self.sigma[result] = sig
        if self.reach is not None:
            self.reach.record(func, name, args, kwargs, result, out, self.slopes, self.span)
        return out

    @property
    def absolute(self) -> WeakTensorKeyDictionary:
        """``α`` of every tensor that has one (none without ``reach``)."""
        return self.reach.alpha if self.reach is not None else WeakTensorKeyDictionary()

    # -- the rules -------------------------------------------------------------------
    def _several(self, func: Any, name: str, args: tuple[Any, ...], kwargs: dict[str, Any],
                 out: tuple[Any, ...] | list[Any]) -> None:
        """An op of several results: a sort's values move with their indices; another op
        is followed through its decomposition into ops with rules (``native_layer_norm``
        and its backward), each result taking its counterpart's ``σ`` (and ``α``); one
        with neither rounds each result once, its inputs' ``σ`` unknown (:attr:`unknown`)."""
        if not any(_is_float(o) for o in out):
            return
        if name in ("sort", "topk") and len(out) == 2:
            s = self.of(args[0])
            if s is not None:
                at = 1 if name == "sort" else 2  # sort(x, dim), topk(x, k, dim)
                dim = (args[at] if len(args) > at and isinstance(args[at], int)
                       else kwargs.get("dim", -1))
                self.sigma[out[0]] = s.gather(dim, out[1])
            return
        decomposed = _decomposition(func)
        if decomposed is None:
            self.unknown.add(name)
            for o in out:
                if _is_float(o):
                    self.sigma[o] = o.abs()
            return
        with self:
            inner = decomposed(*args, **kwargs)
        for o, i in zip(out, inner, strict=False):
            if _is_float(o) and _is_float(i):
                self._take(o, i)

    def _take(self, result: torch.Tensor, inner: torch.Tensor) -> None:
        """``result`` takes the ``σ`` and ``α`` of ``inner``, its counterpart computed by
        the op's decomposition."""
        if self.of(inner) is not None:
            self.sigma[result] = self.of(inner)
        if self.reach is not None and self.reach.of(inner) is not None:
            self.reach.alpha[result] = self.reach.of(inner)

    def _sig_or_zero(self, t: torch.Tensor) -> torch.Tensor:
        s = self.of(t)
        return s if s is not None else torch.zeros_like(t)

    def _any_sigma(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        return _any(self.sigma, args, kwargs)

    def _moves(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return _moved(self.sigma, func, args, kwargs)

    def _rule(self, func: Any, name: str, args: tuple[Any, ...], kwargs: dict[str, Any],
              result: torch.Tensor, out: Any) -> torch.Tensor | None:
        if name in MOVES or func.is_view:
            return self._moves(func, args, kwargs)
        if name in SUMS:
            return self._sum(func, name, args, kwargs, result)
        if name in PRODUCTS:
            return self._product(func, name, args, kwargs, result)
        if name in MAXIMA:
            return self._maximum(name, args, out)
        if name in ADDS:  # the terms' σ² placed and added, and the op's own rounding
            if not self._any_sigma(args, kwargs):
                return (result**2).sqrt_()
            sq = lambda t: self._sig_or_zero(t) ** 2 if _is_float(t) else t  # noqa: E731
            var = func(*tree_map(sq, args), **tree_map(sq, kwargs))
            return var.add_(result**2).sqrt_()
        if torch.Tag.pointwise in func.tags:
            return self._pointwise(func, name, args, kwargs, result)
        decomposed = _decomposition(func)
        if decomposed is not None:  # softmax and its backward: their sums and their
            with self:              # cancellations, op by op (an estimate sees neither)
                inner = decomposed(*args, **kwargs)
            if _is_float(inner) and self.of(inner) is not None:
                self._take(result, inner)
                return self.of(inner)
        self.unknown.add(name)
        return self._estimated(func, args, kwargs, result)

    def _pointwise(self, func: Any, name: str, args: tuple[Any, ...],
                   kwargs: dict[str, Any], result: torch.Tensor) -> torch.Tensor:
        # in place on one buffer: at (512, 32000) every temporary is a 128 MiB pass
        if self.reach is not None:  # |result|'s range
            self.span = self.reach.span(result)
        c = ROUNDINGS.get(name, 1.0)
        if name in TERMS:  # rounded relative to terms that cancel in the result
            mag = TERMS[name](args).abs().to(result.dtype)
            var = (mag.mul_(c) if c != 1.0 else mag).square_()
        else:  # (c|r|)² from r itself, no |r| buffer: |fl(c r)| = fl(c |r|), the same bits
            var = (result * c).square_() if c != 1.0 else result.square()
        rule = SLOPES.get(f"{name}.{func._overloadname}")
        for i, a in enumerate(args):
            s = self.of(a) if _is_float(a) else None
            if s is None:
                continue
            slope = rule(args, kwargs, result, i) if rule is not None \
                else _slope(func, args, kwargs, i)
            self.slopes[i] = slope
            moved = s if isinstance(slope, float) and slope == 1.0 else slope * s
            var.addcmul_(moved, moved)
        return var.sqrt_()

    def _sum(self, func: Any, name: str, args: tuple[Any, ...], kwargs: dict[str, Any],
             result: torch.Tensor) -> torch.Tensor:
        x = args[0]
        n = max(1, x.numel() // max(1, result.numel()))
        scale = 1.0 / n if name == "mean" else 1.0
        rest, kw = args[1:], dict(kwargs)
        kw.pop("dtype", None)
        f = aten.sum.dim_IntList if rest or "dim" in kw else aten.sum.default

        def summed(t: torch.Tensor) -> torch.Tensor:
            return f(t, *rest, **kw)

        total = result / scale
        var = (n / 3) * total**2 + (n / 2) * summed(x * x)
        s = self.of(x)
        if s is not None:
            var = var + summed(s * s)
        return var.sqrt() * scale

    def _product(self, func: Any, name: str, args: tuple[Any, ...], kwargs: dict[str, Any],
                 result: torch.Tensor) -> torch.Tensor:
        bias = None
        if name in ("addmm", "baddbmm", "addmv"):
            bias, args = args[0], args[1:3]
            beta, alpha = kwargs.get("beta", 1), kwargs.get("alpha", 1)
        else:
            args, beta, alpha = args[:2], 1, 1
        a, b = args
        op = {"addmm": aten.mm.default, "baddbmm": aten.bmm.default,
              "addmv": aten.mv.default}.get(name, func)
        k = a.shape[-1]
        prod = op(a, b)
        var = (k / 3) * prod**2 + (k / 2) * op(a * a, b * b)
        sa, sb = self.of(a), self.of(b)
        if sa is not None:
            var = var + op(sa * sa, b * b)
        if sb is not None:
            var = var + op(a * a, sb * sb)
        var = var * float(alpha) ** 2
        if bias is not None:
            sbias = self.of(bias)
            if sbias is not None:
                var = var + (float(beta) * sbias) ** 2
            var = var + result**2  # the final addition
        return var.sqrt()

    def _maximum(self, name: str, args: tuple[Any, ...], out: Any) -> torch.Tensor | None:
        x = args[0]
        s = self.of(x)
        if s is None:
            return None
        if isinstance(out, tuple):  # max.dim: values and indices
            dim = args[1]
            keep = len(args) > 2 and bool(args[2])
            idx = out[1] if keep else out[1].unsqueeze(dim)
            picked = s.gather(dim, idx)
            return picked if keep else picked.squeeze(dim)
        if len(args) == 1:
            return s.amax()  # σ at the extreme: at most the largest
        return aten.amax.default(s, *args[1:])

    def _estimated(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                   result: torch.Tensor) -> torch.Tensor:
        """An op with no rule: ``Σ_j (∂out/∂in_j)² σ_j²`` estimated by central differences
        of the op along σ with random signs (unbiased), and one rounding."""
        idx = [i for i, a in enumerate(args) if _is_float(a) and self.of(a) is not None]
        var = result**2
        if not idx:
            return var.sqrt()
        acc = torch.zeros_like(result)
        for _ in range(_SIGN_DRAWS):
            plus, minus = list(args), list(args)
            for i in idx:
                a, s = args[i], self._sig_or_zero(args[i])
                signs = torch.randint(0, 2, s.shape, generator=self.gen).to(s) * 2 - 1
                step = _STEP * a.abs().clamp(min=_TINY) / s.abs().clamp(min=_TINY)
                h = float(step.min())
                plus[i], minus[i] = a + h * s * signs, a - h * s * signs
            up, down = func(*plus, **kwargs), func(*minus, **kwargs)
            up = up[0] if isinstance(up, tuple) else up
            down = down[0] if isinstance(down, tuple) else down
            acc = acc + ((up - down) / (2 * h)) ** 2
        return (var + acc / _SIGN_DRAWS).sqrt()


@contextmanager
def propagating(reach: torch.dtype | None = None) -> Iterator[Propagate]:
    mode = Propagate(reach)
    with mode:
        yield mode


def forward_sigma(reference: Callable[[dict[str, Any]], dict[str, torch.Tensor]],
                  tensors: dict[str, Any]) -> dict[str, torch.Tensor]:
    """``σ`` (in u) of every output of ``reference(tensors)``, the inputs exact."""
    with propagating() as mode:
        outs = reference(tensors)
        return {k: _sigma_or_zero(mode, v) for k, v in outs.items()}


def _sigma_or_zero(mode: Propagate, t: torch.Tensor) -> torch.Tensor:
    s = mode.of(t)  # no copy: nothing of the mode's outlives it but what it returns
    return s.detach() if s is not None else torch.zeros_like(t)


def _absolute_or_zero(a: torch.Tensor | None, t: torch.Tensor) -> torch.Tensor:
    """``α`` of a result a check compares (outside the mode: nothing of it is the
    reference's): where the value itself is ``±inf`` in the range's precision (``α = ∞``),
    all of it is lost, ``|t|``."""
    if a is None:
        return torch.zeros_like(t)
    return torch.where(torch.isfinite(a), a, t.abs()).detach()


@dataclass
class Derived:
    """The fp64 reference's outputs and gradients at one point, each with its ``σ`` (in u);
    ``unknown``: the aten ops that had no rule (their σ estimated); ``products``: whether
    the forward multiplies matrices (where TF32 may run inside an fp32 call);
    ``output_absolute``, ``grad_absolute``: each one's ``α`` (absolute, not in u: what
    leaving the range of the precision given as ``reach`` loses; zero without it)."""

    outputs: dict[str, torch.Tensor]
    output_sigma: dict[str, torch.Tensor]
    grads: dict[str, torch.Tensor]
    grad_sigma: dict[str, torch.Tensor]
    unknown: set[str]
    products: bool = False
    output_absolute: dict[str, torch.Tensor] = field(default_factory=dict)
    grad_absolute: dict[str, torch.Tensor] = field(default_factory=dict)


def derived(reference: Callable[[dict[str, Any]], dict[str, torch.Tensor]],
            tensors: dict[str, Any], cotangents: dict[str, torch.Tensor],
            wrt: list[str], reach: torch.dtype | None = None) -> Derived:
    """Run ``reference(tensors)`` and its autograd backward (``wrt``: the roles to
    differentiate; gradients keyed by role) under :class:`Propagate`.

    A gradient is ``Σ_out ⟨cotangent, ∂out/∂role⟩``; the cotangents are exact (σ = 0). A
    role that reaches no output (autograd's ``None``) has a zero gradient and σ. ``reach``:
    the precision whose range ``α`` is kept for (the kernel's working one).
    """
    leaves = {k: (v.detach().clone().requires_grad_(k in wrt) if _is_float(v) else v)
              for k, v in tensors.items()}
    with propagating(reach) as mode:
        outs = reference(leaves)
        out_sigma = {k: _sigma_or_zero(mode, v) for k, v in outs.items()}
        out_abs = {k: (mode.absolute.get(v), v.detach()) for k, v in outs.items()}
        products = bool(mode.ran & PRODUCTS)
        names = [k for k in wrt if isinstance(leaves.get(k), torch.Tensor)]
        pairs = [(outs[k], cotangents[k]) for k in outs
                 if outs[k].requires_grad and k in cotangents]
        grads: tuple[torch.Tensor | None, ...] = (None,) * len(names)
        if names and pairs:
            grads = torch.autograd.grad([p[0] for p in pairs], [leaves[k] for k in names],
                                        [p[1] for p in pairs], allow_unused=True)
        values, sigma, absolute = {}, {}, {}
        for k, gr in zip(names, grads, strict=True):
            values[k] = torch.zeros_like(leaves[k]) if gr is None else gr.detach()
            sigma[k] = (torch.zeros_like(leaves[k]) if gr is None
                        else _sigma_or_zero(mode, gr))
            absolute[k] = (None if gr is None else mode.absolute.get(gr), values[k])
    return Derived({k: v.detach() for k, v in outs.items()}, out_sigma, values, sigma,
                   set(mode.unknown), products,
                   {k: _absolute_or_zero(*v) for k, v in out_abs.items()},
                   {k: _absolute_or_zero(*v) for k, v in absolute.items()})


def unit(dtype: torch.dtype) -> float:
    """The unit roundoff of a dtype (fp64: 2^-53)."""
    return float(torch.finfo(dtype).eps) / 2


__all__ = ["ROUNDINGS", "Derived", "Propagate", "derived", "forward_sigma", "unit"]
