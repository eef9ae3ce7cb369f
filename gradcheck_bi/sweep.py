"""A sweep: kernels × (device, dtype) × shapes × scales × eps × seeds × checks × γ × zcg.

:class:`Sweep` holds the axes (its field names are the keys of a case file, see
``cases/README.md``); :func:`grid` expands it into ``(kernel, Config)`` points in a fixed
order. Data only: :mod:`gradcheck_bi.runner` measures the points and
:mod:`gradcheck_bi.gate` judges them.

>>> from gradcheck_bi.kernels import resolve
>>> s = Sweep(kernels=["after"], targets=[("cpu", "fp64")], checks=["forward"])
>>> [(cfg.control, cfg.layout) for _, cfg in grid(s, [resolve("after")])][:4]
[('randn', 'contiguous'), ('randn', 'x-strided'), ('ones', 'contiguous'), ('zeros', 'contiguous')]
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from gradcheck_bi import gpu
from gradcheck_bi.kernels.adapting.loader import normal_ref
from gradcheck_bi.kernels.calling.layout import LAYOUTS, applies
from gradcheck_bi.ops import ALL_CHECKS, ROWS, SHAPED, Op
from gradcheck_bi.ops.fields import PointAxis
from gradcheck_bi.ops.shaped import ShapedOp, Variant
from gradcheck_bi.point import AXES, BY_KEY, OP_AXES_OWN, OP_KEYS
from gradcheck_bi.vocab import CONTROLS, Config, Expectation, KernelSpec

DEFAULT_SHAPE = (2, 8, 256)
# A strided input and a strided cotangent at γ = randn; cases/ci.toml sweeps every layout.
DEFAULT_LAYOUTS = ("contiguous", "x-strided", "grad-strided")
# A case file's points stop after this long unless it sets its own ``timeout``: a gate runs
# unattended, and a hang must cost one point, not the CI job. Generous: the largest point of
# the shipped cases takes seconds on a 2-core CPU. A one-off run has no limit (Ctrl-C is at
# hand, and a large shape on CPU may rightly take minutes).
CASE_TIMEOUT_S = 600.0


def default_targets() -> list[tuple[str, str]]:
    """fp64 on CPU, plus fp32 on CUDA when a GPU is present."""
    targets = [("cpu", "fp64")]
    if gpu.present():
        targets.append(("cuda", "fp32"))
    return targets


@dataclass
class Sweep:
    """The axes of a sweep. Every list is an axis; the grid is their product."""

    kernels: list[str] = field(default_factory=lambda: ["before", "after"])
    targets: list[tuple[str, str]] = field(default_factory=default_targets)
    shapes: list[tuple[int, ...]] = field(default_factory=lambda: [DEFAULT_SHAPE])
    input_scales: list[float] = field(default_factory=lambda: [1.0])
    weight_scales: list[float] = field(default_factory=lambda: [1.0])
    eps: list[float] = field(default_factory=lambda: [1e-6])
    seeds: list[int] = field(default_factory=lambda: [0])
    checks: list[str] | None = None  # None: every check the dtype supports
    weights: list[str] = field(default_factory=lambda: list(CONTROLS))
    zcg: list[bool] = field(default_factory=lambda: [False, True])
    atol: float | None = None
    rtol: float | None = None
    stencil: str = "central-4"
    step_rel: float | None = None
    max_memory: int | None = None  # None: the default budget (gradcheck_bi.fd.budget)
    mode: str = "full"  # dx: "full" (every element) or "directional" (random projections)
    directions: int = 8
    precision: str = "measured"  # rounding judged at the measured working precision, or "exact"
    expect: str | None = None  # "fail": every result of every kernel is expected to fail
    # A case's [[expectation]] rules; the last match decides (see Expectation).
    expectations: list[Expectation] = field(default_factory=list)
    # Values for the user's kernel parameters the adapter cannot fill (a module's config).
    kernel_args: dict[str, Any] = field(default_factory=dict)
    # Tensors the kernels may write into by design ("x", "weight", "grad_output"): a note,
    # not a failure (kernels/calling/writes.py compares each before and after).
    allow_mutation: list[str] = field(default_factory=list)
    # Seconds a point may run before it is an ``error`` and its worker is killed
    # (gradcheck_bi.workers); None or 0: no limit. Case files default to CASE_TIMEOUT_S.
    timeout: float | None = None
    # Memory layouts (kernels/calling/layout.py): every point runs contiguous; each other layout is
    # crossed with γ = randn and the checks it applies to (layout bugs do not hide behind γ).
    layouts: list[str] = field(default_factory=lambda: list(DEFAULT_LAYOUTS))
    # The lists a case gives for the fields only some ops have (point.OP_KEYS: β's control,
    # the options an op's record declares as point fields), by case key; a key not here is
    # swept at its op's values (PointAxis.swept).
    options: dict[str, list[Any]] = field(default_factory=dict)

    def checks_for(self, dtype: str) -> list[str]:
        return list(self.checks) if self.checks is not None else list(ALL_CHECKS)


def sweep_of(**keys: Any) -> Sweep:
    """A :class:`Sweep` from case keys by name: an op's own (:data:`~gradcheck_bi.point.
    OP_KEYS`) go to its ``options``, every other one is a field."""
    own = {k: keys.pop(k) for k in list(keys) if k in OP_KEYS}
    return Sweep(**keys, options={**keys.pop("options", {}), **own})


def grid(sweep: Sweep, kernels: list[KernelSpec]) -> Iterator[tuple[KernelSpec, Config]]:
    """Every point of the sweep, in a fixed order (check, zcg, kernel, target, ..., γ).

    A kernel is left out at a zcg setting it cannot take (:func:`not_run` says which); a
    kernel of an op of any shape gets its op's own points (:func:`shaped_points`)."""
    shaped = [s for s in kernels if s.op in SHAPED]
    kernels = [s for s in kernels if s.op not in SHAPED]
    yield from shaped_points(sweep, shaped)
    for device, dtype in sweep.targets:
        for (check, zcg, spec, shape, scale, wscale, eps, seed, control,
             layout) in itertools.product(
            sweep.checks_for(dtype), sweep.zcg, kernels, sweep.shapes, sweep.input_scales,
            sweep.weight_scales, sweep.eps, sweep.seeds, sweep.weights, sweep.layouts,
        ):
            if zcg not in spec.zcg:  # a kernel without zcg, or with zcg built in
                continue
            if "eps" in dict(spec.fixed):  # a module that fixes its eps: at its own, once
                if eps != sweep.eps[0]:
                    continue
                eps = dict(spec.fixed)["eps"]
            if layout not in LAYOUTS:  # an op of any shape's (A-strided): said by not_run
                continue
            if layout != "contiguous" and (control != "randn" or not applies(layout, check)):
                continue
            if check not in checks_of(spec):  # e.g. dz asked of an RMSNorm, dw of no weight
                continue
            gamma = ROWS[spec.op].offset_param  # what the point's control and zcg act on
            has_gamma = takes_gamma(spec)
            if (control != sweep.weights[0] or zcg) and not has_gamma:
                continue  # no γ: its controls and zcg would repeat one point
            if layout.startswith("weight-") and not any(takes(spec, p.name)
                                                        for p in ROWS[spec.op].params):
                continue
            if gamma is not None and not has_gamma:
                control = gamma.identity  # γ ≡ 1: no affine
            mode: dict[str, Any] = {BY_KEY["zcg"].field: zcg}  # γ's mode (ops.record.ZCG)
            cfg = Config(
                check=check, device=device, dtype=dtype, shape=tuple(shape), eps=eps,
                seed=seed, control=control, input_scale=scale, weight_scale=wscale,
                layout=layout, **mode, **settings(sweep),
            )
            yield from ((spec, c) for c in op_points(spec, cfg, sweep))


def shaped_layouts(op: ShapedOp, sweep: Sweep) -> list[str]:
    """Contiguous; each float role strided; the cotangent strided, transposed, and expanded
    from one value (stride 0: what a ``.sum()``'s backward hands on) — unless the sweep
    names its own."""
    own = op_layouts(op)
    if list(sweep.layouts) != list(DEFAULT_LAYOUTS):  # those of them the op has
        return [layout for layout in sweep.layouts if layout in own]
    return own


def op_layouts(op: ShapedOp) -> list[str]:
    """Every layout an op of any shape can be given: contiguous, each float role strided,
    the cotangent strided, transposed (an output of two axes or more) and expanded."""
    out = ["contiguous", *(f"{r.name}-strided" for r in op.roles if r.kind == "float"),
           "grad-strided"]
    if any(len(o.axes) >= 2 for o in op.outputs):
        out.append("grad-transposed")
    out.append("grad-expanded")
    return out


def _layouts_lacking(sweeps: list[Sweep], spec: KernelSpec) -> list[str]:
    """Why each layout a sweep names that the kernel's op does not have (``x-strided`` of a
    GEMM, ``A-strided`` of a norm) is left out: said, not run contiguous in its place. The
    default list names no layout an op lacks (an op of any shape takes its own instead)."""
    own = op_layouts(SHAPED[spec.op]) if spec.op in SHAPED else list(LAYOUTS)
    asked = dict.fromkeys(layout for sw in sweeps if list(sw.layouts) != list(DEFAULT_LAYOUTS)
                          for layout in sw.layouts if layout not in own)
    return [f"layout {layout} not run: {spec.op} has no such layout (its layouts: "
            f"{', '.join(own)})" for layout in asked]


def _layout_applies(op: ShapedOp, layout: str, variant: Variant, check: str) -> bool:
    if layout == "contiguous":
        return True
    if check == "forward" and layout.startswith("grad"):
        return False
    if layout == "grad-expanded":  # a uniform cotangent only: one value expanded
        return any(variant.get(a.name) == a.blind for a in op.axes if a.name == "cotangent")
    if check == "forward" and layout.startswith("grad"):
        return False
    return True


def shaped_points(sweep: Sweep, kernels: list[KernelSpec]) -> Iterator[tuple[KernelSpec,
                                                                              Config]]:
    """The points of kernels of ops of any shape: checks × the op's variants (its default,
    each other value alone, its crossed pairs) × input scales (an op that draws at one:
    ``ShapedOp.scaled``) × layouts (with the default variant, and
    the cotangent's layouts with its blind one too) — an option the kernel fixes at its
    value alone; a check of an absent role, or batch invariance where the op's rows are
    not independent, left out."""
    for device, dtype in sweep.targets:
        for spec in kernels:
            op = SHAPED[spec.op]
            fixed = {k: [v] for k, v in spec.fixed}
            variants = op.variants(fixed)
            shapes = ([op.default_shape] if [tuple(s) for s in sweep.shapes] == [DEFAULT_SHAPE]
                      else [tuple(s) for s in sweep.shapes])
            checks = [c for c in sweep.checks_for(dtype) if c in op.checks] \
                if sweep.checks is not None else list(op.checks)
            layouts = shaped_layouts(op, sweep)
            scales = sweep.input_scales if op.scaled else [1.0]
            for check, shape, scale, seed, variant, layout in itertools.product(
                    checks, shapes, scales, sweep.seeds, variants, layouts):
                if not _variant_has(op, variant, check):
                    continue
                if layout != "contiguous" and not (
                        variant == variants[0] or layout == "grad-expanded"):
                    continue
                if not _layout_applies(op, layout, variant, check):
                    continue
                if layout.endswith("-strided") and not layout.startswith("grad"):
                    r = op.role(layout[: -len("-strided")])
                    if r.optional and variant.get(r.name) is False:
                        continue
                yield spec, Config(check=check, device=device, dtype=dtype,
                                   shape=tuple(shape), seed=seed, layout=layout,
                                   input_scale=scale, op=spec.op, variant=variant.values,
                                   precision=sweep.precision, mode=sweep.mode,
                                   directions=sweep.directions)


def _variant_has(op: ShapedOp, variant: Variant, check: str) -> bool:
    """Whether ``check`` applies at ``variant``: an optional role must be there, batch
    invariance needs a batch axis."""
    if check == "batch_invariance":
        return op.batch_axis(dict(variant.values)) is not None
    role = op.gradient_checks.get(check)
    if role is None:
        return check == "forward" or check not in op.checks
    r = op.role(role)
    return not r.optional or bool(variant.get(role, True))


def takes(spec: KernelSpec, name: str) -> bool:
    """Whether the kernel takes its op's parameter ``name`` (not absent: ``spec.fixed``;
    Megatron's ``apply`` has no β)."""
    return ROWS[spec.op].has(name) and name not in dict(spec.fixed)


def takes_gamma(spec: KernelSpec) -> bool:
    """Whether the kernel takes the parameter its point's control and zcg act on (its op's
    :attr:`~gradcheck_bi.ops.record.Op.offset_param`, γ)."""
    gamma = ROWS[spec.op].offset_param
    return gamma is not None and takes(spec, gamma.name)


def checks_of(spec: KernelSpec) -> tuple[str, ...]:
    """Its op's checks, less those of the parameters it does not take."""
    if spec.op in SHAPED:
        return SHAPED[spec.op].checks
    op = ROWS[spec.op]
    return tuple(c for c in op.checks
                 if c not in {p.check for p in op.params if not takes(spec, p.name)})


def settings(sweep: Sweep) -> dict[str, Any]:
    """The point's axes a sweep sets once, not crosses (atol, stencil, mode, …), by field."""
    return {a.field: getattr(sweep, a.key) for a in AXES if a.key and not a.plural}


def op_points(spec: KernelSpec, cfg: Config, sweep: Sweep) -> Iterator[Config]:
    """``cfg`` at every value of the fields only some ops have (:data:`~gradcheck_bi.point.
    OP_AXES_OWN`: β's control, the options an op's record declares) that the kernel's op
    has, and of its own options; a parameter the kernel does not take at its identity (an
    optional one: absent), an option it fixes (``spec.fixed``) at its value alone."""
    op, fixed = ROWS[spec.op], dict(spec.fixed)
    crossed = [_values(spec, op, axis, sweep, cfg.shape[-1], fixed) for axis in OP_AXES_OWN]
    for *values, own in itertools.product(*crossed, own_options(op, fixed)):
        yield replace(cfg, op=spec.op, variant=own,
                      **{a.field: v for a, v in zip(OP_AXES_OWN, values, strict=True)})


def _values(spec: KernelSpec, op: Op, axis: PointAxis, sweep: Sweep, d: int,
            fixed: dict[str, Any]) -> list[Any]:
    """The values ``axis`` takes for the kernel at row length ``d`` (``[None]``: its op
    has no such field)."""
    if axis.field not in {a.field for a in op.point_axes}:
        return [None]
    param = next((p for p in op.params if axis.field in {a.field for a in p.axes}), None)
    if param is not None and not takes(spec, param.name):  # β ≡ 0; an optional one: no β
        return [None if param.optional else param.identity]
    if axis.field in fixed:
        return axis.swept([fixed[axis.field]], d)
    return axis.swept(sweep.options.get(axis.key or ""), d)


def own_options(op: Op, fixed: dict[str, Any]) -> list[tuple[tuple[str, Any], ...]]:
    """The op's own options (:attr:`Op.axes`) at every point: their defaults, then each
    other value alone; one the kernel fixes at its value alone."""
    axes = {a.name: [fixed[a.name]] if a.name in fixed else list(a.values) for a in op.axes}
    base = {k: vs[0] for k, vs in axes.items()}
    points = [base] + [{**base, k: v} for k, vs in axes.items() for v in vs[1:]]
    return [tuple(p.items()) for p in points]


def with_overrides(sweep: Sweep, **overrides: Any) -> Sweep:
    """A copy of ``sweep`` with every non-``None`` override applied (command line over case),
    by case key as :func:`sweep_of` takes them."""
    given = {k: v for k, v in overrides.items() if v is not None}
    own = {k: given.pop(k) for k in list(given) if k in OP_KEYS}
    return replace(sweep, **given, options={**sweep.options, **own})


def _asking(sweeps: list[Sweep], spec: KernelSpec) -> list[Sweep]:
    """The sweeps that name ``spec`` among their kernels."""
    return [s for s in sweeps if {spec.name, spec.source} & {normal_ref(k) for k in s.kernels}]


def _dropped_zcg(sweeps: list[Sweep], spec: KernelSpec) -> list[bool]:
    """The zcg settings a sweep asked of ``spec`` that :func:`grid` leaves out."""
    asked = _asking(sweeps, spec)
    return [zcg for zcg in (False, True)
            if zcg not in spec.zcg and any(zcg in s.zcg for s in asked)]


def _axes_not_run(sweeps: list[Sweep], spec: KernelSpec) -> list[str]:
    """The layouts the op lacks and the zcg settings left out (a kernel without its op's
    weight: :attr:`KernelSpec.fixed_how` says so, and zcg goes with it)."""
    lines = [f"{spec.name}: {why}" for why in _layouts_lacking(sweeps, spec)]
    if spec.op in SHAPED:  # its own axes, no γ: only a layout it does not have is left out
        return lines
    if not takes_gamma(spec):
        return lines
    return lines + [spec.not_run(zcg) for zcg in _dropped_zcg(sweeps, spec)]


def not_run(sweeps: list[Sweep], kernels: list[KernelSpec]) -> list[str]:
    """One line per kernel and zcg setting a sweep asked for but :func:`grid` leaves out, and
    one per axis of its op a kernel does not have (a parameter it does not take, an option
    it fixes)."""
    return [line for spec in kernels
            for line in _axes_not_run(sweeps, spec)
            + [f"{spec.name}: {how}" for how in spec.fixed_how if _asking(sweeps, spec)]]


def _foreign_checks(sweep: Sweep, has: tuple[str, ...]) -> list[str]:
    """The checks ``sweep`` names, when not one of them is a check the kernel has (``has``:
    ``dz`` asked of an RMSNorm); otherwise none."""
    asked = list(sweep.checks or ())
    return [] if set(asked) & set(has) else asked


def _checks_absent(checks: list[str], op_name: str, has: tuple[str, ...]) -> str:
    """Why ``checks`` ran nothing on a kernel of op ``op_name`` that has the checks ``has``:
    they are other ops' checks (or of a part it does not take).

    >>> _checks_absent(["dA"], "swiglu", ("forward", "da", "db", "batch_invariance"))
    "check dA does not apply to swiglu, whose gradients are da, db (dA is gemm's)"
    """
    every: dict[str, Op | ShapedOp] = {**ROWS, **SHAPED}
    op = every[op_name]
    owners = {c: " or ".join(f"{o.name}'s" for o in every.values()
                             if c in o.checks and o.name != op_name) for c in checks}
    which = (f"check {checks[0]} does" if len(checks) == 1
             else f"checks {', '.join(checks)} do")
    whose = ", ".join(f"{c} is {o}" for c, o in owners.items() if o)
    return (f"{which} not apply to {op.name}, whose gradients are "
            f"{', '.join(c for c in op.gradient_checks if c in has)}"
            + (f" ({whose})" if whose else ""))


def unchecked(sweeps: list[Sweep], kernels: list[KernelSpec],
              ran: Iterable[str]) -> list[tuple[str, str]]:
    """``(kernel, why)`` for every kernel that has no point at all (``ran``: the names of the
    kernels that have one): every point asked of it was dropped — a check of another op, or
    a zcg setting it does not take. Such a kernel was not checked, and a gate must not read
    that as a pass."""
    ran = set(ran)
    out = []
    for spec in kernels:
        if spec.name in ran:
            continue
        asked = _asking(sweeps, spec)
        foreign = [_foreign_checks(s, checks_of(spec)) for s in asked]
        whys = [_checks_absent(f, spec.op, checks_of(spec)) for f in foreign if f]
        # A zcg setting explains only the sweeps whose checks the kernel has.
        rest = [s for s, f in zip(asked, foreign, strict=True) if not f]
        if spec.op not in SHAPED:  # no γ, no zcg in an op of any shape
            whys += [spec.why_not(z) for z in _dropped_zcg(rest, spec)]
        whys += _layouts_lacking(rest, spec)
        why = "; ".join(dict.fromkeys(whys))
        out.append((spec.name, why or "no point of its sweeps applies to it"))
    return out
