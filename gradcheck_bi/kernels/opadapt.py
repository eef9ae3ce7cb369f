"""Adapters for the family's other ops: a user's kernel → ``call(inputs, params, options, zcg)``.

The RMSNorm path (:mod:`.adapters`) calls every kernel as Megatron's ``apply(x, weight,
eps, zcg)``. A kernel recognised (:mod:`.recognise`) as another op is wrapped in an
:class:`OpAdapted` instead: each parameter of the user's callable is filled by its role —

* an input or parameter of the op (``x``, ``residual``, ``z``, ``weight``, ``bias``) with
  the point's tensor; ``eps``, ``group_size``, ``norm_before_gate`` with the point's options;
* ``prenorm`` with ``True`` when the op asks for it (the fused add: the kernel then returns
  ``residual_out``);
* ``zero_centered_gamma`` / ``offset`` as for RMSNorm (both settings run); with neither,
  zcg is taken as absent (γ = w) unless ``--kernel-arg zcg=builtin`` says otherwise;
* anything else by its default, or ``--kernel-arg``; an optional input the op does not need
  (``residual=None`` on a layer norm) keeps its default, a required one gets ``None``.

An nn.Module class is built per point (hidden size, eps, zcg, group size,
norm_before_gate under its own names) and its ``(D,)`` parameters are bound by name
(weight | w | gamma | scale; bias | b | beta) with ``torch.func.functional_call``.
"""

from __future__ import annotations

import inspect
import weakref
from collections.abc import Callable
from typing import Any

import torch

from gradcheck_bi.kernels.recognise import Recognition, recognise, roles_of
from gradcheck_bi.kernels.signature import Slot, ctor_slots, fill, parameters
from gradcheck_bi.ops import OPS
from gradcheck_bi.ops.names import ROLE_OF, TENSOR_ROLES
from gradcheck_bi.vocab import KernelLoadError, KernelSpec, Unsupported

ABSENT = "absent (γ = w)"
BUILTIN = "built in (γ = 1 + w; the stored weight is γ − 1)"
_OPTION_ROLES = ("group_size", "norm_before_gate")
_MODULES_KEPT = 16
_PROBE_D = 8


def _values(op: str, inputs: dict[str, Any], params: dict[str, Any], options: dict[str, Any],
            zcg: bool) -> dict[str, Any]:
    x = inputs[OPS[op].inputs[0]]
    return {**inputs, **params, "eps": options["eps"], "zcg": bool(zcg),
            "offset": 1.0 if zcg else 0.0, "shape": (x.shape[-1],), "size": x.shape[-1],
            "device": x.device, "dtype": next(iter(params.values()), x).dtype,
            "group_size": options.get("group_size"),
            "norm_before_gate": options.get("norm_before_gate"),
            "prenorm": OPS[op].prenorm, "none": None}


def _slots(params: list[inspect.Parameter], roles: dict[str, str | None], op: str,
           kernel_args: dict[str, Any], what: str) -> list[Slot]:
    """A slot per parameter: its role for ``op``, its default, a kernel arg, or ``None``."""
    needed = set(OPS[op].inputs) | {p.name for p in OPS[op].params} | {"eps", "zcg", "offset",
                                                                       "shape"}
    needed |= set(OPS[op].options) | ({"prenorm"} if OPS[op].prenorm else set())
    out = []
    for p in params:
        role = roles.get(p.name)
        default = None if p.default is inspect.Parameter.empty else p.default
        keyword = p.kind is inspect.Parameter.KEYWORD_ONLY
        if p.name in kernel_args:
            role = "arg"
        elif role not in needed:
            if p.default is not inspect.Parameter.empty:
                role = "default"
            elif role in TENSOR_ROLES:
                role = "none"  # an input this op does not take
            else:
                raise KernelLoadError(
                    f"kernel {what}: cannot tell what {p.name!r} should be for {op}; give "
                    f"it with --kernel-arg {p.name}=VALUE")
        out.append(Slot(p.name, str(role), default, keyword))
    return out


class _FnCall:
    """A function or a Function's ``apply``, called with its slots filled by role."""

    def __init__(self, fn: Callable[..., Any], slots: list[Slot], kernel_args: dict[str, Any]
                 ) -> None:
        self.fn, self.slots, self.kernel_args = fn, slots, kernel_args

    def __call__(self, values: dict[str, Any]) -> Any:
        args, kwargs = fill(self.slots, values, self.kernel_args)
        return self.fn(*args, **kwargs)


def _ctor_slots(factory: Callable[..., Any], what: str, kernel_args: dict[str, Any]
                ) -> list[Slot]:
    """The constructor's slots, its group_size / norm_before_gate filled from the point."""
    slots = ctor_slots(factory, what, kernel_args)
    return [Slot(s.name, s.name, s.default, s.keyword_only)
            if s.role == "default" and s.name in _OPTION_ROLES else s for s in slots]


def module_tensors(module: torch.nn.Module, d: int) -> dict[str, str]:
    """``{role: parameter name}`` for the module's ``(d,)`` parameters named as a weight or
    a bias."""
    out: dict[str, str] = {}
    for name, p in module.named_parameters():
        role = ROLE_OF.get(name.rsplit(".", 1)[-1].lower())
        if tuple(p.shape) == (d,) and role in ("weight", "bias") and role not in out:
            out[role] = name
    return out


class _ModuleCall:
    """An nn.Module class or factory, built per point, its (D,) parameters bound by name."""

    def __init__(self, factory: Callable[..., Any], name: str, op: str, kernel_args: dict[str, Any]
                 ) -> None:
        self.factory, self.name, self.op, self.kernel_args = factory, name, op, kernel_args
        self.ctor = _ctor_slots(factory, name, kernel_args)
        self._built: dict[tuple[Any, ...], tuple[torch.nn.Module, dict[str, str], list[Slot]]] = {}

    def build(self, values: dict[str, Any]) -> tuple[torch.nn.Module, dict[str, str], list[Slot]]:
        key = tuple(repr(values[k]) for k in ("size", "eps", "zcg", "device", "dtype",
                                              "group_size", "norm_before_gate"))
        if key not in self._built:
            args, kwargs = fill(self.ctor, values, self.kernel_args)
            module = self.factory(*args, **kwargs)
            if not isinstance(module, torch.nn.Module):
                raise TypeError(f"{self.name} built a {type(module).__name__}, not an nn.Module")
            module = module.to(values["device"])
            tensors = module_tensors(module, values["size"])
            missing = [p.name for p in OPS[self.op].params
                       if p.name not in tensors and not p.optional]
            if missing:
                raise KernelLoadError(f"kernel {self.name}: the module has no ({values['size']},)"
                                      f" parameter for {', '.join(missing)}")
            fwd = parameters(module.forward, f"{self.name}.forward")
            slots = _slots(fwd, roles_of(fwd, self.op), self.op, self.kernel_args, self.name)
            if len(self._built) >= _MODULES_KEPT:
                self._built.pop(next(iter(self._built)))
            self._built[key] = (module, tensors, slots)
        return self._built[key]

    def __call__(self, values: dict[str, Any]) -> Any:
        module, tensors, slots = self.build(values)
        args, kwargs = fill(slots, values, self.kernel_args)
        bound = {attr: values[role] for role, attr in tensors.items()}
        return torch.func.functional_call(module, bound, tuple(args), kwargs)


class OpAdapted:
    """A kernel of ``op`` behind ``call(inputs, params, options, zcg)`` → what it returns."""

    def __init__(self, op: str, call: Callable[[dict[str, Any]], Any], zcg: frozenset[bool],
                 how: str, absent: frozenset[str] = frozenset()) -> None:
        self.op, self._call, self.zcg, self.how = op, call, zcg, how
        self.absent = absent  # parameters of the op the kernel does not take

    def call(self, inputs: dict[str, torch.Tensor], params: dict[str, torch.Tensor],
             options: dict[str, Any], zcg: bool) -> Any:
        if bool(zcg) not in self.zcg:
            raise Unsupported(f"zero_centered_gamma={'on' if zcg else 'off'} cannot be "
                              f"asked of this kernel: zero_centered_gamma is {self.how}")
        return self._call(_values(self.op, inputs, params, options, zcg))


class _Apply:
    """Megatron's ``apply(x, weight, eps, zcg)`` (an RMSNorm kernel: a Function, an
    :class:`~gradcheck_bi.kernels.adapters.Adapted`, an apply object) called by role."""

    def __init__(self, kernel: Any) -> None:
        self.kernel = kernel

    def __call__(self, values: dict[str, Any]) -> Any:
        return self.kernel.apply(values["x"], values["weight"], values["eps"], values["zcg"])


_AS_OP: weakref.WeakKeyDictionary[Any, OpAdapted] = weakref.WeakKeyDictionary()


def as_op_kernel(fn: Any) -> Any:
    """``fn`` behind :meth:`OpAdapted.call`, the one call path every check uses: an
    :class:`OpAdapted` as it is; an RMSNorm kernel with Megatron's ``apply`` wrapped (one
    wrapper per kernel, so a first call at a shape is announced once: :mod:`.watch`). The
    wrapper asks every zcg setting of the kernel: an ``Adapted`` refuses those it lacks."""
    if isinstance(fn, OpAdapted) or not callable(getattr(fn, "apply", None)):
        return fn
    try:
        return _AS_OP[fn]
    except KeyError:
        pass
    except TypeError:  # not weakly referable: a fresh wrapper (the watch keys on it)
        return OpAdapted("rms_norm", _Apply(fn), frozenset({False, True}), "")
    wrapped = _AS_OP[fn] = OpAdapted("rms_norm", _Apply(fn), frozenset({False, True}), "")
    return wrapped


def probe_module(factory: Callable[..., Any], what: str, kernel_args: dict[str, Any]
                 ) -> tuple[list[inspect.Parameter], list[inspect.Parameter]]:
    """``(forward's parameters, extra marks)`` of a module built once on CPU at a small D:
    its constructor's parameters and one required parameter per (D,) weight or bias."""
    ctor = parameters(factory, what)
    try:
        values = {"size": _PROBE_D, "eps": 1e-6, "zcg": False, "offset": 0.0,
                  "device": torch.device("cpu"), "dtype": torch.float32, "group_size": None,
                  "norm_before_gate": True, "shape": (_PROBE_D,)}
        args, kwargs = fill(_ctor_slots(factory, what, kernel_args), values, kernel_args)
        module = factory(*args, **kwargs)
        fwd = parameters(module.forward, f"{what}.forward")
        tensors = module_tensors(module, _PROBE_D)
    except Exception:  # not buildable here (a CUDA-only module): read the class alone
        fwd = parameters(getattr(factory, "forward", factory), what)[1:]
        tensors = {}
    marks = [inspect.Parameter(attr.rsplit(".", 1)[-1], inspect.Parameter.KEYWORD_ONLY)
             for attr in tensors.values()] + ctor
    return fwd, marks


def recognise_kernel(obj: Any, kind: str, name: str, forced: str | None,
                     kernel_args: dict[str, Any], skip_first: bool = False) -> Recognition:
    """The op of a Function (``kind="function"``), a callable or a module factory."""
    if kind == "module":
        fwd, marks = probe_module(obj, name, kernel_args)
        stub = inspect.Signature(fwd)
        holder: Callable[..., Any] = lambda *a, **k: None  # noqa: E731
        holder.__signature__ = stub  # type: ignore[attr-defined]
        return recognise(holder, name, forced, extra=marks)
    target = obj.forward if kind == "function" else obj
    return recognise(target, name, forced, skip_first=skip_first)


def _zcg(slots: list[Slot], override: str | None) -> tuple[frozenset[bool], str]:
    roles = {s.role: s.name for s in slots}
    if "zcg" in roles:
        return frozenset({False, True}), f"a keyword ({roles['zcg']})"
    if "offset" in roles:
        return frozenset({False, True}), f"an offset ({roles['offset']}=1.0 under zcg)"
    if override == "builtin":
        return frozenset({True}), BUILTIN
    return frozenset({False}), ABSENT


def _probe_forward(op: str, call: Callable[[dict[str, Any]], Any], option: str,
                   candidates: tuple[Any, ...]) -> Any:
    """The candidate value of ``option`` whose fp64 reference the kernel's forward matches
    best, from one call at a small random point (fp64, else fp32, on CPU)."""
    record = OPS[op]
    gen = torch.Generator().manual_seed(0)
    for dtype in (torch.float64, torch.float32):
        draw = {n: torch.randn(2, _PROBE_D, generator=gen, dtype=torch.float64)
                for n in (*record.inputs, *(p.name for p in record.params))}
        inputs = {n: draw[n].to(dtype) for n in record.inputs}
        params = {p.name: draw[p.name][0].to(dtype) for p in record.params}
        try:
            with torch.no_grad():
                raw = call(_values(op, inputs, params, {"eps": 1e-6}, False))
        except Exception:  # refused here (a CUDA-only kernel): try the next, else assume
            continue
        y = (raw[0] if isinstance(raw, (tuple, list)) else raw).to(torch.float64)
        p64 = {n: t.to(torch.float64) for n, t in params.items()}
        i64 = {n: t.to(torch.float64) for n, t in inputs.items()}
        errors = [float((y - record.reference(i64, p64, {"eps": 1e-6, option: c})[
            record.outputs[0]]).abs().max()) for c in candidates]
        return candidates[errors.index(min(errors))]
    return None


def _fixed(op: str, roles: set[str], call: Callable[[dict[str, Any]], Any],
           kernel_args: dict[str, Any], params_named: bool
           ) -> tuple[tuple[tuple[str, Any], ...], tuple[str, ...]]:
    """The parameters and options of ``op`` the kernel does not take (no parameter fills
    their role), the value each is fixed at (a parameter: ``None``, absent), and one line
    each saying how. A module's required parameters are bound when it is built
    (``params_named`` false): only an optional one it lacks is absent."""
    fixed: list[tuple[str, Any]] = []
    how = []
    for p in OPS[op].params:
        if p.name not in roles and (params_named or p.optional):
            fixed.append((p.name, None))
            if not p.optional:  # an optional one is absent by default: nothing to say
                    how.append(f"{p.name} absent — the kernel takes none: no {p.check}, run "
                           f"as {p.name}={p.identity}")
    for option, candidates in OPS[op].fixable.items():
        if option in roles:
            continue
        if option in kernel_args:
            value, why = kernel_args[option], f"given by --kernel-arg {option}"
        elif len(candidates) == 1:
            value = candidates[0]
            why = f"the kernel takes no {option} (run as {option}={value})"
        else:
            value = _probe_forward(op, call, option, candidates)
            why = (f"the kernel takes no {option} and its forward matches {option}={value}"
                   if value is not None else
                   f"the kernel takes no {option}; no forward here, so {candidates[0]} assumed")
            value = candidates[0] if value is None else value
        fixed.append((option, value))
        how.append(f"{option} not swept — {why}")
    return tuple(fixed), tuple(how)


def adapt_op(obj: Any, kind: str, name: str, source: str, rec: Recognition,
             kernel_args: dict[str, Any], override: str | None, description: str,
             skip_first: bool = False) -> KernelSpec:
    """A :class:`KernelSpec` of ``rec.op`` whose ``fn`` is an :class:`OpAdapted`."""
    call: Callable[[dict[str, Any]], Any]
    if kind == "module":
        module_call = _ModuleCall(obj, name, rec.op, kernel_args)
        call, slots = module_call, module_call.ctor
    else:
        target = obj.forward if kind == "function" else obj
        params = parameters(target, name)[1 if skip_first else 0:]
        slots = _slots(params, rec.roles, rec.op, kernel_args, name)
        call = _FnCall(obj.apply if kind == "function" else obj, slots, kernel_args)
    used = {s.name for s in slots if s.role == "arg"}
    if kind != "module" and set(kernel_args) - used:
        extra = ", ".join(repr(e) for e in sorted(set(kernel_args) - used))
        raise KernelLoadError(f"kernel {name} takes no parameter {extra}")
    zcg, how = _zcg(slots, override)
    roles = {s.role for s in slots}
    if kind == "module":  # its forward's parameters, its (D,) tensors, may fill a role too
        forward, marks = probe_module(obj, name, kernel_args)
        roles |= {r for r in roles_of(forward).values() if r is not None}
        roles |= {ROLE_OF[m.name.lower()] for m in marks if m.name.lower() in ROLE_OF}
    fixed, fixed_how = _fixed(rec.op, roles, call, kernel_args, kind != "module")
    absent = frozenset(n for n, _ in fixed if n not in OPS[rec.op].fixable)
    return KernelSpec(name, OpAdapted(rec.op, call, zcg, how, absent), (), description,
                      source=source,
                      zcg=zcg, zcg_how=how, op=rec.op, recognised=rec.note, fixed=fixed,
                      fixed_how=fixed_how)
