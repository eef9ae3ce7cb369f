"""What each parameter of a user's kernel is, read from its name.

A kernel under test is called as ``apply(x, weight, eps, zero_centered_gamma)``; the RMSNorms
people ship take the same things under other names and in other orders. A **slot** is one
parameter of the user's callable (a function, an autograd Function's ``forward``, a module's
constructor) and the **role** the adapter fills it with:

==========  =============================================================================
role        filled with
==========  =============================================================================
x           the input (always the first parameter of a call)
weight      the stored weight (``weight``, ``w``, ``gamma``, ``scale``)
eps         eps (``eps``, ``epsilon``, ``variance_epsilon``)
zcg         the zero_centered_gamma flag (``zero_centered_gamma``, ``zcg``)
offset      ``1.0`` under zero_centered_gamma, else ``0.0`` (Liger's ``offset``)
shape       ``(D,)``, D = x.shape[-1] (``normalized_shape`` of a call, as ``F.rms_norm``)
size        the hidden size D (a constructor's ``hidden_size``, ``dim``, ``normalized_shape``)
device      the device of x; ``dtype`` the weight's dtype (constructors only)
group_size  a constructor's group size (the point's, else D); ``n_groups`` D / group size
config      a config object the tool writes (:mod:`gradcheck_bi.kernels.adapting.build`)
arg         the value the user gave (``--kernel-arg name=value``, ``kernel_args`` in a case)
default     the parameter's own default
==========  =============================================================================

>>> import torch.nn.functional as F
>>> [(s.name, s.role) for s in call_slots(F.rms_norm, "rms_norm", {})]
[('input', 'x'), ('normalized_shape', 'shape'), ('weight', 'weight'), ('eps', 'eps')]
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gradcheck_bi.kernels.calling.textsig import signature
from gradcheck_bi.vocab import KernelLoadError

_CALL_NAMES = {
    "weight": "weight", "w": "weight", "gamma": "weight", "scale": "weight",
    "eps": "eps", "epsilon": "eps", "variance_epsilon": "eps", "variance_eps": "eps",
    "zero_centered_gamma": "zcg", "zcg": "zcg",
    "offset": "offset",
    "normalized_shape": "shape",
}
_SIZE_NAMES = ("hidden_size", "dim", "normalized_shape", "hidden_dim", "d_model",
               "num_features", "size", "n_embd")
_CTOR_NAMES = {
    **{n: "size" for n in _SIZE_NAMES},
    "eps": "eps", "epsilon": "eps", "variance_epsilon": "eps", "variance_eps": "eps",
    "zero_centered_gamma": "zcg", "zcg": "zcg",
    "offset": "offset",
    "device": "device",
    "dtype": "dtype", "params_dtype": "dtype",
    "group_size": "group_size", "n_groups": "n_groups",
    "norm_before_gate": "norm_before_gate",
    "config": "config", "cfg": "config",
}
POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
# A constructor's parameters that count or size heads: a norm per head (StableLM's, xLSTM's).
_HEAD_NAMES = ("num_heads", "n_heads", "nheads", "n_head", "num_attention_heads", "head_dim",
               "head_size", "num_key_value_heads")
# What a readable signature looks like, for messages: a norm's, a GLU's, a loss's.
_EXAMPLES = "f(x, weight, eps), f(a, b), f(logits, target), …"
VARIADIC = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
# The check of a kernel no op here computes, and the end of a refusal that points to it.
GENERIC = ("--generic --shape … per input (gradcheck_bi.check(fn, inputs=(…)) from Python), "
           "which checks its backward against its own forward")
NO_OP = f"if it is no op of the tool (`gradcheck-bi ops`), check it with {GENERIC}"
# Megatron's order, used when a 3- or 4-parameter call names its parameters otherwise.
_MEGATRON_ORDER = ("x", "weight", "eps", "zcg")


@dataclass(frozen=True)
class Slot:
    """One parameter of the user's callable and what fills it."""

    name: str
    role: str
    default: Any = None
    keyword_only: bool = False


def parameters(fn: Callable[..., Any], what: str) -> list[inspect.Parameter]:
    """The parameters of ``fn`` (``*args``/``**kwargs`` dropped); a clear error if unreadable."""
    try:
        sig = signature(fn)
    except (TypeError, ValueError):
        raise KernelLoadError(
            f"kernel {what}: its signature cannot be read (a compiled builtin?); wrap it in "
            f"a Python function that names its parameters ({_EXAMPLES})") from None
    return [p for p in sig.parameters.values() if p.kind not in VARIADIC]


def ctor_parameters(factory: Callable[..., Any], what: str) -> list[inspect.Parameter]:
    """A constructor's parameters (:func:`parameters`); a class whose constructor names none
    before ``*args`` hands them to its base (``DINOv3ConvNextLayerNorm(*args,
    data_format=…, **kwargs)`` → ``nn.LayerNorm``): the base's parameters, then its own
    keyword-only ones. Through ``**kwargs`` alone, the base's are keyword-only."""
    own = parameters(factory, what)
    try:
        every = list(signature(factory).parameters.values())
    except (TypeError, ValueError):
        return own
    star = any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in every)
    stars = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in every)
    if not isinstance(factory, type) or not (star or stars) or any(
            p.kind in POSITIONAL for p in every):
        return own
    owners = [c for c in factory.__mro__ if "__init__" in c.__dict__ and c is not object]
    if len(owners) < 2:  # the constructor's own class, then the base it hands them to
        return own
    try:
        inherited = ctor_parameters(owners[1], what)
    except KernelLoadError:
        return own
    names = {p.name for p in own}
    kept = [p if star else p.replace(kind=inspect.Parameter.KEYWORD_ONLY)
            for p in inherited if p.name not in names]
    return [*kept, *own]


def _slot(p: inspect.Parameter, role: str) -> Slot:
    default = None if p.default is inspect.Parameter.empty else p.default
    return Slot(p.name, role, default, p.kind is inspect.Parameter.KEYWORD_ONLY)


def _classify(params: list[inspect.Parameter], names: dict[str, str],
              kernel_args: dict[str, Any]) -> list[Slot | inspect.Parameter]:
    """A slot for each parameter whose role its name (or a kernel arg) gives, else itself."""
    out: list[Slot | inspect.Parameter] = []
    for p in params:
        if p.name in kernel_args:
            out.append(_slot(p, "arg"))
        elif p.name.lower() in names:
            out.append(_slot(p, names[p.name.lower()]))
        elif p.default is not inspect.Parameter.empty:
            out.append(_slot(p, "default"))
        else:
            out.append(p)
    return out


def _unknown(found: list[Slot | inspect.Parameter]) -> list[str]:
    return [p.name for p in found if isinstance(p, inspect.Parameter)]


def _signature_text(what: str, params: list[inspect.Parameter]) -> str:
    return f"{what}({', '.join(p.name for p in params)})"


def call_slots(fn: Callable[..., Any], what: str, kernel_args: dict[str, Any],
               skip_first: bool = False) -> list[Slot]:
    """Slots of a call ``fn(x, ...)``: x first, then weight, eps and the rest by name.

    ``skip_first`` drops ``ctx`` from an autograd Function's ``forward``. A call of three or
    four positional parameters whose names say nothing is read in Megatron's order
    ``(x, weight, eps[, zero_centered_gamma])``.
    """
    params = parameters(fn, what)[1 if skip_first else 0:]
    if not params:
        raise KernelLoadError(f"kernel {what} names no parameters (only *args, **kwargs): "
                              f"name them ({_EXAMPLES}), or give the autograd Function class "
                              "itself")
    found = [_slot(params[0], "x"), *_classify(params[1:], _CALL_NAMES, kernel_args)]
    slots = [s for s in found if isinstance(s, Slot)]
    roles = {s.role for s in slots}
    if _unknown(found) or not {"weight", "eps"} <= roles:
        positional = [p for p in params if p.kind in POSITIONAL]
        if len(positional) == len(params) and len(params) in (3, 4):
            return [_slot(p, role) for p, role in zip(params, _MEGATRON_ORDER, strict=False)]
        missing = _unknown(found) or [r for r in ("weight", "eps") if r not in roles]
        raise KernelLoadError(
            f"kernel {_signature_text(what, params)}: cannot tell what "
            f"{', '.join(repr(m) for m in missing)} should be for rms_norm; name the "
            "parameters x, weight, eps (and zero_centered_gamma), or give a value with "
            f"--kernel-arg name=value; {NO_OP}")
    return slots


def ctor_slots(factory: Callable[..., Any], what: str,
               kernel_args: dict[str, Any]) -> list[Slot]:
    """Slots of a module's constructor (or factory): the hidden size, eps and the rest.

    A constructor may take no hidden size (a weightless norm, ``(eps)`` or nothing) and no
    eps (a norm that fixes its own): :mod:`gradcheck_bi.kernels.adapting.build` says what then.
    """
    params = ctor_parameters(factory, what)
    found = _classify(params, _CTOR_NAMES, kernel_args)
    sizes = [s for s in found if isinstance(s, Slot) and s.role in ("size", "config")]
    if not sizes and found and isinstance(found[0], inspect.Parameter) \
            and params[0].name.lower() not in _HEAD_NAMES:
        found[0] = _slot(params[0], "size")  # an unnamed first parameter: the size
    needed = _unknown(found)
    heads = [n for n in needed if n.lower() in _HEAD_NAMES]
    if heads:  # no value of it makes a norm of the whole last axis
        raise KernelLoadError(
            f"kernel {_signature_text(what, params)} needs "
            f"{', '.join(repr(n) for n in heads)} (heads): a norm whose statistics run over "
            "each head's slice, not the whole last axis, is no op here (`gradcheck-bi ops`), "
            "so no --kernel-arg makes it one")
    if needed:
        raise KernelLoadError(
            f"kernel {_signature_text(what, params)} needs "
            f"{', '.join(repr(n) for n in needed)}: give "
            f"{' '.join(f'--kernel-arg {n}=VALUE' for n in needed)} (or kernel_args in "
            "the case file)")
    return [s for s in found if isinstance(s, Slot)]


def role_of(slots: list[Slot], role: str) -> Slot | None:
    return next((s for s in slots if s.role == role), None)


def is_factory(fn: Callable[..., Any]) -> bool:
    """A callable whose first parameter is a hidden size builds modules; it is not a norm."""
    try:
        params = list(signature(fn).parameters)
    except (TypeError, ValueError):
        return False
    return bool(params) and params[0] in _SIZE_NAMES


def fill(slots: list[Slot], values: dict[str, Any], kernel_args: dict[str, Any]
         ) -> tuple[list[Any], dict[str, Any]]:
    """Positional and keyword arguments for ``slots``, given a value per role.

    Trailing defaults are left out, so a positional-only ``apply`` gets only what it needs.
    """
    def value(s: Slot) -> Any:
        if s.role == "arg":
            return kernel_args[s.name]
        if s.role == "default":
            return s.default
        return values[s.role]

    positional = [s for s in slots if not s.keyword_only]
    while positional and positional[-1].role == "default":
        positional.pop()
    kwargs = {s.name: value(s) for s in slots if s.keyword_only and s.role != "default"}
    return [value(s) for s in positional], kwargs
