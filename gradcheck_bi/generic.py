"""The generic check: a kernel that computes no op here, checked against its own forward.

Given the kernel and example tensors (as :func:`torch.autograd.gradcheck` takes them), an op
of any shape (:class:`~gradcheck_bi.ops.shaped.ShapedOp`) is built on the fly and the
engine does the rest — every floating input's gradient per element against central
differences of the kernel's own forward, random cotangents (and all-ones, the blind
control), each input strided and the cotangent strided, transposed and expanded, writes into
what the kernel does not own, batch invariance where rows are independent:

* **roles**: one per tensor argument, named by the kernel's parameters; a floating one is
  differentiable, an integer one is passed as it is; other arguments are passed as given;
* **dependency pattern**, measured, not declared: one element of each floating input is
  moved at a time (the first, the last, the middle and two at random) and the outputs that
  move are seen. Each input reaches each output **elementwise** (only the element at its
  own index, broadcast over the output's leading axes), by **rows** (elements of its row
  along the last axis), or the **whole** tensor (anything else, or an output whose shape
  does not end in the input's). The finite differences perturb together only elements no
  output element sees two of (:mod:`gradcheck_bi.fd.plan`): the last axis is *coupled*
  for rows, every axis for the whole tensor;
* **reference** — the error model only: the kernel's own forward run in fp64
  (:func:`gradcheck_bi.errors.derived` carries the rounding of each aten op it calls; the
  gradient's rounding is read from its own backward there, a magnitude, never a value
  anything is compared with). A kernel whose forward does not run in fp64 here is refused
  with that said; so are bf16/fp16 examples (no difference of a half forward resolves a
  gradient, and there is no independent gradient to hold it to);
* **forward**: not checked — there is no reference but the kernel itself; said once.

>>> import torch
>>> op, words = build(lambda x: torch.tanh(x), (torch.randn(3, 4, dtype=torch.float64),))
>>> words
['x: elementwise']
>>> op.checks
('dx', 'batch_invariance')
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from gradcheck_bi.errors import derived
from gradcheck_bi.kernels.adapting.adapters import BUILDERS
from gradcheck_bi.kernels.calling.shaped_call import ShapedKernel
from gradcheck_bi.ops import ALL_CHECKS, SHAPED
from gradcheck_bi.ops.shaped import Axis, Drawn, Output, Role, ShapedOp, Sizes, Variant
from gradcheck_bi.vocab import DTYPES, KernelLoadError, KernelSpec, first_line

PATTERNS = ("none", "elementwise", "rows", "whole")
WORDS = {"none": "reaches no output", "elementwise": "elementwise",
         "rows": "rows over the last axis", "whole": "the whole tensor"}
_PROBES = 5  # elements moved per input: first, last, middle, two at random


class GenericError(ValueError):
    """The example tensors or the kernel cannot be checked generically (said why)."""


@dataclass(frozen=True)
class _Arg:
    role: str  # the role's name, or "" for an argument passed as given
    param: str
    value: Any


def _unwrap(fn: Any) -> Any:
    """A Function's ``apply`` given as the kernel: the Function (its parameters' names)."""
    owner = getattr(fn, "__self__", None)
    if getattr(fn, "__name__", "") == "apply" and isinstance(owner, type) and issubclass(
            owner, torch.autograd.Function):
        return owner
    return fn


def _kind(fn: Any) -> str:
    if isinstance(fn, type) and issubclass(fn, torch.autograd.Function):
        return "apply"
    return "function"


def _param_names(fn: Any, kind: str, count: int) -> list[str]:
    """The kernel's first ``count`` parameter names (``ctx`` dropped), else ``input0``…"""
    try:
        target = fn.forward if kind == "apply" else fn
        params = [p for p in inspect.signature(target).parameters.values()
                  if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    except (TypeError, ValueError, AttributeError):
        params = []
    if kind == "apply" and params:
        params = params[1:]
    names = [p.name for p in params[:count]]
    return names + [f"input{i}" for i in range(len(names), count)]


def _args(fn: Any, kind: str, inputs: Sequence[Any]) -> list[_Arg]:
    names = _param_names(fn, kind, len(inputs))
    roles: list[_Arg] = []
    seen: set[str] = set()
    for i, (name, v) in enumerate(zip(names, inputs, strict=True)):
        role = name if name not in seen else f"{name}{i}"
        seen.add(role)
        roles.append(_Arg(role if isinstance(v, torch.Tensor) else "", name, v))
    return roles


def _outputs(raw: Any) -> tuple[torch.Tensor, ...]:
    out = tuple(raw) if isinstance(raw, (tuple, list)) else (raw,)
    if not out or not all(isinstance(t, torch.Tensor) for t in out):
        raise GenericError("the kernel must return a tensor or a tuple of tensors; it returned "
                           + ", ".join(type(t).__name__ for t in out))
    return out


def _wide(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to(torch.float64) if t.is_floating_point() else t.detach()


def _aligned(si: tuple[int, ...], so: tuple[int, ...]) -> bool:
    """The input's shape is the output's trailing one (broadcast over leading axes)."""
    return len(si) <= len(so) and (not si or tuple(so[len(so) - len(si):]) == si)


def _pattern(si: tuple[int, ...], so: tuple[int, ...], at: tuple[int, ...],
             moved: torch.Tensor) -> str:
    """How one moved input element at ``at`` reached the output (``moved``: a bool mask)."""
    if not bool(moved.any()):
        return "none"
    if not _aligned(si, so) or not si:
        return "whole" if si or moved.sum() > 1 else "elementwise"
    lead = len(so) - len(si)
    idx = moved.nonzero()[:, lead:]  # each moved output's coordinates on the input's axes
    here = torch.tensor(at)
    if bool((idx == here).all()):
        return "elementwise"
    if bool((idx[:, :-1] == here[:-1]).all()):
        return "rows"
    return "whole"


def _unravel(k: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    out = []
    for n in reversed(shape):
        out.append(k % n)
        k //= n
    return tuple(reversed(out))


def measure(call: Callable[[list[Any]], tuple[torch.Tensor, ...]], args: list[_Arg],
            gen: torch.Generator) -> dict[str, str]:
    """Each floating input's pattern (the widest over its probes and every output)."""
    values = [_wide(a.value) if isinstance(a.value, torch.Tensor) else a.value for a in args]
    with torch.no_grad():
        base = call(values)
    found: dict[str, str] = {}
    for i, a in enumerate(args):
        t = values[i]
        if not (isinstance(t, torch.Tensor) and t.is_floating_point()) or not a.role:
            continue
        n = t.numel()
        picks = [0, n - 1, n // 2, *torch.randint(0, max(n, 1), (2,), generator=gen).tolist()]
        worst = "none"
        # a small move, then past every other element either way: a row's maximum, a
        # sort's order or a clamp reach an output only through the element that crosses
        far = 1.0 + 4.0 * float(t.abs().max()) if n else 1.0
        for k in dict.fromkeys(picks[:_PROBES]):
            at = _unravel(k, tuple(t.shape))
            for move in (1e-3 * (1.0 + abs(float(t.reshape(-1)[k]))), far, -far):
                moved_t = t.clone(memory_format=torch.contiguous_format)  # an example may
                moved_t.view(-1)[k] += move                                # be strided
                with torch.no_grad():
                    ys = call([*values[:i], moved_t, *values[i + 1:]])
                for y0, y1 in zip(base, ys, strict=True):
                    p = _pattern(tuple(t.shape), tuple(y0.shape), at, y1 != y0)
                    worst = max(worst, p, key=PATTERNS.index)
        found[a.role] = worst
    return found


def _frame_axes(shape: tuple[int, ...]) -> tuple[str, ...]:
    """Axis names right-aligned: ``d0`` the last axis, ``d1`` the one before, …"""
    return tuple(f"d{len(shape) - 1 - j}" for j in range(len(shape)))


def build(fn: Any, inputs: Sequence[Any], name: str = "") -> tuple[ShapedOp, list[str]]:
    """The op ``fn`` computes at ``inputs``, and a line per floating input saying its
    measured dependency pattern (``x: rows over the last axis``)."""
    fn = _unwrap(fn)
    kind = _kind(fn)
    args = _args(fn, kind, inputs)
    tensors = [a for a in args if a.role]
    floats = [a for a in tensors if a.value.is_floating_point()]
    if not floats:
        raise GenericError("no floating tensor among the inputs: nothing to differentiate")
    dtypes = {a.value.dtype for a in floats}
    devices = {a.value.device.type for a in tensors}
    if len(dtypes) > 1 or len(devices) > 1:
        raise GenericError("the floating inputs must share one dtype and one device; got "
                           f"{sorted(map(str, dtypes))} on {sorted(devices)}")
    empty = [a.param for a in floats if not a.value.numel()]
    if empty:
        raise GenericError(f"the example for {empty[0]} has no elements: nothing to "
                           "differentiate there (give each input at least one element)")
    dtype = dtypes.pop()
    if dtype not in (torch.float64, torch.float32):
        raise GenericError(f"the examples are {str(dtype).removeprefix('torch.')}: the generic "
                           "check needs fp32 or fp64 (no difference of a half-precision "
                           "forward resolves a gradient, and there is no reference to hold "
                           "it to)")
    kernel_call = ShapedKernel(fn, name or "generic", tuple(
        (a.param, a.role or f"={a.param}") for a in args), kind)
    consts = {a.param: a.value for a in args if not a.role}

    def call(values: list[Any]) -> tuple[torch.Tensor, ...]:
        return _outputs(kernel_call({a.role: v for a, v in zip(args, values, strict=True)
                                     if a.role}, consts))

    try:
        outs = call([_wide(a.value) if isinstance(a.value, torch.Tensor) else a.value
                     for a in args])
    except GenericError:  # it ran, and returned what no check takes
        raise
    except Exception as exc:
        raise GenericError(f"its forward does not run in fp64 here ({type(exc).__name__}: "
                           f"{str(exc).splitlines()[0] if str(exc) else ''}): the error "
                           "model is derived from the kernel's own forward in fp64, so the "
                           "generic check cannot run") from None
    outs = tuple(o for o in outs)
    if not all(o.is_floating_point() for o in outs):
        raise GenericError("every output must be floating (an integer output has no "
                           "cotangent)")
    patterns = measure(call, args, torch.Generator().manual_seed(0))
    frame = max((tuple(o.shape) for o in outs), key=len)
    frame_axes = _frame_axes(frame)
    sizes: Sizes = dict(zip(frame_axes, frame, strict=True))

    def axes_of(key: str, shape: tuple[int, ...]) -> tuple[str, ...]:
        if _aligned(shape, frame):
            return frame_axes[len(frame) - len(shape):]
        own = tuple(f"{key}_{j}" for j in range(len(shape)))
        sizes.update(zip(own, shape, strict=True))
        return own

    out_names = ["y"] if len(outs) == 1 else [f"y{i}" for i in range(len(outs))]
    outputs = tuple(Output(n, axes_of(n, tuple(o.shape))) for n, o in zip(out_names, outs,
                                                                          strict=True))
    roles = tuple(Role(a.role, axes_of(a.role, tuple(a.value.shape)),
                       kind="float" if a.value.is_floating_point() else "index",
                       grad=a.value.is_floating_point()) for a in tensors)
    coupled: set[str] = set()
    for r in roles:
        p = patterns.get(r.name, "none")
        if p == "rows" and r.axes:
            coupled.add(r.axes[-1])
        elif p == "whole":
            coupled.update(r.axes)
    independent_rows = (all(p in ("none", "elementwise", "rows") for p in patterns.values())
                        and len(frame) >= 1 and all(o.axes == frame_axes for o in outputs)
                        and frame_axes[0] not in coupled
                        and (len(frame) >= 2 or not coupled))
    batch = frame_axes[0] if independent_rows and frame[0] >= 2 else None
    examples = {a.role: a.value.detach() for a in tensors}

    def draw(s: Sizes, variant: Variant, dt: torch.dtype, device: str,
             gen: torch.Generator) -> Drawn:
        ts: dict[str, torch.Tensor | None] = {
            k: (v.to(dtype=dt, device=device) if v.is_floating_point() else v.to(device)
                ).clone() for k, v in examples.items()}
        gs = {}
        for o, y in zip(outputs, outs, strict=True):
            g = (torch.ones(y.shape, dtype=torch.float64) if variant["cotangent"] == "ones"
                 else torch.randn(y.shape, generator=gen, dtype=torch.float64))
            gs[o.name] = g.to(dtype=dt, device=device)
        return Drawn(ts, dict(consts), gs, dict(sizes))

    def reference(t: dict[str, torch.Tensor | None], options: dict[str, Any]
                  ) -> dict[str, torch.Tensor]:
        got = _outputs(kernel_call(t, options))
        return dict(zip(out_names, got, strict=True))

    op_name = f"generic:{name or getattr(fn, '__name__', 'kernel')}"
    op = ShapedOp(
        op_name, "the kernel's own forward (a generic check: no op here)",
        roles=roles, outputs=outputs,
        axes=(Axis("cotangent", ("random", "ones"), blind="ones",
                   words="the outputs' cotangents: random, or all ones"),),
        reference=reference, canonical=lambda t, options: dict(t), draw=draw,
        sizes=lambda shape: dict(sizes), default_shape=tuple(frame) or (1,),
        shape_words="the example tensors' shapes", coupled=tuple(sorted(coupled)),
        batch_axis=lambda values: batch, column="cotangent", independent=False)
    words = [f"{r.name}: {WORDS[patterns.get(r.name, 'none')]}" for r in roles
             if r.differentiable]
    return op, words


def _derivable(op: ShapedOp) -> None:
    """Derive the error model once here, at the examples: a kernel it cannot follow is
    refused now, with the reason (and what a Function's first call under the model's
    dispatch mode imports is imported once, before the workers fork)."""
    variant = op.variants()[0]
    drawn = op.draw(op.sizes(op.default_shape), variant, torch.float64, "cpu",
                    torch.Generator().manual_seed(0))
    wide = {k: v for k, v in drawn.tensors.items()}
    wrt = [r.name for r in op.roles if r.differentiable]
    try:
        derived(lambda t: op.reference(t, drawn.options), wide, drawn.cotangents, wrt)
    except Exception as exc:
        raise GenericError("the error model cannot be derived from the kernel's own fp64 "
                           f"forward ({type(exc).__name__}: {first_line(exc)})") from None


@dataclass(frozen=True)
class Generic:
    """A kernel ready for the engine: its spec (its op registered) and what to say."""

    spec: KernelSpec
    dtype: str
    device: str
    notes: tuple[str, ...]


def prepare(fn: Any, inputs: Sequence[Any], name: str = "") -> Generic:
    """Build ``fn``'s op from ``inputs``, register it (:data:`gradcheck_bi.ops.SHAPED`, where
    the engine looks ops up; not one of :data:`~gradcheck_bi.ops.OPS`, the ops' modules;
    never offered to recognition) and say what was measured."""
    fn = _unwrap(fn)
    name = name or getattr(fn, "__qualname__", None) or type(fn).__name__
    op, words = build(fn, inputs, name)
    _derivable(op)
    SHAPED[op.name] = op
    floats = [t for t in inputs if isinstance(t, torch.Tensor) and t.is_floating_point()]
    dtype = next(k for k, v in DTYPES.items() if v == floats[0].dtype)
    device = floats[0].device.type
    kernel = ShapedKernel(fn, op.name, tuple(
        (a.param, a.role or f"={a.param}") for a in _args(fn, _kind(fn), inputs)), _kind(fn))
    batch = op.batch_axis({})
    notes = (
        "dependency pattern, measured (one element moved at a time): " + "; ".join(words),
        "forward not checked: the only reference is the kernel's own forward (its fp64 run "
        "gives the rounding model; the gradient's rounding is read off its own backward "
        "there)",
        ("batch invariance over the leading axis (rows independent)" if batch else
         "batch invariance not checked: its rows are not independent (or there is one)"),
    )
    spec = KernelSpec(name, kernel, (), "", source="api", zcg=frozenset({False}),
                      op=op.name, recognised=notes[0], fixed=())
    return Generic(spec, dtype, device, notes)


def own_checks(asked: Any) -> tuple[Any, list[str]]:
    """``asked`` (a list of check names, or anything else, left as it is) split into the
    names every op knows (``ALL_CHECKS``, validated as any run's) and the gradients a
    generic kernel's own parameters name (``d`` + an identifier: ``dinput``, ``dinput0``),
    known only once its op is built; one that names no input of it runs no point, and the
    report says so."""
    if not isinstance(asked, list):
        return asked, []
    own = [c for c in asked if isinstance(c, str) and c not in ALL_CHECKS
           and c.startswith("d") and c[1:].isidentifier()]
    rest = [c for c in asked if c not in own]
    return (rest or None) if own else asked, own


def load_spec(obj: Any, name: str, source: str, shapes: list[tuple[int, ...]]) -> KernelSpec:
    """``run --generic``'s kernel: ``obj`` at seeded fp64 inputs of ``shapes``, one per
    tensor argument in order (seeded: a worker that loads it again builds the same op)."""
    gen = torch.Generator().manual_seed(0)
    inputs = [torch.randn(*shape, generator=gen, dtype=torch.float64) for shape in shapes]
    try:
        generic = prepare(obj, inputs, name)
    except GenericError as exc:
        raise KernelLoadError(f"kernel {name}: {exc}") from None
    return replace(generic.spec, source=source, recognised="; ".join(generic.notes))


BUILDERS.append(load_spec)
