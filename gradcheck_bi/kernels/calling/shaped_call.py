"""Calling a kernel of an op of any shape: its arguments by its own names, its outputs by
the op's, and what it writes into that it does not own.

A :class:`ShapedKernel` holds the user's callable and its *binding*: for each of its
parameters, the op's role or option that fills it (``A``, ``layout``), a value the op
fills itself (``out_dtype``: None), the size of one of the op's axes (``vocab_size``: the
logits' last dim), or its own default. A Function's ``apply`` takes no keywords, so every
kernel is called positionally in its own parameter order; a module class is built with the
options and sizes its constructor names and called with the tensors, and the parameters it
holds that are roles of the op (``nn.Linear``'s weight and bias) are bound to the call's
tensors with ``torch.func.functional_call``.

>>> import torch
>>> def mm(a, b, bias=None, out_dtype=None, layout="TN"):
...     return b @ a.t()
>>> k = ShapedKernel(mm, "gemm", (("a", "A"), ("b", "B"), ("bias", "bias"),
...                  ("out_dtype", "=out_dtype"), ("layout", "layout")), "function")
>>> a, b = torch.ones(3, 2), torch.ones(4, 2)
>>> k({"A": a, "B": b, "bias": None}, {"layout": "TN", "out_dtype": None})[0].shape
torch.Size([4, 3])
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from gradcheck_bi.kernels.calling import phase
from gradcheck_bi.kernels.calling.textsig import signature
from gradcheck_bi.ops import SHAPED
from gradcheck_bi.ops.shaped import sizes_of
from gradcheck_bi.vocab import ContractViolation

KEEP = "=default"  # a parameter left at the kernel's own default
SIZE = "#"  # ``#k``: the size of the op's axis ``k`` in this call's tensors
_KEPT_MODULES = 16  # modules built per kernel, by constructor arguments


@dataclass(frozen=True)
class ShapedKernel:
    """``fn`` bound to op ``op``: ``binding`` is ``(parameter, what)`` in the kernel's own
    order, ``what`` a role, an option, ``=NAME`` (a value the op fills: ``=out_dtype``) or
    :data:`KEEP`. ``kind``: ``apply`` (an autograd Function), ``function`` or ``module``
    (a class: options to its constructor, tensors to its forward)."""

    fn: Any
    op: str
    binding: tuple[tuple[str, str], ...]
    kind: str
    ctor: tuple[tuple[str, str], ...] = ()  # a module's constructor binding
    # A module's parameters that are roles of the op: ``(parameter name, role)``.
    held: tuple[tuple[str, str], ...] = ()
    _modules: dict[tuple[Any, ...], Any] = field(default_factory=dict, compare=False,
                                                 hash=False, repr=False)

    def __call__(self, tensors: dict[str, Any], options: dict[str, Any]) -> tuple[Any, ...]:
        phase.now("forward")
        sizes = _sizes(self.op, tensors, options, (*self.binding, *self.ctor))
        args = [_value(what, tensors, options, self._default(p), sizes)
                for p, what in self.binding]
        if self.kind == "module":
            kw = {p: _value(what, tensors, options, None, sizes) for p, what in self.ctor
                  if what != KEEP}
            if self.held:
                bound = {p: tensors[role] for p, role in self.held}
                out = torch.func.functional_call(self._module(kw), bound, tuple(args))
            else:
                out = self.fn(**kw)(*args)
        elif self.kind == "apply":
            out = self.fn.apply(*args)
        else:
            out = self.fn(*args)
        return tuple(out) if isinstance(out, (tuple, list)) else (out,)  # a list: its items

    def _module(self, kw: dict[str, Any]) -> Any:
        """The module built with ``kw``, kept: its held parameters are bound at each call,
        so one built module serves every call of the same sizes."""
        key = tuple(sorted((k, repr(v)) for k, v in kw.items()))
        if key not in self._modules:
            if len(self._modules) >= _KEPT_MODULES:
                self._modules.pop(next(iter(self._modules)))
            self._modules[key] = self.fn(**kw)
        return self._modules[key]

    def _default(self, name: str) -> Any:
        target = self.fn.forward if self.kind in ("apply", "module") else self.fn
        try:
            return _defaults(target).get(name)
        except TypeError:  # an unhashable callable: read it each time
            return _defaults.__wrapped__(target).get(name)

    @property
    def words(self) -> str:
        """``A←A, B←B, bias←bias, out_dtype=None, layout←layout``: the binding, readable."""
        def said(pairs: tuple[tuple[str, str], ...]) -> str:
            return ", ".join(f"{p}{'=' + what[1:] if what.startswith('=') else '←' + what}"
                             .replace(f"←{SIZE}", "←size ")
                             for p, what in pairs if what != KEEP)

        held = f"; parameters {said(self.held)}" if self.held else ""
        if self.kind == "module" and any(what != KEEP for _, what in self.ctor):
            return f"constructor {said(self.ctor)}; forward {said(self.binding)}{held}"
        return said(self.binding) + held


@functools.lru_cache(maxsize=256)
def _defaults(target: Callable[..., Any]) -> dict[str, Any]:
    """The defaults of ``target``'s parameters (read once: a finite-difference loop calls a
    kernel hundreds of thousands of times, and ``inspect.signature`` cost ~3 ms a call)."""
    try:
        params = signature(target).parameters.values()
    except (TypeError, ValueError):
        return {}
    return {p.name: p.default for p in params if p.default is not inspect.Parameter.empty}


def _sizes(op: str, tensors: dict[str, Any], options: dict[str, Any],
           binding: tuple[tuple[str, str], ...]) -> dict[str, int]:
    """The sizes of ``op``'s axes in this call, where the binding asks for one."""
    if not any(what.startswith(SIZE) for _, what in binding) or op not in SHAPED:
        return {}
    return sizes_of(SHAPED[op], tensors, options)


def _value(what: str, tensors: dict[str, Any], options: dict[str, Any], default: Any,
           sizes: dict[str, int]) -> Any:
    if what == KEEP:
        return default
    if what.startswith(SIZE):
        return sizes[what[len(SIZE):]]
    if what.startswith("="):
        return options.get(what[1:])
    if what in tensors:
        return tensors[what]
    return options[what]


def parameters(target: Callable[..., Any], skip_first: bool) -> list[inspect.Parameter]:
    """The kernel's parameters in order (``ctx`` or ``self`` dropped); ``*args`` and
    ``**kwargs`` are not parameters an op can bind."""
    ps = list(signature(target).parameters.values())
    if skip_first and ps:
        ps = ps[1:]
    return [p for p in ps if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


def snapshot(tensors: dict[str, Any]) -> dict[str, torch.Tensor]:
    """Bit copies of every tensor a call receives (inputs, cotangents)."""
    return {k: v.detach().clone() for k, v in tensors.items() if isinstance(v, torch.Tensor)}


def unchanged(stage: str, before: dict[str, torch.Tensor], now: dict[str, Any],
              allowed: frozenset[str] = frozenset()) -> list[str]:
    """Raise :class:`ContractViolation` naming a tensor the kernel wrote into during
    ``stage`` (unless ``allowed``: then the names it wrote, for a note)."""
    wrote = []
    for k, old in before.items():
        t = now[k]
        if not _same_bits(old, t.detach()):
            wrote.append(k)
    declared = [k for k in wrote
                if k in allowed or ("grad_output" in allowed and k.startswith("g:"))]
    bad = [k for k in wrote if k not in declared]
    if bad:
        which = ", ".join(k[2:] + "'s cotangent" if k.startswith("g:") else k for k in bad)
        raise ContractViolation(f"the kernel wrote into {which} during its {stage} (a tensor "
                                "it does not own; --allow-mutation NAME if by design)")
    return declared


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.is_floating_point():
        width = {8: torch.int64, 4: torch.int32, 2: torch.int16}[a.element_size()]
        return bool(torch.equal(a.contiguous().view(width), b.contiguous().view(width)))
    return bool(torch.equal(a, b))
