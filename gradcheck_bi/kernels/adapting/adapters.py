"""Adapters: the RMSNorm a user already has → one kernel with Megatron's ``apply``.

An RMSNorm with a weight and no bias is adapted here to Megatron's
``apply(x, weight, eps, zero_centered_gamma) -> y``, which the checks call by role like any
other op's kernel (:mod:`gradcheck_bi.kernels.adapting.asop`); every other op and variant is adapted
by role directly (:mod:`gradcheck_bi.kernels.adapting.opadapt`). :func:`adapt` turns each shape of
kernel people ship into that call:

* an **autograd Function** (or any object with ``apply``) with Megatron's signature is used
  as it is; a Function whose ``forward`` takes other parameters (Liger's
  ``(X, W, eps, offset, casting_mode, in_place, row_mode)``) is called by their names;
* a **plain function**, by its signature: ``f(x, weight, eps)``,
  ``f(x, weight, eps, zero_centered_gamma)``, torch's
  ``rms_norm(input, normalized_shape, weight, eps)``;
* an **nn.Module class or factory** is built for each (D, eps, zcg, device, dtype) with the
  hidden size and eps under its own parameter names; the weight is bound for each call with
  ``torch.func.functional_call``, so dw is the gradient of the module's own parameter.

zero_centered_gamma (under it the stored weight is γ − 1) reaches the kernel one of four
ways, and the :class:`~gradcheck_bi.vocab.KernelSpec` says which:

* **keyword** — a parameter named ``zero_centered_gamma`` (Megatron, Transformer Engine);
* **offset** — a parameter named ``offset``, given 1.0 under zcg, else 0.0 (Liger);
* **built in** — the kernel always computes with ``1 + w`` (Gemma): only zcg=on is run;
* **absent** — the kernel computes with ``w``: only zcg=off is run.

Built in and absent are told apart by running the kernel once at ``w = 0``: it returns 0
(γ = w) or ``x·r`` (γ = 1 + w). ``--kernel-arg zcg=builtin`` / ``zcg=absent`` says so instead.
Whichever is chosen, the forward check compares the kernel with that γ, so a wrong choice
fails rather than hides a defect.

>>> import torch
>>> spec = adapt(torch.nn.RMSNorm, "torch.nn:RMSNorm", "torch.nn:RMSNorm")
>>> sorted(spec.zcg), spec.zcg_how
([False], 'absent (γ = w)')
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch

from gradcheck_bi import gpu
from gradcheck_bi.kernels.adapting import sandbox
from gradcheck_bi.kernels.adapting.build import PROBE_D, Builder, required_inputs
from gradcheck_bi.kernels.adapting.opadapt import adapt_op, recognise_kernel
from gradcheck_bi.kernels.adapting.recognise import Recognition
from gradcheck_bi.kernels.adapting.shaped_adapt import Found, recognise
from gradcheck_bi.kernels.adapting.signature import (
    GENERIC,
    Slot,
    call_slots,
    fill,
    is_factory,
    role_of,
)
from gradcheck_bi.kernels.calling.textsig import signature
from gradcheck_bi.ops import OPS, SHAPED
from gradcheck_bi.vocab import KernelLoadError, KernelSpec, Unsupported, first_line

ZCG_CHOICES = ("builtin", "absent")
ABSENT = "absent (γ = w)"
BUILTIN = "built in (γ = 1 + w; the stored weight is γ − 1)"


def _values(x: torch.Tensor, w: torch.Tensor, eps: float, zcg: bool) -> dict[str, Any]:
    return {"x": x, "weight": w, "eps": eps, "zcg": bool(zcg), "offset": 1.0 if zcg else 0.0,
            "shape": (x.shape[-1],), "size": x.shape[-1], "device": x.device,
            "dtype": w.dtype}


class _Call:
    """A function (or a Function's ``apply``) called with its slots filled by role."""

    def __init__(self, fn: Callable[..., Any], slots: list[Slot], kernel_args: dict[str, Any]
                 ) -> None:
        self.fn, self.slots, self.kernel_args = fn, slots, kernel_args

    def __call__(self, x: torch.Tensor, w: torch.Tensor, eps: float, zcg: bool) -> Any:
        args, kwargs = fill(self.slots, _values(x, w, eps, zcg), self.kernel_args)
        return self.fn(*args, **kwargs)


class _Module:
    """An nn.Module class or factory, built per (D, eps, zcg, device, dtype), weight bound."""

    def __init__(self, builder: Builder) -> None:
        self.builder, self.name = builder, builder.name

    def build(self, x: torch.Tensor, w: torch.Tensor, eps: float, zcg: bool
              ) -> tuple[torch.nn.Module, str]:
        """The module for this point and the name of its weight parameter."""
        module = self.builder.build(_values(x, w, eps, zcg))
        return module, weight_parameter(module, x.shape[-1])

    def __call__(self, x: torch.Tensor, w: torch.Tensor, eps: float, zcg: bool) -> Any:
        module, weight = self.build(x, w, eps, zcg)
        return torch.func.functional_call(module, {weight: w}, (x,))


class NoWeightError(ValueError):
    """A module without exactly one (D,) parameter: there is no weight to check dw of."""


def weight_parameter(module: torch.nn.Module, d: int) -> str:
    """The name of the module's one parameter of shape ``(d,)`` (``weight`` if several)."""
    found = [n for n, p in module.named_parameters() if tuple(p.shape) == (d,)]
    if len(found) == 1:
        return found[0]
    if "weight" in found:
        return "weight"
    raise NoWeightError(f"{type(module).__name__} has {len(found) or 'no'} parameters of shape "
                     f"({d},){': ' + ', '.join(found) if found else ''}; expected one weight")


class Adapted:
    """A user's kernel behind Megatron's ``apply``, refusing the zcg settings it lacks."""

    def __init__(self, call: Callable[..., Any], zcg: frozenset[bool], how: str) -> None:
        self.call, self.zcg, self.how = call, zcg, how

    def apply(self, x: torch.Tensor, w: torch.Tensor, eps: float, zcg: bool) -> Any:
        if bool(zcg) not in self.zcg:
            raise Unsupported(f"zero_centered_gamma={'on' if zcg else 'off'} cannot be "
                              f"asked of this kernel: zero_centered_gamma is {self.how}")
        return self.call(x, w, eps, zcg)


# The default run's shape (gradcheck_bi.sweep.DEFAULT_SHAPE) in fp32: on CUDA the probe
# below then feeds a kernel no shape of its own (an autotuner keyed on the row count tuned
# once more, and compiled, for a (2, 8) probe; H200, docs/benchmarks.md).
PROBE_SHAPE = (2, 8, 256)


def gamma_at_zero(call: Callable[..., Any]) -> tuple[str | None, str]:
    """Run the kernel once at ``w = 0``: ``("w", "")`` if it returns 0, ``("1+w", "")`` if it
    returns ``x·r``, else ``(None, why it cannot tell)``. CPU first, then CUDA if present."""
    x = torch.randn(*PROBE_SHAPE, generator=torch.Generator().manual_seed(0))
    plain = x.double() * torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + 1e-6)
    why = ""
    for device in ["cpu"] + (["cuda"] if gpu.present() else []):
        def at_zero(device: str = device) -> torch.Tensor:
            with torch.no_grad():
                y = call(x.to(device), torch.zeros(PROBE_SHAPE[-1], device=device), 1e-6,
                         False)
            return y.detach().double().cpu().reshape(plain.shape)  # type: ignore[no-any-return]

        try:  # in a child process at load (kernels/adapting/sandbox.py): a crash costs the kernel
            y = sandbox.call(at_zero, f"its forward at w = 0, shape {PROBE_SHAPE} on {device}",
                             device)
        except Exception as exc:  # any refusal: try the next device, else say why
            why = first_line(exc)
            continue
        if float(y.abs().max()) == 0.0:
            return "w", ""
        if float((y - plain).abs().max()) <= 1e-3 * float(plain.abs().max()):
            return "1+w", ""
        return None, "at w = 0 it returned neither 0 nor x·r"
    return None, f"it did not run here to tell ({why})"


def _zcg_mapping(slots: list[Slot], override: str | None, call: Callable[..., Any]
                 ) -> tuple[frozenset[bool], str]:
    both = frozenset({False, True})
    keyword = role_of(slots, "zcg")
    if keyword is not None:
        return both, f"a keyword ({keyword.name})"
    offset = role_of(slots, "offset")
    if offset is not None:
        return both, f"an offset ({offset.name}=1.0 under zcg, 0.0 without)"
    if override is not None:
        return ((frozenset({True}), BUILTIN[:-1] + "; --kernel-arg zcg=builtin)")
                if override == "builtin" else
                (frozenset({False}), ABSENT[:-1] + "; --kernel-arg zcg=absent)"))
    seen, why = gamma_at_zero(call)
    if seen == "1+w":
        return frozenset({True}), BUILTIN
    if seen == "w":
        return frozenset({False}), ABSENT
    return frozenset({False}), (f"absent (assumed: {why}; --kernel-arg zcg=builtin if it "
                                "computes with 1 + w)")


def _is_module_factory(obj: Any) -> bool:
    if isinstance(obj, type):
        return issubclass(obj, torch.nn.Module)
    if isinstance(obj, functools.partial):
        return _is_module_factory(obj.func)
    return callable(obj) and is_factory(obj)


def _is_function(obj: Any) -> bool:
    return isinstance(obj, type) and issubclass(obj, torch.autograd.Function)


def is_apply_class(obj: Any) -> bool:
    """A class :func:`adapt` calls through its ``apply`` (an autograd Function or an apply
    object) — never an nn.Module, whose ``apply(fn)`` is another method altogether."""
    return (isinstance(obj, type) and callable(getattr(obj, "apply", None))
            and not _is_module_factory(obj))


def _a(noun: str) -> str:
    """``a Module``, ``an int``."""
    return f"{'an' if noun[:1].lower() in 'aeiou' else 'a'} {noun}"


def _unbound_apply(obj: Any) -> Any:
    """The Function class behind ``SomeFunction.apply`` (libraries export ``f =
    SomeFunction.apply``, whose signature is ``(*args, **kwargs)``): its ``forward`` says
    what the parameters are. Anything else is returned as it is."""
    owner = getattr(obj, "__self__", None)
    if (getattr(obj, "__name__", None) == "apply" and isinstance(owner, type)
            and issubclass(owner, torch.autograd.Function)):
        return owner
    return obj


def _own_forward_has_ctx(fn: type) -> bool:
    # Functions that define setup_context take no ctx in forward.
    return getattr(fn, "setup_context", None) is getattr(torch.autograd.Function,
                                                          "setup_context", None)


def _check_module_weight(builder: Builder) -> None:
    """Refuse a module with no one weight to check, or whose forward needs more than x
    (where it builds here)."""
    if builder.probe is None:
        return
    try:
        weight_parameter(builder.probe, PROBE_D)
    except NoWeightError as exc:
        raise KernelLoadError(f"kernel {builder.name}: {exc}") from None
    extra = required_inputs(builder.probe)[1:]
    if extra:
        raise KernelLoadError(
            f"kernel {builder.name}: its forward needs {', '.join(repr(n) for n in extra)} "
            "besides the input, which no norm here takes (--op NAME if it is one of "
            "`gradcheck-bi ops`)")


def _unused(kernel_args: dict[str, Any], slots: list[Slot], name: str) -> None:
    used = {s.name for s in slots if s.role == "arg"}
    extra = sorted(set(kernel_args) - used)
    if extra:
        raise KernelLoadError(
            f"kernel {name} takes no parameter {', '.join(repr(e) for e in extra)} "
            f"(its parameters: {', '.join(s.name for s in slots)})")


def adapt(obj: Any, name: str, source: str, kernel_args: dict[str, Any] | None = None,
          description: str = "") -> KernelSpec:
    """A :class:`KernelSpec` whose ``fn.apply(x, weight, eps, zcg)`` runs ``obj``.

    ``kernel_args`` fill parameters the adapter cannot (a module's ``config``, Liger's
    ``casting_mode``); the reserved ``zcg`` (``builtin`` or ``absent``) says how
    zero_centered_gamma is handled when no parameter says it. Raises
    :class:`KernelLoadError` (exit 2) for an object that is no kernel or whose parameters
    cannot be filled, :class:`~gradcheck_bi.vocab.KernelCrashed` for one that crashed or
    hung while its forward was probed (in a child process: :mod:`.sandbox`).
    """
    obj = _unbound_apply(obj)
    if kernel_args and "generic" in kernel_args:  # --generic: no op, its own forward
        return _generic(obj, name, source, kernel_args)
    return sandbox.isolated(lambda: _adapt(obj, name, source, kernel_args, description), name,
                            None if source == "api" else source, kernel_args)


# ``--generic`` (kernel arg ``generic``: the inputs' shapes): the generic check builds the
# kernel's spec (:mod:`gradcheck_bi.generic`, a layer above, which registers itself here when
# the package is imported).
GenericBuilder = Callable[[Any, str, str, list[tuple[int, ...]]], KernelSpec]
BUILDERS: list[GenericBuilder] = []


def _generic(obj: Any, name: str, source: str, kernel_args: dict[str, Any]) -> KernelSpec:
    rest = sorted(set(kernel_args) - {"generic"})
    if rest:
        raise KernelLoadError(f"kernel {name}: --generic takes no --kernel-arg or --op "
                              f"({', '.join(rest)})")
    if not BUILDERS:
        raise KernelLoadError(f"kernel {name}: the generic check is not loaded "
                              "(import gradcheck_bi)")
    return BUILDERS[0](obj, name, source, [tuple(s) for s in kernel_args["generic"]])


def _adapt(obj: Any, name: str, source: str, kernel_args: dict[str, Any] | None,
           description: str) -> KernelSpec:
    args = dict(kernel_args or {})
    override = args.pop("zcg", None)
    if override is not None and override not in ZCG_CHOICES:
        raise KernelLoadError(f"--kernel-arg zcg={override}: expected one of "
                              f"{', '.join(ZCG_CHOICES)}")
    doc = (getattr(obj, "__doc__", None) or "").strip().splitlines()
    description = description or (doc[0] if doc else "")
    if isinstance(obj, torch.nn.Module):
        raise KernelLoadError(
            f"kernel {name} is a {type(obj).__name__} instance: give its class or a factory "
            "f(hidden_size, eps), so it can be built for each shape and eps")
    forced = args.pop("op", None)  # --op NAME: the op, instead of reading it off the names
    kind = ("module" if _is_module_factory(obj) else "function" if _is_function(obj)
            else "apply" if callable(getattr(obj, "apply", None)) else "callable")
    found: Found | None = None
    if forced in SHAPED or forced is None:
        found = recognise(obj, _shaped_kind(obj, kind), forced)
        if found is not None and (found.distance <= found.match or forced is not None):
            if found.grad is False:
                raise KernelLoadError(_no_backward(obj, name, kind, found.kernel.op))
            if args:  # nothing would read them: say so rather than run without them
                raise KernelLoadError(
                    f"kernel {_signature(obj, name, kind)}: --kernel-arg "
                    f"{', '.join(sorted(args))} not used: it is read as {found.kernel.op}, "
                    "an op whose parameters are bound from its forward and whose options "
                    "are swept (`gradcheck-bi ops`); wrap the kernel to fix a value")
            return _shaped_spec(found, name, source, description)
        if forced in SHAPED:
            raise KernelLoadError(f"kernel {name}: its parameters do not bind to {forced}'s "
                                  "roles (`gradcheck-bi ops` lists them)")
    if kind == "apply" or not callable(obj):
        if forced not in (None, "rms_norm"):
            raise KernelLoadError(f"kernel {name}: --op {forced} needs a Function, a function "
                                  "or an nn.Module class")
        return _adapt_rms(obj, name, source, args, override, description)
    skip = kind == "function" and _own_forward_has_ctx(obj)
    builder = Builder(obj, name, args) if kind == "module" else None
    rec = recognise_kernel(builder or obj, kind, name, forced, args, skip)
    if rec.raised:  # a forward that only raises, and no name or parameter saying the op
        raise KernelLoadError(
            f"kernel {_signature(obj, name, kind)}: its forward raised {rec.raised} at a small "
            f"random point (fp64 and fp32 on cpu{', fp32 on cuda' if gpu.present() else ''}), "
            f"and neither its name nor its parameters say which op it is; {_what_to_do(True)}")
    if rec.unfilled and forced is None:  # parameters no op here takes
        raise KernelLoadError(_takes_no_op(obj, name, kind, rec, found))
    if rec.grad is False:
        raise KernelLoadError(_no_backward(obj, name, kind, None if rec.mismatch else rec.op))
    if rec.flip is not None and forced is None:  # an op only under another value of a flag
        raise KernelLoadError(_flip_refusal(obj, name, kind, rec.flip))
    if rec.unmatched and forced is None:
        raise KernelLoadError(_matches_nothing(obj, name, kind, rec.unmatched, found,
                                               rec.unlike))
    weightless = rec.takes == frozenset() and "eps" in rec.roles.values()
    if rec.op != "rms_norm" or (rec.takes is not None and "bias" in rec.takes) or (
            builder is not None and builder.weightless) or (weightless and kind != "module"):
        # another op, or an RMSNorm without a weight or with a bias: adapted by role
        spec = adapt_op(builder or obj, kind, name, source, rec, args, override, description,
                        skip)
    else:
        spec = replace(_adapt_rms(builder or obj, name, source, args, override, description),
                       recognised=rec.note, mismatch=rec.mismatch)
    return spec



def _signature(obj: Any, name: str, kind: str) -> str:
    """``name(x, eps, output_dtype)``: the kernel and the parameters its call takes."""
    target = getattr(obj, "forward", obj) if kind in ("module", "function") else obj
    try:
        params = list(signature(target).parameters)
    except (TypeError, ValueError):
        return name
    if kind in ("module", "function") and params and params[0] in ("self", "ctx"):
        params = params[1:]
    return f"{name}({', '.join(params)})"


def _what_to_do(broken: bool = False) -> str:
    """The end of a line refusing a kernel no op here takes: the ops, --op, the generic
    check (``broken``: its forward raised, so fixing it comes first)."""
    return (f"if it is one of the tool's ops ({', '.join(OPS)}; `gradcheck-bi "
            f"ops`), {'fix it or ' if broken else ''}say which with --op NAME, else check it "
            f"with {GENERIC}")


def _nearest(nearest: str, found: Found | None) -> list[str]:
    """The nearest op of each kind: the norms' (``nearest``, if any) and the shaped ops'."""
    near = [nearest] if nearest else []
    if found is not None and found.distance < float("inf"):
        near.append(f"{found.kernel.op} (max relative error {found.distance:.2g})")
    return near


def _matches_nothing(obj: Any, name: str, kind: str, nearest: str, found: Found | None,
                     unlike: str = "") -> str:
    """One line: the kernel's output is no op's here, the nearest of each kind, how it moves
    unlike every op (``unlike``, where its name or parameters said one), what to do."""
    other = f", and it is none of them with a defect: {unlike}" if unlike else ""
    return (f"kernel {_signature(obj, name, kind)}: its output at a small random point "
            f"matches no op here (nearest: {'; '.join(_nearest(nearest, found))}){other}; "
            f"{_what_to_do()}")


def _takes_no_op(obj: Any, name: str, kind: str, rec: Recognition, found: Found | None
                 ) -> str:
    """One line: parameters no op here takes (``rec.unfilled``), the nearest op of any
    shape, what to do."""
    # (Megatron's order, RMSNorm's reading, names no near op; an op of any shape whose
    # reference the output is not within 100 % of is no neighbour either)
    near = _nearest("", found if found is not None and found.distance < 1 else None)
    nearest = f"; nearest: {'; '.join(near)}" if near else ""
    return (f"kernel {_signature(obj, name, kind)}: no op here takes this signature (no role "
            f"of a norm fills {', '.join(repr(n) for n in rec.unfilled)}, and it is read as "
            f"no other op here{nearest}); {_what_to_do()}")


def _flip_refusal(obj: Any, name: str, kind: str,
                  flip: tuple[str, bool, str, str]) -> str:
    """One line: its output matches no op at its defaults, and an op under another value
    of one of its flags."""
    flag, value, words, closest = flip
    return (f"kernel {_signature(obj, name, kind)}: its output at a small random point "
            f"matches no op here at its defaults{f' ({closest})' if closest else ''}; with "
            f"{flag}={value} it matches {words}: check that with --kernel-arg {flag}={value}; "
            f"else check it with {GENERIC}")


def _no_backward(obj: Any, name: str, kind: str, op: str | None) -> str:
    """One line: no backward; ``op`` what its output matched (``None``: nothing here)."""
    how = f"computed as {op} under" if op else "matching no op here; computed under"
    return (f"kernel {_signature(obj, name, kind)}: its output does not require grad when "
            f"its inputs do ({how} torch.no_grad, or detached): there is no backward to "
            "check")


def _shaped_kind(obj: Any, kind: str) -> str:
    if kind == "function" and callable(getattr(obj, "apply", None)):
        return "apply"  # an autograd Function class
    return "function" if kind == "callable" else kind


def _shaped_spec(found: Found, name: str, source: str, description: str) -> KernelSpec:
    """A kernel of an op of any shape (:mod:`gradcheck_bi.kernels.adapting.shaped_adapt`)."""
    why = dict(found.how)
    how = tuple(f"{k} fixed at {v}: "
                + why.get(k, f"the kernel takes no {k} (its forward computes it)")
                for k, v in found.fixed)
    return KernelSpec(name, found.kernel, (), description, source=source,
                      zcg=frozenset({False}), op=found.kernel.op, recognised=found.note,
                      fixed=found.fixed, fixed_how=how)


def _adapt_rms(obj: Any, name: str, source: str, args: dict[str, Any], override: str | None,
               description: str) -> KernelSpec:
    """:func:`adapt` for an RMSNorm: Megatron's ``apply`` as it is, or an :class:`Adapted`."""
    call: Callable[..., Any]
    # Megatron's apply takes no β
    fixed: tuple[tuple[tuple[str, Any], ...], tuple[str, ...]] = ((("bias", None),), ())
    if isinstance(obj, Builder):  # a module: built for each point
        slots, call = obj.slots, _Module(obj)
        fixed = (fixed[0] + obj.fixed()[0], obj.fixed()[1])
        _check_module_weight(obj)
    elif _is_function(obj):
        slots = call_slots(obj.forward, f"{obj.__name__}.forward", args,
                           skip_first=_own_forward_has_ctx(obj))
        if [s.role for s in slots] == ["x", "weight", "eps", "zcg"] and not args \
                and override is None:
            return KernelSpec(name, obj, (), description, source=source)  # Megatron's own
        call = _Call(obj.apply, slots, args)
    elif callable(getattr(obj, "apply", None)):  # an apply object: Megatron's signature
        if args or override is not None:
            raise KernelLoadError(f"kernel {name}: --kernel-arg applies to functions, "
                                  "Functions and modules, not to an apply object")
        return KernelSpec(name, obj, (), description, source=source)
    elif callable(obj):
        slots = call_slots(obj, getattr(obj, "__name__", name), args)
        call = _Call(obj, slots, args)
    else:
        raise KernelLoadError(
            f"kernel {name} is {_a(type(obj).__name__)}, not a kernel: expected an autograd "
            "Function, a function or an nn.Module class (`gradcheck-bi kernels` shows each)")
    _unused(args, slots, name)
    zcg, how = _zcg_mapping(slots, override, call)
    return KernelSpec(name, Adapted(call, zcg, how), (), description, source=source, zcg=zcg,
                      zcg_how=how, fixed=fixed[0], fixed_how=fixed[1])
