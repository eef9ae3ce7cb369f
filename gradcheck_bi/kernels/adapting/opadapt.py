"""Adapters by role: a user's kernel → ``call(inputs, params, options, zcg)``, the one call
every check makes.

An RMSNorm with a weight and no bias is adapted to Megatron's ``apply(x, weight, eps, zcg)``
(:mod:`.adapters`) and wrapped into this call (:mod:`.asop`). A kernel recognised
(:mod:`.recognise`) as another op or variant is wrapped in an :class:`OpAdapted` here
directly: each parameter of the user's callable is filled by its role —

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
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch

from gradcheck_bi.kernels.adapting import sandbox
from gradcheck_bi.kernels.adapting.behaviour import MATCH, Seen, drawn_values, probe, unlike
from gradcheck_bi.kernels.adapting.build import PROBE_D, Builder, probe_values
from gradcheck_bi.kernels.adapting.recognise import (
    _KEPT,
    Recognition,
    recognise,
    roles_of,
)
from gradcheck_bi.kernels.adapting.signature import (
    NO_OP,
    POSITIONAL,
    Slot,
    ctor_parameters,
    fill,
    parameters,
)
from gradcheck_bi.ops import ROWS
from gradcheck_bi.ops.names import ROLE_NAMES, ROLE_OF, TENSOR_ROLES
from gradcheck_bi.vocab import KernelLoadError, KernelSpec, Unsupported, first_line

ABSENT = "absent (γ = w)"
BUILTIN = "built in (γ = 1 + w; the stored weight is γ − 1)"


def _values(op: str, inputs: dict[str, Any], params: dict[str, Any], options: dict[str, Any],
            zcg: bool) -> dict[str, Any]:
    x = inputs[ROWS[op].inputs[0]]
    return {**inputs, **params, "eps": options["eps"], "zcg": bool(zcg),
            "offset": 1.0 if zcg else 0.0, "shape": (x.shape[-1],), "size": x.shape[-1],
            "device": x.device, "dtype": next(iter(params.values()), x).dtype,
            "group_size": options.get("group_size"),
            "norm_before_gate": options.get("norm_before_gate"),
            "prenorm": ROWS[op].prenorm, "none": None,
            **{a.name: options.get(a.name, a.default) for a in ROWS[op].axes}}


def _needed(op: str | None) -> set[str]:
    """The roles a call of ``op`` fills (``None``: every role, for the behaviour probe)."""
    if op is None:  # every op's own options too (a gated norm's activation)
        return set(ROLE_NAMES) | {a.name for o in ROWS.values() for a in o.axes}
    needed = set(ROWS[op].inputs) | {p.name for p in ROWS[op].params} | {"eps", "zcg", "offset",
                                                                       "shape"}
    return (needed | set(ROWS[op].options) | {a.name for a in ROWS[op].axes}
            | ({"prenorm"} if ROWS[op].prenorm else set()))


def _slots(params: list[inspect.Parameter], roles: dict[str, str | None], op: str | None,
           kernel_args: dict[str, Any], what: str) -> list[Slot]:
    """A slot per parameter: its role for ``op``, its default, a kernel arg, or ``None``."""
    needed = _needed(op)
    out = []
    for p in params:
        role = roles.get(p.name)
        default = None if p.default is inspect.Parameter.empty else p.default
        keyword = p.kind is inspect.Parameter.KEYWORD_ONLY
        if p.name in kernel_args:
            role = "arg"
        elif role not in needed or (op is None and role in _KEPT
                                    and p.default is not inspect.Parameter.empty):
            if p.default is not inspect.Parameter.empty:
                role = "default"
            elif role in TENSOR_ROLES:
                role = "none"  # an input this op does not take
            else:
                raise KernelLoadError(
                    f"kernel {what}: cannot tell what {p.name!r} should be for {op}; give "
                    f"it with --kernel-arg {p.name}=VALUE; {NO_OP}")
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
    """An nn.Module class or factory (:class:`~.build.Builder`), built per point, its (D,)
    parameters bound by name; ``absent``: the op's parameters it is known not to have."""

    def __init__(self, builder: Builder, op: str | None,
                 absent: frozenset[str] = frozenset()) -> None:
        self.builder, self.name, self.op = builder, builder.name, op
        self.ctor, self.kernel_args = builder.slots, builder.kernel_args
        self.absent = absent  # the op's parameters the module does not have
        self._forward: dict[int, tuple[torch.nn.Module, dict[str, str], list[Slot]]] = {}
        # The dtype its parameters are given in, where its forward takes no other
        # (:func:`pinned_dtype`); None: the point's.
        self.pinned: torch.dtype | None = None

    def build(self, values: dict[str, Any]) -> tuple[torch.nn.Module, dict[str, str], list[Slot]]:
        module = self.builder.build(values)
        known = self._forward.get(id(module))
        if known is None or known[0] is not module:
            tensors = module_tensors(module, values["size"])
            missing = [p.name for p in (ROWS[self.op].params if self.op else ())
                       if p.name not in tensors and not p.optional
                       and p.name not in self.absent]
            if missing:
                raise KernelLoadError(f"kernel {self.name}: the module has no ({values['size']},)"
                                      f" parameter for {', '.join(missing)}")
            fwd = parameters(module.forward, f"{self.name}.forward")
            slots = _slots(fwd, roles_of(fwd, self.op), self.op, self.kernel_args, self.name)
            if len(self._forward) >= 16:  # as many as the builder keeps
                self._forward.pop(next(iter(self._forward)))
            known = self._forward[id(module)] = (module, tensors, slots)
        return known

    def __call__(self, values: dict[str, Any]) -> Any:
        module, tensors, slots = self.build(values)
        args, kwargs = fill(slots, values, self.kernel_args)
        bound = {attr: values[role] for role, attr in tensors.items()}
        if self.pinned is not None:  # a cast autograd goes back through: dw at the point's dtype
            bound = {k: v.to(self.pinned) for k, v in bound.items()}
        return torch.func.functional_call(module, bound, tuple(args), kwargs)


_PINNED = torch.float32


def pinned_dtype(call: _ModuleCall) -> tuple[torch.dtype | None, str]:
    """fp32, and the error, for a module whose forward raises when its parameters are fp64
    and runs with them in fp32 — the one thing changed, so the clash is their dtype's,
    whatever the error's words (EsmFold2LayerNorm casts x to fp32 and hands its weight to
    ``F.layer_norm``: its weights are kept in fp32 in the model); else ``(None, "")``. One
    call each way at the load-time probe's point (:mod:`.sandbox`)."""
    if call.builder.probe is None:
        return None, ""

    def attempt(dtype: torch.dtype | None) -> str:
        call.pinned = dtype
        try:
            with torch.no_grad():
                call(drawn_values(torch.float64))
        except Exception as exc:  # the answer is the error, not a crash of this run
            return first_line(exc)
        finally:
            call.pinned = None
        return ""

    raised = sandbox.call(lambda: attempt(None), "its forward at fp64")
    if not raised:
        return None, ""
    if sandbox.call(lambda: attempt(_PINNED), "its forward at fp64, parameters in fp32"):
        return None, ""
    return _PINNED, raised


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


def probe_module(builder: Builder
                 ) -> tuple[list[inspect.Parameter], list[inspect.Parameter], set[str] | None]:
    """``(forward's parameters, extra marks, its (D,) tensors' roles)`` of a module as built
    when loaded (on CPU at a small D): the marks are its constructor's parameters and one
    required parameter per (D,) weight or bias; the roles ``None`` where it cannot be built
    here (a CUDA-only module: the class is read alone)."""
    ctor = ctor_parameters(builder.factory, builder.name)
    tensors: dict[str, str] | None = None
    if builder.probe is not None:
        fwd = parameters(builder.probe.forward, f"{builder.name}.forward")
        tensors = module_tensors(builder.probe, PROBE_D)
    else:
        fwd = parameters(getattr(builder.factory, "forward", builder.factory), builder.name)[1:]
    marks = [inspect.Parameter(attr.rsplit(".", 1)[-1], inspect.Parameter.KEYWORD_ONLY)
             for attr in (tensors or {}).values()] + ctor
    if not any(ROLE_OF.get(p.name.lower()) == "eps" for p in ctor) and not builder.no_eps:
        # in its config, or fixed
        marks.append(inspect.Parameter("eps", inspect.Parameter.KEYWORD_ONLY, default=None))
    return fwd, marks, None if tensors is None else set(tensors)


def _own_names(obj: Any) -> list[str]:
    """The kernel's own names: its class's or function's (a partial's function's)."""
    inner = getattr(obj, "factory", obj) if isinstance(obj, Builder) else obj
    inner = getattr(inner, "func", inner)
    return [n for n in (getattr(inner, "__name__", ""), getattr(inner, "__qualname__", ""))
            if n]


def _seen(obj: Any, kind: str, name: str, kernel_args: dict[str, Any],
          skip_first: bool, module: tuple[list[inspect.Parameter], set[str] | None]) -> Seen:
    """What the kernel's forward matches (:func:`.behaviour.probe`), called with every role
    its parameters or (D,) tensors fill (``module``: a module's forward parameters and
    tensors' roles, :func:`probe_module`).

    A call with required parameters no role of any op fills (``f(x, y, power)``) is probed
    in Megatron's order where it has three or four positional ones (RMSNorm's convention,
    matched against RMSNorm alone), else not at all: :attr:`.behaviour.Seen.unfilled` names
    them. Where the output matches no op, a module's point is moved to see whether it moves
    as every op's does (:attr:`.behaviour.Seen.unlike`: a class named like a norm that is
    another function); a function's or Function's parameters that name an op's roles hold it
    to that op, whose forward check then fails (a defect may move unlike the op: an RMSNorm
    whose statistic drops the row's tail at a small D is ``x·γ/√eps``). Each boolean
    parameter no role fills is flipped once (:attr:`.behaviour.Seen.flip`)."""
    call: Callable[[dict[str, Any]], Any]
    unfilled: list[str] = []
    try:
        if kind == "module":
            forward, tensors = module
            if tensors is None:
                return Seen(why="the module cannot be built here")
            call, roles = _ModuleCall(obj, None), roles_of(forward)
            taken = tensors
        else:
            target = obj.forward if kind == "function" else obj
            forward = parameters(target, name)[1 if skip_first else 0:]
            roles = _probe_roles(forward)
            unfilled = [p.name for p in forward if roles[p.name] is None
                        and p.name not in kernel_args and p.default is inspect.Parameter.empty]
            if unfilled:
                return _unfilled(obj, kind, forward, kernel_args, unfilled)
            slots = _slots(forward, roles, None, kernel_args, name)
            call = _FnCall(_callee(obj, kind), slots, kernel_args)
            taken = set()
    except KernelLoadError as exc:
        return Seen(why=str(exc))
    taken |= {r for p in forward if (r := roles[p.name]) is not None
              and (r not in _KEPT or p.default is inspect.Parameter.empty)}
    seen = probe(call, frozenset(taken))
    if not seen.errors or seen.match() is not None:
        return seen
    if kind == "module":  # a class found by its name may be another function (NoNorm)
        return replace(seen, unlike=unlike(call, frozenset(taken)))
    return replace(seen, flip=_flipped(obj, kind, name, kernel_args, forward, roles,
                                       frozenset(taken)))


def _callee(obj: Any, kind: str) -> Any:
    """What a call of the kernel calls: a Function's ``apply``, else the kernel itself."""
    return obj.apply if kind == "function" else obj


def _probe_roles(forward: list[inspect.Parameter]) -> dict[str, str | None]:
    """:func:`.recognise.roles_of`, with every op's own options (a gated norm's
    ``activation``) filled at their defaults."""
    own = {n: a.name for op in ROWS.values() for a in op.axes for n in (a.name, *a.names)}
    return {n: r if r is not None else own.get(n.lower()) for n, r in roles_of(forward).items()}


def _unfilled(obj: Any, kind: str, forward: list[inspect.Parameter],
              kernel_args: dict[str, Any], unfilled: list[str]) -> Seen:
    """A call taking parameters no role fills: probed in Megatron's order ``(x, weight,
    eps[, zero_centered_gamma])`` against RMSNorm where it has three or four positional
    ones, else not run."""
    named = ", ".join(repr(n) for n in unfilled)
    if len(forward) not in (3, 4) or any(p.kind not in POSITIONAL for p in forward) \
            or kernel_args:
        return Seen(why=f"no role fills {named}", unfilled=tuple(unfilled))
    order = ("x", "weight", "eps", "zcg")
    slots = [Slot(p.name, role) for p, role in zip(forward, order, strict=False)]
    call = _FnCall(_callee(obj, kind), slots, kernel_args)
    seen = probe(call, frozenset(order[:len(forward)]), ("rms_norm",))
    if not seen.errors and not seen.raised:  # refused on every device here (CUDA-only):
        return seen  # read in Megatron's order, as a call of it is (.signature.call_slots)
    # what it raised so read is no fault of its own: it was handed floats for tensors
    return replace(seen, unfilled=tuple(unfilled), raised="")


def _flipped(obj: Any, kind: str, name: str, kernel_args: dict[str, Any],
             forward: list[inspect.Parameter], roles: dict[str, str | None],
             taken: frozenset[str]) -> tuple[str, bool, str] | None:
    """The first boolean parameter no role fills whose other value makes the output match an
    op (fla's gated norms: a layer norm unless ``is_rms_norm=True``), that value and the
    variant it matches; ``None`` if none does."""
    for p in forward:
        if roles[p.name] is not None or p.name in kernel_args or not isinstance(p.default, bool):
            continue
        args = {**kernel_args, p.name: not p.default}
        slots = _slots(forward, roles, None, args, name)
        seen = probe(_FnCall(_callee(obj, kind), slots, args), taken)
        found = seen.match()
        if found is not None:
            return p.name, not p.default, found.words
    return None


def recognise_kernel(obj: Any, kind: str, name: str, forced: str | None,
                     kernel_args: dict[str, Any], skip_first: bool = False) -> Recognition:
    """The op of a Function (``kind="function"``), a callable or a module (a
    :class:`~.build.Builder`): from its parameters, its own names and (unless ``forced``)
    its forward's output."""
    fwd, marks, tensors = probe_module(obj) if kind == "module" else ([], [], None)
    names = _own_names(obj)
    seen = None if forced else _seen(obj, kind, name, kernel_args, skip_first, (fwd, tensors))
    if kind == "module":
        stub = inspect.Signature(fwd)
        holder: Callable[..., Any] = lambda *a, **k: None  # noqa: E731
        holder.__signature__ = stub  # type: ignore[attr-defined]
        return recognise(holder, name, forced, extra=marks, names=names, seen=seen,
                         tensors=tensors)
    target = obj.forward if kind == "function" else obj
    return recognise(target, name, forced, skip_first=skip_first, names=names, seen=seen)


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
                   roles: set[str]) -> tuple[Any, float]:
    """The value of ``option`` at which the kernel's forward is closest to its op's fp64
    reference, from one call at a small random point (:func:`.behaviour.probe`), and how
    far (relative; a match within :data:`.behaviour.MATCH`); ``None`` where it does not
    run here."""
    seen = probe(call, frozenset(roles), (op,))
    if not seen.errors:
        return None, float("inf")
    error, variant = seen.errors[0]
    return dict(variant.options).get(option), error


def _fixed(op: str, roles: set[str], call: Callable[[dict[str, Any]], Any],
           kernel_args: dict[str, Any], params_named: bool, seen: dict[str, Any]
           ) -> tuple[tuple[tuple[str, Any], ...], tuple[str, ...]]:
    """The parameters and options of ``op`` the kernel does not take (no parameter fills
    their role), the value each is fixed at (a parameter: ``None``, absent), and one line
    each saying how. A module's required parameters are bound when it is built
    (``params_named`` false: it could not be built here): only an optional one it lacks is
    absent. ``seen``: the options its output was seen to fix."""
    fixed: list[tuple[str, Any]] = []
    how = []
    for p in ROWS[op].params:
        if p.name not in roles and (params_named or p.optional):
            fixed.append((p.name, None))
            if not p.optional:  # an optional one is absent by default: nothing to say
                    how.append(f"{p.name} absent — the kernel takes none: no {p.check}, run "
                           f"as {p.name}={p.identity}")
    for option, candidates in ROWS[op].fixable.items():
        if option in roles:
            continue
        if option in kernel_args:
            value, why = kernel_args[option], f"given by --kernel-arg {option}"
        elif option in seen and (option != "group_size" or seen[option] is None):
            # the output matched one value (kernels/adapting/behaviour.py); a group of the probe's
            # row (8) says nothing of another row's
            value = seen[option]
            why = f"the kernel takes no {option} and its output matches {option}={value}"
        elif len(candidates) == 1:
            value = candidates[0]
            why = f"the kernel takes no {option} (run as {option}={value})"
        else:
            value, error = _probe_forward(op, call, option, roles | {
                p.name for p in ROWS[op].params if (p.name, None) not in fixed})
            why = (f"the kernel takes no {option} and its forward matches {option}={value}"
                   if value is not None and error <= MATCH else
                   f"the kernel takes no {option} and its forward matches no value of it "
                   f"(closest {option}={value}, max relative error {error:.2g}): run at "
                   f"{candidates[0]}" if value is not None else
                   f"the kernel takes no {option}; no forward here, so {candidates[0]} assumed")
            value = value if value is not None and error <= MATCH else candidates[0]
        fixed.append((option, value))
        how.append(f"{option} not swept — {why}")
    # its own options it does not take (a plain swiglu's multipliers): their default, which
    # is what a kernel without them computes
    fixed += [(a.name, a.default) for a in ROWS[op].axes
              if a.name not in roles and a.name not in ROWS[op].fixable]
    return tuple(fixed), tuple(how)


def _check_built(module_call: _ModuleCall) -> None:
    """Bind the module as built when loaded, so that what cannot be bound (a forward input
    no role fills, a missing weight) is refused at load (exit 2), not at every point."""
    if module_call.builder.probe is not None:
        module_call.build(probe_values())


def adapt_op(obj: Any, kind: str, name: str, source: str, rec: Recognition,
             kernel_args: dict[str, Any], override: str | None, description: str,
             skip_first: bool = False) -> KernelSpec:
    """A :class:`KernelSpec` of ``rec.op`` whose ``fn`` is an :class:`OpAdapted`."""
    call: Callable[[dict[str, Any]], Any]
    lacks = frozenset(p.name for p in ROWS[rec.op].params
                      if rec.takes is not None and p.name not in rec.takes)
    if kind == "module":
        module_call = _ModuleCall(obj, rec.op, lacks)
        call, slots = module_call, module_call.ctor
    else:
        target = obj.forward if kind == "function" else obj
        params = parameters(target, name)[1 if skip_first else 0:]
        slots = _slots(params, rec.roles, rec.op, kernel_args, name)
        call = _FnCall(_callee(obj, kind), slots, kernel_args)
    used = {s.name for s in slots if s.role == "arg"}
    if kind != "module" and set(kernel_args) - used:
        extra = ", ".join(repr(e) for e in sorted(set(kernel_args) - used))
        raise KernelLoadError(f"kernel {name} takes no parameter {extra}")
    zcg, how = _zcg(slots, override)
    if rec.variant is not None and rec.variant.zcg and len(zcg) == 1 and override is None:
        zcg, how = frozenset({True}), BUILTIN[:-1] + "; its output)"
    roles = {s.role for s in slots}
    named = kind != "module"
    if kind == "module":  # its forward's parameters, its (D,) tensors, may fill a role too
        forward, marks, _ = probe_module(obj)
        roles |= {r for r in roles_of(forward).values() if r is not None}
        roles |= {ROLE_OF[m.name.lower()] for m in marks if m.name.lower() in ROLE_OF
                  and ROLE_OF[m.name.lower()] not in TENSOR_ROLES}
        roles |= {"group_size"} if "n_groups" in roles else set()  # D / group size
        # Built here with every (D,) parameter named: what it lacks, it does not take.
        named = rec.takes is not None and obj.probe is not None and len(
            module_tensors(obj.probe, PROBE_D)) == len(obj.tensors(obj.probe, PROBE_D))
    roles = (roles - set(lacks)) | (set(rec.takes or ()) if kind == "module" else set())
    fixed, fixed_how = _fixed(rec.op, roles, call, kernel_args, named,
                              dict(rec.variant.options) if rec.variant else {})
    if kind == "module":
        own, own_how = obj.fixed(ROWS[rec.op].has("eps"))
        fixed, fixed_how = fixed + own, fixed_how + own_how
    absent = frozenset(n for n, _ in fixed if n not in ROWS[rec.op].fixable and n != "eps")
    if kind == "module":
        module_call.absent = module_call.absent | absent
        _check_built(module_call)
        module_call.pinned, clash = pinned_dtype(module_call)
        if module_call.pinned is not None:
            fixed_how += (f"its parameters given in {str(module_call.pinned)[6:]} at every "
                          f"point: its forward raises with them in float64 ({clash})",)
    return KernelSpec(name, OpAdapted(rec.op, call, zcg, how, absent), (), description,
                      source=source,
                      zcg=zcg, zcg_how=how, op=rec.op, recognised=rec.note, fixed=fixed,
                      fixed_how=fixed_how, mismatch=rec.mismatch)
