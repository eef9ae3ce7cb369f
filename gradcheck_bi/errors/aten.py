"""The aten ops the derived error model knows, by kind, and the helpers its rules share
(:mod:`.derive`, :mod:`.reach`): which ops move data, sum, multiply, select; the rounding a
pointwise op adds; the closed-form slopes of the common ones and a central difference for
the rest; a composite op's decomposition into core ops."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils._pytree import tree_map
from torch.utils.weak import WeakTensorKeyDictionary

aten = torch.ops.aten

# Roundings per result of a pointwise op, in u. Basic arithmetic is correctly rounded (1);
# a GPU's exp, log, tanh, erf are good to about 2 ulps (4 u); selection is exact (0).
ROUNDINGS: dict[str, float] = {
    **dict.fromkeys(("neg", "abs", "where", "masked_fill", "clamp", "clamp_min", "clamp_max",
                     "relu", "threshold_backward", "sign", "fill", "zeros_like", "ones_like",
                     "full_like", "maximum", "minimum", "copy", "_to_copy", "scalar_tensor",
                     "lift_fresh_copy", "lift_fresh", "empty_like", "logical_not",
                     "hardtanh", "hardtanh_backward"), 0.0),
    **dict.fromkeys(("exp", "exp2", "expm1", "log", "log2", "log1p", "tanh", "erf", "erfc",
                     "sigmoid", "pow", "rsqrt", "sin", "cos", "atan", "softplus",
                     "tanh_backward", "sigmoid_backward"), 4.0),
    **dict.fromkeys(("gelu", "silu", "gelu_backward", "silu_backward", "logit",
                     "xlogy"), 8.0),
}


# A fused op whose result is a sum of terms that cancel: its own rounding is relative to
# the terms' size, not to the result's (a kernel computes the terms and adds them). The
# magnitude its ROUNDINGS multiply, from its arguments (fp64).
def _silu_backward_terms(args: tuple[Any, ...]) -> torch.Tensor:
    g, x = args[0], args[1]  # silu'(x) = σ(x) (1 + x (1 − σ(x))): 0 at x ≈ −1.28
    s = torch.sigmoid(x)
    return (g * s).abs() * (1 + (x * (1 - s)).abs())


def _gelu_backward_terms(args: tuple[Any, ...]) -> torch.Tensor:
    g, x = args[0], args[1]  # gelu'(x) = Φ(x) + x φ(x): 0 at x ≈ −0.75 (either form)
    cdf = 0.5 * (1 + torch.erf(x * 0.5**0.5))
    pdf = torch.exp(-0.5 * x * x) * (2 * torch.pi) ** -0.5
    return g.abs() * (cdf.abs() + (x * pdf).abs())


def _gelu_terms(args: tuple[Any, ...]) -> torch.Tensor:
    x = args[0]  # x Φ(x) with Φ = (1 + erf(x/√2)) / 2: 1 + erf cancels for x ≪ 0
    return 0.5 * x.abs() * (1 + torch.erf(x * 0.5**0.5).abs())


def _tanh_backward_terms(args: tuple[Any, ...]) -> torch.Tensor:
    g, y = args[0], args[1]  # g (1 − y²): cancels where |y| → 1
    return g.abs() * (1 + y * y)


TERMS: dict[str, Callable[[tuple[Any, ...]], torch.Tensor]] = {
    "silu_backward": _silu_backward_terms, "gelu_backward": _gelu_backward_terms,
    "gelu": _gelu_terms, "tanh_backward": _tanh_backward_terms,
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

def _name(func: Any) -> str:
    return func._schema.name.split("::")[-1].rstrip("_")


def _is_float(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.is_floating_point()


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


def _composite(func: Any) -> Callable[..., Any] | None:
    """A pointwise op outside the core ATen set: its decomposition into core ops."""
    if torch.Tag.pointwise in func.tags and torch.Tag.core not in func.tags:
        return _decomposition(func)
    return None


def _decomposition(func: Any) -> Callable[..., Any] | None:
    from torch._decomp import decomposition_table  # only where a composite op is met

    return decomposition_table.get(func)


def _magnitude(v: Any) -> Any:
    """``|v|``; a tensor expanded along an axis (a sum's gradient spread over its row) keeps
    that axis expanded: its magnitudes computed once, not once per element it is read at."""
    if not isinstance(v, torch.Tensor):
        return abs(v)
    if v.dtype == torch.bool:  # a mask (amax's backward spreads by one): its own magnitude
        return v
    wide = [d for d, (n, st) in enumerate(zip(v.shape, v.stride(), strict=True))
            if st == 0 and n > 1]
    if not wide:
        return v.abs()
    base = v
    for d in wide:
        base = base.narrow(d, 0, 1)
    return base.abs().expand(v.shape)


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
    "exp.default": lambda a, kw, out, i: out,  # never negative: its own magnitude
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


