"""What leaving the working precision's range loses: an absolute error channel ``α``
beside :mod:`.derive`'s ``σ`` (:class:`Reach`). A result beyond ``finfo(P).max`` is ±inf in
P and whatever uses it loses its value; one below ``finfo(P).tiny`` may flush or go
subnormal. ``α`` goes through pointwise ops by their slopes, through sums, products and
moves; a composite op is followed through its decomposition (:class:`_Within`)."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map
from torch.utils.weak import WeakTensorKeyDictionary

from gradcheck_bi.errors.aten import (
    ADDS,
    MAXIMA,
    MOVES,
    PRODUCTS,
    SLOPES,
    SUMS,
    _any,
    _composite,
    _decomposition,
    _is_float,
    _moved,
    _name,
    _slope,
    aten,
)


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

    def span(self, values: torch.Tensor) -> tuple[float, float] | None:
        """``|values|``' least and largest value as the range sees them (``values``: a
        result, signed or its magnitudes): an exact zero is in every range, so where every
        value below ``tiny`` is one (the maximum of a row minus itself, an ignored row's
        gradient), the least stands at ``tiny``. One pass where the values share a sign
        (their magnitudes' extremes are theirs); two counts decide a zero, not the three
        masks of :meth:`_own`'s search."""
        if not values.numel():
            return None
        lo, hi = torch.stack(torch.aminmax(values)).tolist()  # one read back, not two
        mag = None
        if lo < 0 < hi:  # both signs: the least magnitude is no extreme of the values
            mag = values.abs()
            lo, hi = torch.stack(torch.aminmax(mag)).tolist()
        elif hi <= 0:
            lo, hi = -hi, -lo
        if lo == 0.0:
            mag = values.abs() if mag is None else mag
            below, nonzero = torch.stack([torch.count_nonzero(mag < self.tiny),
                                          torch.count_nonzero(mag)]).tolist()
            if below == mag.numel() - nonzero:
                lo = self.tiny
        return lo, hi

    def _own(self, a: torch.Tensor | None, result: torch.Tensor,
             span: tuple[float, float] | None = None) -> torch.Tensor | None:
        """The result's own range: ``∞`` above ``max`` (it is ``±inf`` there), ``|out|``
        below ``tiny`` (flushed or a subnormal); a non-finite carried ``α`` (an input's
        ``∞`` times a zero) is the result's magnitude."""
        if span is None:
            span = self.span(result)
        if span is None or (span[1] <= self.max and span[0] >= self.tiny):
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


