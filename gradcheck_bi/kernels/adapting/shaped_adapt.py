"""A user's kernel read as an op of any shape: bindings from its signature, the op from
what its forward computes.

Candidates come from the signature: each op binds the kernel's parameters to its roles
and options — by name in any case and in the styles real libraries use (``A, B``;
``a, b``; ``x, y``; ``input, target``; ``hidden, weight``), else by position in the
op's role order — leaving a parameter with a default at it. The decision is one forward
at a small random point against each candidate's fp64 reference: the op whose reference
the output matches is the op. No op is assumed: a kernel no candidate matches goes on to
the norms' recognition, and if that refuses too, the refusal names the closest op here.

>>> import torch
>>> def gemm(A, B, bias=None, out_dtype=None, layout="TN"):
...     b = B.t() if layout[1] == "T" else B.reshape(-1, B.shape[-1])
...     y = b @ (A.t() if layout[0] == "T" else A) + (0 if bias is None else bias)
...     return y.reshape(*B.shape[:-1], -1) if layout[1] == "N" else y
>>> found = recognise(gemm, "function")
>>> found.kernel.op, found.distance == 0.0
('gemm', True)
"""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch

from gradcheck_bi import gpu
from gradcheck_bi.kernels.adapting import sandbox
from gradcheck_bi.kernels.calling.shaped_call import KEEP, SIZE, ShapedKernel, parameters
from gradcheck_bi.ops import SHAPED
from gradcheck_bi.ops.names import ROLE_OF
from gradcheck_bi.ops.shaped import Drawn, ShapedOp, Variant

PROBE_SHAPES: dict[str, tuple[int, ...]] = {}


@dataclass(frozen=True)
class Found:
    """What recognition found: the kernel bound to its op, how far its output was from
    the reference (relative; 0 when exact), and a line saying how it was read."""

    kernel: ShapedKernel
    distance: float
    note: str
    # Options the kernel does not take, at the value its forward computes (a GEMM with no
    # layout parameter: the layout that matched): swept at that value alone.
    fixed: tuple[tuple[str, Any], ...] = ()
    # The distance that matches where the probe ran (:data:`PROBES`).
    match: float = 1e-5
    # Whether its output required grad with its differentiable inputs requiring it
    # (``None``: not seen): ``False`` is a kernel with no backward to check.
    grad: bool | None = None
    # Why an entry of ``fixed`` is fixed, where it is not "the kernel takes no such option".
    how: tuple[tuple[str, str], ...] = ()


def _target(obj: Any, kind: str) -> tuple[Callable[..., Any], bool]:
    if kind == "apply":
        return obj.forward, True
    if kind == "module":
        return obj.forward, True
    return obj, False


Binding = tuple[tuple[str, str], ...]


def _by_name(op: ShapedOp, params: list[inspect.Parameter], roles: bool = True
             ) -> dict[str, str]:
    """Each parameter the op's names bind (case-insensitive): a role (only a role without
    a gradient where ``roles`` is False: a module constructor's class weights), an option,
    a value the op fills; a role or option named twice keeps its first parameter."""
    by_name: dict[str, str] = {}
    for p in params:
        low = p.name.lower()
        for r in op.roles:
            if (roles or (not r.differentiable and r.kind == "float")) and (
                    low == r.name.lower() or low in r.names):
                by_name.setdefault(p.name, r.name)
        for a in op.axes:
            if a.passed and (low == a.name or low in a.names):
                by_name.setdefault(p.name, a.name)
        if low in op.fills:
            by_name.setdefault(p.name, "=" + low)
        for axis, names in op.size_names.items():
            if low in names:
                by_name.setdefault(p.name, SIZE + axis)
    taken: dict[str, str] = {}
    for pname, what in list(by_name.items()):
        if what in taken.values():
            del by_name[pname]
        else:
            taken[pname] = what
    return by_name


Held = tuple[tuple[str, str], ...]  # a module's parameters that are roles: (name, role)
_SIZED_AT_MOST = 3  # required constructor parameters given sizes by trial


def _constructors(op: ShapedOp, obj: Any) -> list[tuple[Binding, Held]]:
    """A module class's constructor bound: by name, the op's options, the values it fills,
    an optional role without a gradient (``CrossEntropyLoss(weight=…)``) and sizes
    (``in_features``); the rest at their defaults. A module that holds roles of the op as
    its own parameters (``nn.Linear``'s weight and bias) is built at the op's default sizes
    to see them (:func:`_held`); a required parameter no name binds is tried at each size of
    the op's axes, kept where the module then holds roles of the op in their shapes
    (GPT-2's ``Conv1D(nf, nx)``). None where a required parameter is left unbound."""
    try:
        params = parameters(obj, False)
    except (TypeError, ValueError):
        return []
    by_name = _by_name(op, params, roles=False)
    unbound = [p.name for p in params
               if p.default is inspect.Parameter.empty and p.name not in by_name]
    sized = any(what.startswith(SIZE) for what in by_name.values())
    if not unbound and not sized:
        return [(tuple((p.name, by_name.get(p.name, KEEP)) for p in params), ())]
    if len(unbound) > _SIZED_AT_MOST:
        return []
    axes = list(dict.fromkeys(a for r in op.roles for a in r.axes))
    sizes = op.sizes(op.default_shape)
    out = []
    for given in itertools.permutations(axes, len(unbound)):
        binding = {**by_name, **{p: SIZE + a for p, a in zip(unbound, given, strict=True)}}
        held = _held(op, obj, binding, sizes)
        if held is not None and (held or not unbound):
            out.append((tuple((p.name, binding.get(p.name, KEEP)) for p in params), held))
    return out


def _held(op: ShapedOp, obj: Any, binding: dict[str, str], sizes: dict[str, int]
          ) -> Held | None:
    """The roles the module built with ``binding``'s sizes holds as parameters, each named
    as a differentiable role and shaped as its axes (in any order: a layout may transpose
    it); None where it does not build, or holds a parameter that is no role of the op."""
    kw = {p: sizes[what[len(SIZE):]] for p, what in binding.items() if what.startswith(SIZE)}
    try:
        module = obj(**kw)
    except Exception:  # not buildable so: not this binding
        return None
    if not isinstance(module, torch.nn.Module):
        return None
    held: dict[str, str] = {}
    for name, p in module.named_parameters():
        low = name.rsplit(".", 1)[-1].lower()
        role = next((r for r in op.roles if r.differentiable and r.name not in held.values()
                     and (low == r.name.lower() or low in r.names)), None)
        if role is None or sorted(p.shape) != sorted(sizes[a] for a in role.axes):
            return None
        held[name] = role.name
    return tuple(held.items())


def bindings(op: ShapedOp, obj: Any, kind: str) -> list[tuple[Binding, Binding, Held]]:
    """Every way the kernel's parameters can take the op's roles and options: names first
    (case-insensitive), the rest of the roles by position; at most a few candidates. Each
    is ``(constructor, call, held)``: a module class's constructor takes what its names bind
    (options, class weights, sizes), its parameters the roles it holds, its forward the
    other tensors; other kernels have no constructor."""
    try:
        target, skip = _target(obj, kind)
        params = parameters(target, skip)
    except (TypeError, ValueError, AttributeError):
        return []
    out = []
    for ctor, held in _constructors(op, obj) if kind == "module" else [((), ())]:
        out += [(ctor, call, held) for call in _calls(op, params, ctor, held)]
    return out


def _calls(op: ShapedOp, params: list[inspect.Parameter], ctor: Binding, held: Held
           ) -> list[Binding]:
    """The call's bindings (:func:`bindings`), given what the constructor and the module's
    own parameters take."""
    in_ctor = {what for _, what in (*ctor, *held) if what != KEEP}
    by_name = {p: what for p, what in _by_name(op, params).items() if what not in in_ctor}
    unbound = [r.name for r in op.roles
               if r.name not in by_name.values() and r.name not in in_ctor]
    free = [p for p in params if p.name not in by_name]
    out = []
    tensor_params = [p for p in free if p.default is inspect.Parameter.empty
                     and ROLE_OF.get(p.name.lower()) not in NOT_TENSORS]
    required_roles = [r for r in unbound if not op.role(r).optional]
    optional_roles = [r for r in unbound if op.role(r).optional]
    for order in itertools.islice(itertools.permutations(tensor_params, len(required_roles)),
                                  2):
        binding = dict(by_name)
        binding.update({p.name: rn for p, rn in zip(order, required_roles, strict=True)})
        rest = [p for p in free if p.name not in binding]
        for rn in optional_roles:  # an optional role by position, where a parameter is left
            spare = [p for p in rest if p.default is None]
            if spare:
                binding[spare[0].name] = rn
                rest = [p for p in rest if p.name != spare[0].name]
        if any(p.default is inspect.Parameter.empty for p in params if p.name not in binding):
            continue
        if not all(role.name in binding.values() or role.name in in_ctor
                   for role in op.roles if not role.optional):
            continue
        out.append(tuple((p.name, binding.get(p.name, KEEP)) for p in params))
        if not required_roles:
            break
    return out


# Where the probe runs, in turn, until the kernel takes it: fp64 on CPU, else fp32 on CPU,
# else fp32 on CUDA (a Triton kernel refuses the CPU, Megatron's GEMM fp64). Each with the
# distance a kernel computing the op matches within: fp64 ~1e-7 with fp32 inside; fp32 ~1e-3
# with TF32 inside (Triton's tl.dot and cuBLAS multiply fp32 in TF32 by default), ~1e-2 with
# bf16 inside — still far from any other op or binding (those are O(1) off).
# Names the norms read as options: never a tensor of an op bound by position.
NOT_TENSORS = {"eps", "group_size", "norm_before_gate", "prenorm", "zcg", "offset", "shape"}
PROBES: tuple[tuple[torch.dtype, str, float], ...] = (
    (torch.float64, "cpu", 1e-5), (torch.float32, "cpu", 2e-2), (torch.float32, "cuda", 2e-2))


def _call(op: ShapedOp, kernel: ShapedKernel, drawn: Drawn) -> tuple[tuple[Any, ...], bool | None]:
    """The kernel's outputs with its differentiable inputs requiring grad, and whether its
    first output did too; where it refuses inputs that require grad, without (``None``)."""
    try:
        with torch.enable_grad():
            live = {k: (v.detach().requires_grad_() * 1 if isinstance(v, torch.Tensor)
                        and op.role(k).differentiable else v)
                    for k, v in drawn.tensors.items()}
            raw = kernel(live, drawn.options)
        first = raw[0] if raw else None
        grad = bool(first.requires_grad) if isinstance(first, torch.Tensor) else None
        return tuple(t.detach() if isinstance(t, torch.Tensor) else t for t in raw), grad
    except Exception:  # an in-place write torch refuses under grad, say: without
        with torch.no_grad():
            return kernel(drawn.tensors, drawn.options), None


def _probe(op: ShapedOp, kernel: ShapedKernel, variant: Variant,
           seen_grad: list[bool | None]) -> tuple[float, float, str]:
    """The kernel's forward at a small random point against the fp64 reference: the largest
    relative error (inf when it returns another shape), the distance that matches there,
    and where it ran (the first of :data:`PROBES` the kernel does not refuse)."""
    why: Exception | None = None
    for dtype, device, match in PROBES:
        where = str(dtype).replace("torch.", "") + f" on {device}"
        if device == "cuda" and not gpu.present():
            continue
        gen = torch.Generator().manual_seed(1234)
        # Drawn on CPU and moved in the call: this process stays clear of CUDA (.sandbox)
        drawn = op.draw(op.sizes(op.default_shape), variant, dtype, "cpu", gen)
        try:
            raw, grad = sandbox.call(
                lambda d=drawn, at=device: _outputs(op, kernel, _moved(d, at)),  # type: ignore[misc]
                f"its forward as {op.name} ({dtype} on {device})", device)
        except Exception as exc:  # refused here: the next target
            why = exc
            continue
        seen_grad[0] = grad
        wide = {k: (v.to(torch.float64) if isinstance(v, torch.Tensor)
                    and v.is_floating_point() else v) for k, v in drawn.tensors.items()}
        ref = op.reference(op.canonical(wide, drawn.options), drawn.options)
        worst = 0.0
        for o, t in zip(op.outputs, raw, strict=False):
            if t is None:
                return float("inf"), match, where
            got = op.output_view(o.name, t)
            r = ref[o.name].cpu()
            if got.shape != r.shape:
                return float("inf"), match, where
            scale = float(r.abs().max()) or 1.0
            worst = max(worst, float((got - r).abs().max()) / scale)
        return worst, match, where
    assert why is not None
    raise why


def _with_role(op: ShapedOp, kernel: ShapedKernel, role: str, present: bool,
               fixed: dict[str, Any]) -> tuple[float, float]:
    """The probe's distance and match with the optional ``role`` present or absent (the other
    axes at their fixed values, else defaults); an infinite distance where it raises."""
    variant = Variant(tuple((a.name, present if a.name == role else fixed.get(a.name, a.default))
                            for a in op.axes))
    try:
        distance, match, _ = _probe(op, kernel, variant, [None])
    except Exception:  # raises so: not this reading
        return float("inf"), 0.0
    return distance, match


def _present_or_unbound(op: ShapedOp, obj: Any, kind: str, ctor: Binding, found: Found
                        ) -> Found:
    """``found`` matched with its optional roles absent (their axis at its default); each
    one it binds by position (a parameter not named as the role) is probed present too. A
    parameter that is something else (transformers' ``fixed_cross_entropy(source, target,
    num_items_in_batch)``: read as class weights by position, it divides the loss) is left
    at its default and the role fixed absent, as for a kernel that does not take it; the
    note says so. One named as the role stays bound: its output given the role is the
    kernel's to answer for."""
    fixed = dict(found.fixed)
    for role in op.roles:
        bound = [p for p, what in found.kernel.binding if what == role.name]
        if not role.optional or not bound or role.name in fixed \
                or not any(a.name == role.name for a in op.axes):
            continue
        if bound[0].lower() == role.name.lower() or bound[0].lower() in role.names:
            continue  # named so: a wrong output given it is the kernel's defect to show
        distance, match = _with_role(op, found.kernel, role.name, True, fixed)
        if distance <= match:
            continue
        binding = tuple((p, KEEP if what == role.name else what)
                        for p, what in found.kernel.binding)
        kernel = replace(found.kernel, binding=binding)
        fixed[role.name] = False
        note = found.note.replace(found.kernel.words, kernel.words).replace(
            "; max relative error", f"; {role.name} absent ({bound[0]} is not: given "
                                    f"{role.name}, its output differs); max relative error", 1)
        found = replace(found, kernel=kernel, note=note,
                        fixed=(*found.fixed, (role.name, False)))
    return found


def _held_present(op: ShapedOp, found: Found) -> Found:
    """``found`` with each optional role its module holds as a parameter (GPT-2's Conv1D
    bias) fixed present where its forward fails without it: a module that always adds its
    bias is never given ``None`` (``nn.Linear``, whose forward takes ``bias=None``, is run
    both ways)."""
    fixed = dict(found.fixed)
    for _, name in found.kernel.held:
        role = op.role(name)
        if not role.optional or name in fixed or not any(a.name == name for a in op.axes):
            continue
        distance, match = _with_role(op, found.kernel, name, False, fixed)
        if distance <= match:
            continue
        fixed[name] = True
        found = replace(found, fixed=(*found.fixed, (name, True)), how=(*found.how, (
            name, f"the module always holds its {name} (given none, its forward "
                  f"{'raises' if distance == float('inf') else 'differs'}): run with it "
                  "alone")))
    return found


def _one_at_a_time(axes: list[Any]) -> list[tuple[Any, ...]]:
    """The options' defaults, then each other value alone: what a kernel that takes none
    of them may compute (a softcap it applies inside, say)."""
    base = tuple(a.default for a in axes)
    out = [base]
    for i, a in enumerate(axes):
        out += [(*base[:i], v, *base[i + 1:]) for v in a.values[1:]]
    return out


def _moved(drawn: Drawn, device: str) -> Drawn:
    """``drawn`` with its tensors on ``device``."""
    def to(t: Any) -> Any:
        return t.to(device) if isinstance(t, torch.Tensor) else t
    return replace(drawn, tensors={k: to(v) for k, v in drawn.tensors.items()},
                   cotangents={k: to(v) for k, v in drawn.cotangents.items()})


def _outputs(op: ShapedOp, kernel: ShapedKernel, drawn: Any
             ) -> tuple[list[torch.Tensor | None], bool | None]:
    """The kernel's outputs at a probe as fp64 CPU tensors (what a load-time call may hand
    back from a child process: :mod:`.sandbox`), ``None`` for anything not a tensor, and
    whether its first output requires grad (:func:`_call`)."""
    raw, grad = _call(op, kernel, drawn)
    return [t.detach().to("cpu", torch.float64) if isinstance(t, torch.Tensor) else None
            for t in raw], grad


def recognise(obj: Any, kind: str, forced: str | None = None) -> Found | None:
    """The op of any shape the kernel computes, or ``None`` when no candidate binds; a
    candidate that binds and does not match comes back with its distance (the caller
    refuses or goes on)."""
    ops = [SHAPED[forced]] if forced in SHAPED else [
        op for op in SHAPED.values() if op.independent]
    best: Found | None = None
    for op in ops:
        for ctor, binding, held in bindings(op, obj, kind):
            kernel = ShapedKernel(obj, op.name, binding, kind, ctor, held)
            taken = {what for _, what in (*ctor, *binding, *held)}
            open_axes = [a for a in op.axes if a.passed and a.name not in taken]
            # an optional role the kernel does not take: its axis at "absent" alone
            absent = tuple((a.name, False) for a in op.axes
                           if a.name in {r.name for r in op.roles if r.optional}
                           and a.name not in taken)
            # every value of the options it lacks: the closest decides (GELU's tanh form is
            # within an fp32 probe's distance of its erf form, 1e-4 apart: the first that
            # matched read Liger's tanh GEGLU as erf)
            closest: Found | None = None
            sized = ", ".join(p for p, what in (*ctor, *binding) if what.startswith(SIZE))
            sized = f"; {sized} from the run's shape {op.shape_words}" if sized else ""
            for values in _one_at_a_time(open_axes):
                fixed = absent + tuple((a.name, v)
                                       for a, v in zip(open_axes, values, strict=True))
                variant = Variant(tuple((a.name, dict(fixed).get(a.name, a.default))
                                        for a in op.axes))
                seen_grad: list[bool | None] = [None]
                try:
                    distance, match, where = _probe(op, kernel, variant, seen_grad)
                except Exception:
                    distance, match, where = float("inf"), PROBES[0][2], "nowhere"
                note = (f"recognised {op.name} from its forward ({kernel.words}{sized}"
                        + "".join(f"; {k} fixed at {v}" for k, v in fixed)
                        + f"; max relative error {distance:.1e} against the reference, "
                        + f"{where})")
                found = Found(kernel, distance, note, fixed, match, seen_grad[0])
                if closest is None or distance / match < closest.distance / closest.match:
                    closest = found
                if distance == 0.0:
                    break
            if closest is not None and closest.distance <= closest.match:
                return _held_present(op, _present_or_unbound(op, obj, kind, ctor, closest))
            if closest is not None and (
                    best is None or closest.distance / closest.match < best.distance / best.match):
                best = closest
    return best
