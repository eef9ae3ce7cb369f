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

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map
from torch.utils.weak import WeakTensorKeyDictionary

aten = torch.ops.aten

# Roundings per result of a pointwise op, in u. Basic arithmetic is correctly rounded (1);
# a GPU's exp, log, tanh, erf are good to about 2 ulps (4 u); selection is exact (0).
ROUNDINGS: dict[str, float] = {
    **dict.fromkeys(("neg", "abs", "where", "masked_fill", "clamp", "clamp_min", "clamp_max",
                     "relu", "threshold_backward", "sign", "fill", "zeros_like", "ones_like",
                     "full_like", "maximum", "minimum", "copy", "_to_copy", "scalar_tensor",
                     "lift_fresh_copy", "lift_fresh", "empty_like", "logical_not"), 0.0),
    **dict.fromkeys(("exp", "exp2", "expm1", "log", "log2", "log1p", "tanh", "erf", "erfc",
                     "sigmoid", "pow", "rsqrt", "sin", "cos", "atan", "softplus",
                     "tanh_backward", "sigmoid_backward"), 4.0),
    **dict.fromkeys(("gelu", "silu", "gelu_backward", "silu_backward", "logit",
                     "xlogy"), 8.0),
}
# Ops that move or select data: σ moves the same way.
MOVES = {"view", "_unsafe_view", "reshape", "t", "transpose", "permute", "expand", "squeeze",
         "unsqueeze", "select", "slice", "clone", "contiguous", "detach", "alias", "cat",
         "stack", "gather", "index_select", "index", "flip", "roll", "repeat", "as_strided",
         "select_backward", "slice_backward", "diagonal", "narrow", "split", "split_with_sizes",
         "unbind", "chunk", "_reshape_alias", "expand_copy", "permute_copy", "view_copy",
         "t_copy", "transpose_copy", "unsqueeze_copy", "squeeze_copy", "new_zeros",
         "zeros", "ones", "full", "new_full", "new_ones", "scatter", "index_put",
         "masked_scatter", "unfold", "movedim", "alias_copy"}
SUMS = {"sum", "mean", "nansum"}
PRODUCTS = {"mm", "bmm", "addmm", "dot", "mv", "baddbmm", "addmv"}
MAXIMA = {"amax", "amin", "max", "min"}
ADDS = {"scatter_add", "index_add", "index_put_accumulate"}
_SIGN_DRAWS = 4


def _name(func: Any) -> str:
    return func._schema.name.split("::")[-1].rstrip("_")


def _is_float(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.is_floating_point()


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
        self.span: Any = None  # and its result's smallest and largest magnitude
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
        self.unknown.add(name)
        return self._estimated(func, args, kwargs, result)

    def _pointwise(self, func: Any, name: str, args: tuple[Any, ...],
                   kwargs: dict[str, Any], result: torch.Tensor) -> torch.Tensor:
        # in place on one buffer: at (512, 32000) every temporary is a 128 MiB pass
        mag = result.abs()
        if self.reach is not None:  # |result|'s range, while the buffer still holds it
            self.span = torch.aminmax(mag) if mag.numel() else None
        var = mag.mul_(ROUNDINGS.get(name, 1.0)).square_()
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


def _any(table: WeakTensorKeyDictionary, args: tuple[Any, ...],
         kwargs: dict[str, Any]) -> bool:
    """Whether a floating tensor among ``args``/``kwargs`` has an entry in ``table``."""
    found = False

    def look(t: Any) -> Any:
        nonlocal found
        if _is_float(t) and table.get(t) is not None:
            found = True
        return t

    tree_map(look, (args, kwargs))
    return found


def _moved(table: WeakTensorKeyDictionary, func: Any, args: tuple[Any, ...],
           kwargs: dict[str, Any]) -> Any:
    """An op that moves data, applied to each floating input's entry in ``table`` (zero
    where none); ``None`` where no input has one."""
    if not _any(table, args, kwargs):
        return None

    def swap(t: Any) -> Any:
        if not _is_float(t):
            return t
        v = table.get(t)
        return v if v is not None else torch.zeros_like(t)

    return func(*tree_map(swap, args), **tree_map(swap, kwargs))


class Reach:
    """``α``, what a kernel computing in ``dtype`` loses where a value leaves its range
    (the module's docstring), kept per tensor in :attr:`alpha`; ``None``: nothing lost."""

    def __init__(self, dtype: torch.dtype) -> None:
        fi = torch.finfo(dtype)
        self.max, self.tiny = float(fi.max), float(fi.tiny)
        self.alpha: WeakTensorKeyDictionary = WeakTensorKeyDictionary()
        self.infinite: WeakTensorKeyDictionary = WeakTensorKeyDictionary()  # α holding ∞

    def of(self, t: Any) -> torch.Tensor | None:
        return self.alpha.get(t) if _is_float(t) else None

    def _holds_inf(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        found = False

        def look(t: Any) -> Any:
            nonlocal found
            a = self.of(t)
            found = found or (a is not None and a in self.infinite)
            return t

        tree_map(look, (args, kwargs))
        return found

    def or_zero(self, t: torch.Tensor) -> torch.Tensor:
        a = self.of(t)
        return a if a is not None else torch.zeros_like(t)

    def split(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
              out: Any) -> None:
        for o, a in zip(out, _moved(self.alpha, func, args, kwargs) or [], strict=False):
            self.alpha[o] = a

    def record(self, func: Any, name: str, args: tuple[Any, ...], kwargs: dict[str, Any],
               result: torch.Tensor, out: Any, slopes: dict[int, Any] | None = None,
               span: Any = None) -> None:
        """``α`` of ``result`` (``slopes``, ``span``: the pointwise derivatives σ took and
        ``|result|``'s least and largest, reused)."""
        decomposed = _composite(func)
        if decomposed is not None:  # followed through the core ops a kernel computes
            with _Within(self):
                inner = decomposed(*args, **kwargs)
            a = self.of(inner)
            if a is not None:
                self.alpha[result] = a
            return
        a = self._carried(func, name, args, kwargs, result, out, slopes or {})
        moved = name in MOVES or name in ADDS or name in MAXIMA or func.is_view
        if a is not None and self._holds_inf(args, kwargs):
            if moved:  # the values themselves, ±inf in the range's precision, moved
                self.infinite[a] = True
            elif torch.Tag.pointwise not in func.tags:  # summed or multiplied: value lost
                a = torch.where(torch.isfinite(a), a, result.abs())
        if not moved:  # a moved value's range was seen where it was computed
            a = self._own(a, result, span)
        if a is not None:
            self.alpha[result] = a

    def _carried(self, func: Any, name: str, args: tuple[Any, ...], kwargs: dict[str, Any],
                 result: torch.Tensor, out: Any, slopes: dict[int, Any]
                 ) -> torch.Tensor | None:
        """The inputs' ``α`` carried to ``result`` (``∞`` where an input was ``±inf`` in
        the range's precision and reaches the result)."""
        if not _any(self.alpha, args, kwargs):
            return None
        if name in MOVES or name in ADDS or func.is_view:  # ADDS: the terms' α added
            return _moved(self.alpha, func, args, kwargs)
        if name in SUMS:
            rest = args[1:]
            kw = {k: v for k, v in kwargs.items() if k != "dtype"}
            f = aten.sum.dim_IntList if rest or "dim" in kw else aten.sum.default
            a = f(self.or_zero(args[0]), *rest, **kw)
            n = max(1, args[0].numel() // max(1, result.numel()))
            return a / n if name == "mean" else a
        if name in PRODUCTS:
            bias = args[0] if name in ("addmm", "baddbmm", "addmv") else None
            x, y = args[1:3] if bias is not None else args[:2]
            op = {"addmm": aten.mm.default, "baddbmm": aten.bmm.default,
                  "addmv": aten.mv.default}.get(name, func)
            a = op(self.or_zero(x), y.abs()) + op(x.abs(), self.or_zero(y))
            a = a * abs(float(kwargs.get("alpha", 1)))
            ab = self.of(bias) if bias is not None else None
            return a + abs(float(kwargs.get("beta", 1))) * ab if ab is not None else a
        if name in MAXIMA:
            a = self.or_zero(args[0])  # at most the largest α of those compared
            return a.amax() if len(args) == 1 else aten.amax.default(a, *args[1:])
        if torch.Tag.pointwise in func.tags:
            return self._pointwise(func, name, args, kwargs, result, slopes)
        decomposed = _decomposition(func)  # log_softmax, logsumexp: into ops with rules
        if decomposed is None:
            return None  # no rule and no decomposition: only the result's own range
        with _Within(self):
            inner = decomposed(*args, **kwargs)
        return self.of(inner[0] if isinstance(inner, tuple) else inner)

    def _pointwise(self, func: Any, name: str, args: tuple[Any, ...],
                   kwargs: dict[str, Any], result: torch.Tensor, slopes: dict[int, Any]
                   ) -> torch.Tensor:
        """``Σ |∂out/∂in|·α_in``; an input ``±inf`` in the range's precision that the
        result depends on leaves the result none of its value (``|out|``)."""
        total: torch.Tensor | None = None
        rule = SLOPES.get(f"{name}.{func._overloadname}")
        for i, x in enumerate(args):
            a = self.of(x)
            if a is None:
                continue
            slope = slopes.get(i)
            if slope is None:
                slope = rule(args, kwargs, result, i) if rule is not None \
                    else _slope(func, args, kwargs, i)
            if a in self.infinite:  # ±inf in the range's precision, where it reaches out
                slope = torch.as_tensor(slope, dtype=result.dtype, device=result.device)
                moved = torch.where(slope == 0, 0.0,
                                    torch.where(torch.isinf(a), result.abs(), (slope * a).abs()))
            else:
                moved = a if isinstance(slope, float) and slope == 1.0 \
                    else (slope * a).abs()
            total = moved if total is None else total + moved
        assert total is not None
        return total.expand(result.shape).clone() if total.shape != result.shape else total

    def _own(self, a: torch.Tensor | None, result: torch.Tensor, span: Any = None
             ) -> torch.Tensor | None:
        """The result's own range: ``∞`` above ``max`` (it is ``±inf`` there), ``|out|``
        below ``tiny`` (flushed or a subnormal); a non-finite carried ``α`` (an input's
        ``∞`` times a zero) is the result's magnitude."""
        if span is None and result.numel():
            span = torch.aminmax(result.abs())
        if span is None or (float(span[1]) <= self.max and float(span[0]) >= self.tiny):
            return a  # every value in range (the usual case: one pass, or none)
        mag = result.abs()
        over = mag > self.max
        under = (mag < self.tiny) & (mag > 0)
        if not bool(over.any()) and not bool(under.any()):
            return a
        a = a if a is not None else torch.zeros_like(result)
        a = torch.where(over, math.inf, torch.where(under, a + mag, a))
        if bool(over.any()):
            self.infinite[a] = True
        return a


class _Within(TorchDispatchMode):
    """A composite op's decomposition, run with only :class:`Reach`'s channel."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False

    def __init__(self, reach: Reach) -> None:
        super().__init__()
        self.reach = reach

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        decomposed = _composite(func)
        if decomposed is not None:
            with self:
                return decomposed(*args, **kwargs)
        out = func(*args, **kwargs)
        if _is_float(out):
            self.reach.record(func, _name(func), args, kwargs, out, out)
        return out


def _composite(func: Any) -> Callable[..., Any] | None:
    """A pointwise op outside the core ATen set: its decomposition into core ops."""
    if torch.Tag.pointwise in func.tags and torch.Tag.core not in func.tags:
        return _decomposition(func)
    return None


def _decomposition(func: Any) -> Callable[..., Any] | None:
    from torch._decomp import decomposition_table  # only where a composite op is met

    return decomposition_table.get(func)


def _magnitude(v: Any) -> Any:
    return v.abs() if isinstance(v, torch.Tensor) else abs(v)


Slope = Callable[[tuple[Any, ...], dict[str, Any], torch.Tensor, int], Any]
# ``|∂out/∂args[i]|`` in closed form (a tensor or a number that broadcasts to the output)
# for the pointwise ops a loss or a norm is made of: exact, and a fraction of the cost of
# :func:`_slope`'s two extra evaluations of the op over the whole tensor.
SLOPES: dict[str, Slope] = {
    **dict.fromkeys(("add.Tensor", "add.Scalar", "sub.Tensor", "sub.Scalar"),
                    lambda a, kw, out, i: _magnitude(kw.get("alpha", 1)) if i == 1 else 1.0),
    "neg.default": lambda a, kw, out, i: 1.0,
    **dict.fromkeys(("mul.Tensor", "mul.Scalar"), lambda a, kw, out, i: _magnitude(a[1 - i])),
    **dict.fromkeys(("div.Tensor", "div.Scalar"),
                    lambda a, kw, out, i: (1 / _magnitude(a[1]) if i == 0
                                           else (out / a[1]).abs())),
    "exp.default": lambda a, kw, out, i: out.abs(),
    "log.default": lambda a, kw, out, i: 1 / a[0].abs(),
    "where.self": lambda a, kw, out, i: a[0] if i == 1 else ~a[0],
}
_STEP = 2.0**-20  # relative step of a pointwise op's own derivative (fp64: ~1e-10 exact)
_TINY = 2.0**-60


def _slope(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], i: int) -> torch.Tensor:
    """``∂out/∂args[i]`` of a pointwise op, per element of the output, by a central
    difference of the op itself at a relative step (exact to ~1e-10 in fp64, which is
    all an error model needs; no autograd below the dispatcher)."""
    a = args[i]
    h = _STEP * a.abs().clamp(min=_STEP)
    plus = func(*args[:i], a + h, *args[i + 1:], **kwargs)
    minus = func(*args[:i], a - h, *args[i + 1:], **kwargs)
    return (plus - minus) / (2 * h)


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
    s = mode.of(t)
    return s.detach().clone() if s is not None else torch.zeros_like(t)


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
            values[k] = torch.zeros_like(leaves[k]) if gr is None else gr.detach().clone()
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
