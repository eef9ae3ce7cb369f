"""The checks of an op of any shape, written once against its record (:mod:`gradcheck_bi.
ops.shaped`): forward, every gradient, batch invariance — with layouts and mutation.

* ``forward``: every output against the op's fp64 reference, per element, at ``K σ u``
  with ``σ`` derived from the reference (:mod:`gradcheck_bi.errors`) and ``u`` the
  kernel's working precision (bf16/fp16: plus one ulp of the dtype, the output's rounding).
* ``d<role>``: the kernel's analytic gradient against central differences of its **own**
  forward (:mod:`gradcheck_bi.fd.plan`), per element: every element where the colours fit
  the budget, else a sample of colours holding the op's risky elements plus random
  directions over the whole tensor — the result says how many elements were checked each
  way. Tolerance per element ``K √(σ_FD² + (u σ_grad)²) + K_T · truncation``: the FD noise
  from the forward's derived rounding, the kernel's own rounding of the gradient derived
  from the reference's autograd backward, Richardson's truncation. In bf16/fp16 a
  difference of the forward cannot resolve a gradient: there the gradient is held to the
  reference's (fp64, at the same inputs) within its fp32 rounding and one ulp.
* ``batch_invariance``: over the op's batch axis, the first and last rows of every output
  and of the gradients that carry the axis, alone and inside batches of other sizes,
  bitwise; and run to run, everything bitwise.

Every call compares the bits of what the kernel received before and after (a write into
an input or the cotangent is a ``fail``).
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass, replace
from typing import Any

import torch

from gradcheck_bi.errors import Derived, derived, unit
from gradcheck_bi.fd.budget import keep_freed_memory
from gradcheck_bi.fd.plan import (
    DIRECTIONS,
    LEVELS,
    SAMPLED_COLOURS,
    combine,
    index_of,
    noise_weight,
    plan,
    shared_and_colour,
    step,
)
from gradcheck_bi.kernels.call import allowed_mutations
from gradcheck_bi.kernels.shaped_call import ShapedKernel, snapshot, unchanged
from gradcheck_bi.ops import SHAPED
from gradcheck_bi.ops.shaped import Drawn, ShapedOp, Variant
from gradcheck_bi.tolerance.noise import K_SIGMA, K_TRUNC
from gradcheck_bi.vocab import HALF_DTYPES, Config, ContractViolation, Measurement

LOWP_INSIDE = torch.float32  # what a bf16/fp16 kernel computes in, for its tolerance


# -- a point ---------------------------------------------------------------------------
@dataclass
class Point:
    op: ShapedOp
    cfg: Config
    variant: Variant
    drawn: Drawn

    @property
    def dtype(self) -> torch.dtype:
        return self.cfg.torch_dtype

    def canonical(self, tensors: dict[str, Any] | None = None) -> dict[str, Any]:
        return self.op.canonical(tensors or self.drawn.tensors, self.drawn.options)

    def exact(self) -> dict[str, Any]:
        """The point's tensors in fp64, canonical (integer roles as they are)."""
        return {k: (v.detach().to(torch.float64) if v is not None and v.is_floating_point()
                    else v) for k, v in self.canonical().items()}


def seed_of(cfg: Config) -> int:
    """A seed per (seed, variant, layout): every point draws its own data, reproducibly."""
    return cfg.seed * 1_000_003 + zlib.crc32(repr((cfg.variant, cfg.shape)).encode())


def make_point(cfg: Config, op: ShapedOp | None = None) -> Point:
    op = op or SHAPED[cfg.op]
    variant = Variant(cfg.variant) if cfg.variant else op.variants()[0]
    gen = torch.Generator().manual_seed(seed_of(cfg))
    drawn = op.draw(op.sizes(cfg.shape), variant, cfg.torch_dtype, cfg.device, gen)
    layout = cfg.layout
    if layout.endswith("-strided") and not layout.startswith("grad"):
        role = layout[: -len("-strided")]
        t = drawn.tensors.get(role)
        if t is not None:
            drawn = replace(drawn, tensors={**drawn.tensors, role: strided(t)})
    return Point(op, cfg, variant, drawn)


def strided(t: torch.Tensor) -> torch.Tensor:
    """``t``'s values in a view whose last axis has stride 2 (every other element of a
    buffer twice as wide), its other strides those of that buffer."""
    buf = torch.zeros(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype, device=t.device) \
        if t.dim() else torch.zeros(2, dtype=t.dtype, device=t.device)
    view = buf[..., ::2] if t.dim() else buf[0]
    view.copy_(t)
    return view


def cotangent(g: torch.Tensor, shape: torch.Size, layout: str) -> torch.Tensor:
    """The canonical cotangent as the kernel gets it: its output's shape, in ``layout``
    (``grad-strided``, ``grad-transposed``: column-major storage, ``grad-expanded``: one
    value expanded with stride 0 — what ``loss.sum()``'s backward hands on)."""
    g = g.reshape(shape)
    if layout == "grad-strided":
        return strided(g)
    if layout == "grad-transposed" and g.dim() >= 2:
        return g.transpose(-1, -2).contiguous().transpose(-1, -2)
    if layout == "grad-expanded":
        return g.reshape(-1)[:1].reshape([1] * g.dim()).expand(shape) if g.dim() else g
    return g.contiguous()


# -- calling the kernel ----------------------------------------------------------------
def outputs_of(point: Point, raw: tuple[Any, ...]) -> dict[str, torch.Tensor]:
    op = point.op
    if len(raw) < len(op.outputs):
        raise ContractViolation(f"the kernel returned {len(raw)} output(s); {op.name} has "
                                f"{len(op.outputs)} ({', '.join(o.name for o in op.outputs)})")
    out = {}
    for o, t in zip(op.outputs, raw, strict=False):
        if not isinstance(t, torch.Tensor):
            raise ContractViolation(f"output {o.name} is a {type(t).__name__}, not a tensor")
        out[o.name] = t
    return out


def forward(kernel: ShapedKernel, point: Point, tensors: dict[str, Any] | None = None
            ) -> dict[str, torch.Tensor]:
    """The kernel's outputs (fp64, canonical) at ``tensors`` (the point's by default)."""
    tensors = tensors if tensors is not None else point.drawn.tensors
    if allowed_mutations():  # a kernel that writes into what it gets (by design): copies
        tensors = _copies(tensors)
    with torch.no_grad():
        outs = outputs_of(point, kernel(tensors, point.drawn.options))
    return {k: point.op.output_view(k, v).to(torch.float64) for k, v in outs.items()}


def with_grads(kernel: ShapedKernel, point: Point, tensors: dict[str, Any] | None = None,
               cotangents: dict[str, torch.Tensor] | None = None
               ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """The kernel's outputs and its analytic gradients of ``Σ ⟨cotangent, output⟩`` with
    respect to every differentiable role it was given (canonical), watching its writes."""
    op = point.op
    tensors = dict(tensors if tensors is not None else point.drawn.tensors)
    cotangents = cotangents if cotangents is not None else point.drawn.cotangents
    allowed = allowed_mutations()
    if allowed:  # a kernel that writes into what it gets (by design): copies
        tensors = _copies(tensors)
    leaves = {}
    for k, v in tensors.items():
        if v is not None and op.role(k).differentiable:
            leaves[k] = v.detach().requires_grad_(True)
        else:
            leaves[k] = v
    before = snapshot(leaves)
    outs = outputs_of(point, kernel(leaves, point.drawn.options))
    unchanged("forward", before, leaves, allowed)
    gs = {k: cotangent(cotangents[k], outs[k].shape, point.cfg.layout) for k in outs
          if k in cotangents}
    names = [k for k, v in leaves.items() if isinstance(v, torch.Tensor) and v.requires_grad]
    pairs = [(outs[k], gs[k]) for k in gs if outs[k].requires_grad]
    watched = {**before, **snapshot({f"g:{k}": g for k, g in gs.items()})}
    if not pairs:
        raise ContractViolation("no output of the kernel is differentiable (does its "
                                "forward detach, or has it no backward?)")
    grads = torch.autograd.grad([p[0] for p in pairs], [leaves[k] for k in names],
                                [p[1] for p in pairs], allow_unused=True)
    unchanged("backward", watched, {**leaves, **{f"g:{k}": g for k, g in gs.items()}},
              allowed)
    found = {}
    for k, gr in zip(names, grads, strict=True):
        if gr is None:
            raise ContractViolation(f"the backward returned no gradient (None) for {k}")
        if gr.shape != leaves[k].shape:
            raise ContractViolation(f"d{k} has shape {tuple(gr.shape)}; {k} is "
                                    f"{tuple(leaves[k].shape)}")
        found[k] = gr
    canon = op.canonical({**{k: None for k in tensors}, **found}, point.drawn.options)
    grads_c = {k: v.detach().to(torch.float64) for k, v in canon.items() if v is not None}
    outs_c = {k: op.output_view(k, v.detach()).to(torch.float64) for k, v in outs.items()}
    return outs_c, grads_c


def _copies(tensors: dict[str, Any]) -> dict[str, Any]:
    """Each tensor copied with its strides (a kernel declared to write into its inputs must
    not change the point's own: the finite differences read them again)."""
    out: dict[str, Any] = {}
    for k, v in tensors.items():
        if isinstance(v, torch.Tensor):
            c = torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device=v.device)
            c.copy_(v)
            out[k] = c
        else:
            out[k] = v
    return out


# -- the error model at a point ----------------------------------------------------------
def model(point: Point, grads: bool = True) -> Derived:
    """The derived rounding at ``point``: its outputs' and (``grads``) its gradients' —
    a forward check needs no backward (a third of the cost)."""
    wrt = [r.name for r in point.op.roles if grads and r.differentiable
           and point.drawn.tensors.get(r.name) is not None]
    g = {k: v.to(torch.float64) for k, v in point.drawn.cotangents.items()}
    return derived(lambda t: point.op.reference(t, point.drawn.options), point.exact(), g, wrt)


def ulp(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """One ulp of ``dtype`` at ``|t|`` (fp64): ``2^floor(log2|t|) · eps``."""
    fi = torch.finfo(dtype)
    mag = t.abs().clamp(min=fi.tiny)
    return torch.exp2(torch.floor(torch.log2(mag))) * fi.eps


# Working precisions coarser than a dtype, finest first: what a kernel may compute in inside.
COARSER = (("fp32", 2.0**-24), ("tf32", 2.0**-11), ("bf16", 2.0**-8))


def working_unit(point: Point, errs: dict[str, torch.Tensor], sig: dict[str, torch.Tensor]
                 ) -> tuple[float, str | None]:
    """The unit roundoff the kernel delivers: its dtype's, or the finest coarser one whose
    rounding its forward stays within (fp32 inside an fp64 call; TF32 inside an fp32 GEMM),
    with the note that says so; ``--precision exact`` keeps the dtype's."""
    u = unit(point.dtype)
    if point.cfg.dtype in HALF_DTYPES or point.cfg.precision == "exact":
        return u, None

    def within(u_: float) -> bool:
        return all(bool((e <= K_SIGMA * u_ * s + _floor(u_)).all()) for e, s in
                   ((errs[k], sig[k]) for k in errs))

    if within(u):
        return u, None
    for name, coarse in COARSER:
        if coarse > u and within(coarse):
            return coarse, (f"computes in {name} inside: judged at {name} rounding "
                            f"(--precision exact: {point.cfg.dtype})")
    return u, None


def _floor(u: float) -> float:
    return u * 2.0**-60  # nothing a kernel computes is that small but an exact zero


# -- the checks --------------------------------------------------------------------------
def run_shaped_check(kernel: ShapedKernel, cfg: Config) -> Measurement:
    point = make_point(cfg)
    if cfg.check == "forward":
        return check_forward(kernel, point)
    if cfg.check == "batch_invariance":
        return check_batch(kernel, point)
    role = point.op.gradient_checks.get(cfg.check)
    if role is None:
        raise ValueError(f"{cfg.op} has no check {cfg.check}")
    return check_gradient(kernel, point, role)


def _judge(err: torch.Tensor, tol: torch.Tensor) -> tuple[float, float, list[int], bool]:
    """The error and tolerance at the element nearest its tolerance, where it is, and
    whether every element is within."""
    bad = ~torch.isfinite(err)
    ratio = torch.where(tol > 0, err / tol, torch.where(err > 0, math.inf, 0.0))
    ratio = torch.where(bad, math.inf, ratio)
    flat = int(ratio.reshape(-1).argmax()) if ratio.numel() else 0
    worst = [int(i) for i in torch.unravel_index(torch.tensor(flat), err.shape)] \
        if err.dim() else []
    e = float(err.reshape(-1)[flat]) if err.numel() else 0.0
    t = float(tol.reshape(-1)[flat]) if tol.numel() else 0.0
    return e, t, worst, bool((err <= tol).all()) and not bool(bad.any())


def check_forward(kernel: ShapedKernel, point: Point) -> Measurement:
    m = model(point, grads=False)
    before = snapshot(point.drawn.tensors)
    got = forward(kernel, point)
    unchanged("forward", before, point.drawn.tensors, allowed_mutations())
    errs, tols = {}, {}
    for k, ref in m.outputs.items():
        if k not in got:
            continue
        if got[k].shape != ref.shape:
            raise ContractViolation(f"output {k} has shape {tuple(got[k].shape)}; the "
                                    f"reference's is {tuple(ref.shape)}")
        errs[k] = (got[k] - ref).abs()
    u, note = working_unit(point, errs, m.output_sigma)
    for k, ref in m.outputs.items():
        if k in errs:
            tols[k] = _forward_tol(point, ref, m.output_sigma[k], u)
    return _measured(errs, tols, point, note, what="forward")


def _forward_tol(point: Point, ref: torch.Tensor, sig: torch.Tensor, u: float) -> torch.Tensor:
    if point.cfg.dtype in HALF_DTYPES:
        return K_SIGMA * unit(LOWP_INSIDE) * sig + ulp(ref, point.dtype)
    return K_SIGMA * u * sig + _floor(u)


def _measured(errs: dict[str, torch.Tensor], tols: dict[str, torch.Tensor], point: Point,
              note: str | None, what: str, extra: dict[str, Any] | None = None,
              locate: Any = None) -> Measurement:
    judged = {k: _judge(errs[k], tols[k]) for k in errs}
    if locate is not None:
        judged = {k: (e, t, locate(w), ok) for k, (e, t, w, ok) in judged.items()}
    name = max(judged, key=lambda k: (not judged[k][3], judged[k][0] / judged[k][1]
                                      if judged[k][1] > 0 else math.inf))
    e, t, worst, _ = judged[name]
    passed = all(j[3] for j in judged.values())
    details: dict[str, Any] = {"output" if what == "forward" else "tensor": name,
                               "variant": point.variant.label(),
                               "max_abs_err_any": max(float(v.max()) if v.numel() else 0.0
                                                      for v in errs.values())}
    details.update(extra or {})
    if note:
        details["working_precision"] = note
    message = "" if passed else f"{name}{worst}: |err| {e:.3e} > tol {t:.3e}"
    if note:
        message = f"{message}; {note}" if message else note
    return Measurement(e, t, passed, worst, message, details)


def check_gradient(kernel: ShapedKernel, point: Point, role: str) -> Measurement:
    if point.drawn.tensors.get(role) is None:
        raise ValueError(f"{role} is absent at this point")
    m = model(point)
    _, grads = with_grads(kernel, point)
    analytic = grads[role]
    sig_g = m.grad_sigma[role]
    if point.cfg.dtype in HALF_DTYPES:
        ref = m.grads[role]
        err = (analytic - ref).abs()
        tol = K_SIGMA * unit(LOWP_INSIDE) * sig_g + ulp(ref, point.dtype)
        return _measured({role: err}, {role: tol}, point, None, "gradient",
                         {"against": "the fp64 reference's gradient (bf16/fp16: no finite "
                                     "difference of the forward resolves it)"})
    got = forward(kernel, point)
    errs = {k: (got[k] - m.outputs[k]).abs() for k in m.outputs if k in got}
    u, note = working_unit(point, errs, m.output_sigma)
    fd = finite_differences(kernel, point, role, m, u, analytic)
    at = tuple(i.to(analytic.device) for i in fd.index)
    err = (analytic[at] - fd.value).abs()
    tol = (K_SIGMA * torch.sqrt(fd.sigma**2 + (u * sig_g[at]) ** 2) + K_TRUNC * fd.trunc
           + _floor(u))
    extra = {"elements": int(analytic.numel()), "checked_per_element": int(err.numel()),
             "directions": len(fd.directions), "step": fd.h, "colours": fd.colours}

    def locate(k: list[int]) -> list[int]:  # a checked element's place in the tensor
        return [int(i[k[0]]) for i in fd.index] if k else k

    measured = _measured({role: err.cpu()}, {role: tol.cpu()}, point, note, "gradient", extra,
                         locate)
    for i, (de, dt) in enumerate(fd.directions):
        if not de <= dt:
            measured.passed = False
            line = f"direction {i}: |⟨d{role}, t⟩ − FD| {de:.3e} > tol {dt:.3e}"
            measured.message = f"{measured.message}; {line}" if measured.message else line
            if measured.max_abs_err <= measured.tolerance:
                measured.max_abs_err, measured.tolerance, measured.worst = de, dt, None
    return measured


@dataclass
class FD:
    """The finite differences of the elements a check held, flat: their canonical index
    (one tensor per axis), estimate, noise σ and truncation."""

    index: tuple[torch.Tensor, ...]
    value: torch.Tensor
    sigma: torch.Tensor
    trunc: torch.Tensor
    directions: list[tuple[float, float]]
    h: float
    colours: str


def _reduce(t: torch.Tensor, axes: tuple[str, ...], shared: tuple[str, ...]) -> torch.Tensor:
    """Sum ``t`` (canonical ``axes``) over every axis not in ``shared``, the rest in
    ``shared``'s order."""
    drop = [i for i, a in enumerate(axes) if a not in shared]
    kept = [a for a in axes if a in shared]
    if drop:
        t = t.sum(dim=drop)
    return t.permute([kept.index(a) for a in shared]) if shared else t


def finite_differences(kernel: ShapedKernel, point: Point, role: str, m: Derived, u: float,
                       analytic: torch.Tensor) -> FD:
    op, dtype = point.op, point.dtype
    r = op.role(role)
    t = point.canonical()[role]
    if t.device.type == "cpu":  # the forward's temporaries, reused without page faults
        keep_freed_memory(2 * 8 * max(v.numel() for v in point.drawn.tensors.values()
                                      if v is not None))
    outs = [(o.name, o.axes) for o in op.outputs_at(dict(point.variant.values))]
    shared, colour = shared_and_colour(r.axes, [a for _, a in outs], op.coupled)
    perm = [r.axes.index(a) for a in (*shared, *colour)]
    tp = t.permute(perm)
    s_sizes = tuple(tp.shape[: len(shared)])
    c_sizes = tuple(tp.shape[len(shared):])
    h = step(t, dtype)
    gen = torch.Generator().manual_seed(seed_of(point.cfg) + 1)
    risky = op.risky(point.drawn, role) if op.risky is not None else []
    if not s_sizes and risky and risky[0].numel() > 1:
        # a scalar output: each risky element of each row is a colour of its own; half the
        # sample spread over every kind and random rows, the other half random elements
        width = math.prod(c_sizes[1:])
        rows = torch.randperm(risky[0].numel(), generator=gen).tolist()
        per_kind = max(1, SAMPLED_COLOURS // (2 * len(risky)))
        risky = [torch.tensor(row * width + int(r.reshape(-1)[row]))
                 for row in rows[:per_kind] for r in risky]
    colours = plan(s_sizes, c_sizes, risky, gen)
    g = {k: v.to(torch.float64) for k, v in point.drawn.cotangents.items()}
    noise = sum(_reduce(g[k] ** 2 * m.output_sigma[k] ** 2, axes, shared) for k, axes in outs)
    where: list[tuple[torch.Tensor, ...]] = []
    values, sigmas, truncs = [], [], []
    for pick in colours.picks:
        idx = index_of(pick, s_sizes, c_sizes)
        dev_idx = tuple(i.to(tp.device) for i in idx)
        orig = tp[dev_idx].clone()
        sums, disp = [], []
        for o in LEVELS:
            ys, ds = [], []
            for sign in (1, -1):
                tp[dev_idx] = (orig.double() + sign * o * h).to(dtype)
                ds.append(tp[dev_idx].double() - orig.double())
                ys.append(forward(kernel, point))
                tp[dev_idx] = orig
            sums.append(sum(_reduce(g[k] * (ys[0][k] - ys[1][k]), axes, shared)
                            for k, axes in outs))
            disp.append(ds[0] - ds[1])  # on the tensor's device, as the sums
        est, tr = combine([s / d for s, d in zip(sums, disp, strict=True)])
        where.append(tuple(i.reshape(-1) for i in idx))
        values.append(torch.as_tensor(est).reshape(-1))
        sigmas.append((u * torch.sqrt(noise * noise_weight(disp))).reshape(-1))
        truncs.append(torch.as_tensor(tr).reshape(-1))
    # back from (shared…, colour…) to the role's own axes
    index = tuple(torch.cat([w[perm.index(j)] for w in where]) for j in range(len(perm)))
    fd = FD(index, torch.cat(values), torch.cat(sigmas), torch.cat(truncs), [], h,
            f"{len(colours.picks)} of {colours.total}")
    if not colours.full:
        fd.directions = directions(kernel, point, role, m, u, analytic, h)
    return fd


def directions(kernel: ShapedKernel, point: Point, role: str, m: Derived, u: float,
               analytic: torch.Tensor, h: float) -> list[tuple[float, float]]:
    """``⟨d<role>, t⟩`` against central differences along random ``t`` over the whole
    tensor: ``(error, tolerance)`` per direction."""
    t = point.canonical()[role]
    gen = torch.Generator(device=t.device).manual_seed(seed_of(point.cfg) + 2)
    g = {k: v.to(torch.float64) for k, v in point.drawn.cotangents.items()}
    noise = sum(float((g[k] ** 2 * m.output_sigma[k] ** 2).sum()) for k in g)
    sig_g = m.grad_sigma[role]
    out = []
    orig = t.clone()
    for _ in range(DIRECTIONS):
        d = torch.randn(t.shape, generator=gen, dtype=torch.float64, device=t.device)
        fds, ans, disp = [], [], []
        for o in LEVELS:
            ys, steps = [], []
            for sign in (1, -1):
                t.copy_((orig.double() + sign * o * h * d).to(point.dtype))
                steps.append(t.double() - orig.double())
                ys.append(forward(kernel, point))
                t.copy_(orig)
            moved = steps[0] - steps[1]  # on the tensor's device, as the gradient
            fds.append(sum(float((g[k] * (ys[0][k] - ys[1][k])).sum()) for k in g))
            ans.append(float((analytic * moved).sum()))
            disp.append(2 * o * h)
        e_fd, tr = combine([torch.tensor(f / s, dtype=torch.float64)
                            for f, s in zip(fds, disp, strict=True)])
        e_an, _ = combine([torch.tensor(a / s, dtype=torch.float64)
                           for a, s in zip(ans, disp, strict=True)])
        w = noise_weight([torch.tensor(disp[0], dtype=torch.float64),
                          torch.tensor(disp[1], dtype=torch.float64)])
        sigma_fd = u * math.sqrt(noise * float(w))
        sigma_k = u * float(torch.sqrt(((d * sig_g) ** 2).sum()))
        tol = K_SIGMA * math.hypot(sigma_fd, sigma_k) + K_TRUNC * float(tr)
        out.append((abs(float(e_fd) - float(e_an)), tol))
    return out


# -- a layout point by its contiguous twin -----------------------------------------------
def same_as_contiguous(kernel: ShapedKernel, cfg: Config) -> str | None:
    """``None`` when the kernel gives at ``cfg``'s layout the bits it gives on contiguous
    tensors of the same values — every output and every gradient, one forward and backward
    each — else what differs. Where nothing differs, the point's finite differences would
    repeat its twin's (a cotangent's layout never reaches the forward; an input's reaches
    a forward that gave the twin's bits), so the twin's measurement is the point's
    (:mod:`gradcheck_bi.checks.twins`)."""
    point = make_point(cfg)
    twin = make_point(replace(cfg, layout="contiguous"))
    laid, flat = with_grads(kernel, point), with_grads(kernel, twin)
    for part, (mine, theirs) in enumerate(zip(laid, flat, strict=True)):
        for k in sorted(set(mine) | set(theirs)):
            if k not in mine or k not in theirs or not _bits(mine[k], theirs[k]):
                return f"{'' if part == 0 else 'd'}{k} differs from the contiguous call's"
    return None


# -- batch invariance --------------------------------------------------------------------
def _rows(t: torch.Tensor, axes: tuple[str, ...], axis: str, rows: torch.Tensor
          ) -> torch.Tensor:
    return t.index_select(axes.index(axis), rows.to(t.device))


def check_batch(kernel: ShapedKernel, point: Point) -> Measurement:
    op, options = point.op, point.drawn.options
    axis = op.batch_axis(dict(point.variant.values))
    if axis is None:
        raise ValueError(f"{op.name} has no batch axis at {point.variant.label()}")
    canon = point.canonical()
    n = point.drawn.sizes[axis]
    other = make_point(replace(point.cfg, seed=point.cfg.seed + 7919))
    other_c = other.canonical()
    # the other point's rows that pad a batch: 3 of them, cycling where it has fewer
    padding = torch.arange(3) % n

    def sub(rows: torch.Tensor, extra: int = 0) -> tuple[dict[str, Any], dict[str, Any]]:
        tensors: dict[str, Any] = {}
        for r in op.roles:
            v = canon.get(r.name)
            if v is None or axis not in r.axes:
                tensors[r.name] = point.drawn.tensors.get(r.name)
                continue
            part = _rows(v, r.axes, axis, rows)
            if extra:
                more = _rows(other_c[r.name], r.axes, axis, padding[:extra])
                part = torch.cat([part, more], dim=r.axes.index(axis))
            like = point.drawn.tensors[r.name]
            assert like is not None
            tensors[r.name] = op.restore(r.name, part, like, options)
        gs = {}
        for o in op.outputs_at(dict(point.variant.values)):
            gv = point.drawn.cotangents[o.name]
            if axis in o.axes:
                gv = _rows(gv, o.axes, axis, rows)
                if extra:
                    more = _rows(other.drawn.cotangents[o.name], o.axes, axis,
                                 padding[:extra])
                    gv = torch.cat([gv, more], dim=o.axes.index(axis))
            gs[o.name] = gv
        return tensors, gs

    carried = [r.name for r in op.roles if r.differentiable and axis in r.axes
               and point.drawn.tensors.get(r.name) is not None]
    out_axes = {o.name: o.axes for o in op.outputs_at(dict(point.variant.values))}
    role_axes = {r.name: r.axes for r in op.roles}
    differ: list[str] = []
    everything = torch.arange(n)
    base = with_grads(kernel, point, *sub(everything))
    again = with_grads(kernel, point, *sub(everything))
    for part in (0, 1):
        for k, v in base[part].items():
            if not _bits(v, again[part][k]):
                differ.append(f"{'' if part == 0 else 'd'}{k} differs run to run")
    for row in sorted({0, n - 1}):
        alone = with_grads(kernel, point, *sub(torch.tensor([row])))
        bigger = with_grads(kernel, point, *sub(everything, extra=3))
        for label, got, at in (("alone", alone, 0), (f"in {n + 3} rows", bigger, row)):
            for k, v in base[0].items():
                if axis not in out_axes[k]:
                    continue
                mine = _rows(v, out_axes[k], axis, torch.tensor([row]))
                theirs = _rows(got[0][k], out_axes[k], axis, torch.tensor([at]))
                if not _bits(mine, theirs):
                    differ.append(f"{k} row {row} differs {label} vs in {n} rows"
                                  f"{_tail(mine, theirs)}")
            for k in carried:
                mine = _rows(base[1][k], role_axes[k], axis, torch.tensor([row]))
                theirs = _rows(got[1][k], role_axes[k], axis, torch.tensor([at]))
                if not _bits(mine, theirs):
                    differ.append(f"d{k} row {row} differs {label} vs in {n} rows"
                                  f"{_tail(mine, theirs)}")
    passed = not differ
    return Measurement(0.0 if passed else 1.0, 0.0, passed, None,
                       "" if passed else "; ".join(dict.fromkeys(differ)),
                       {"axis": axis, "variant": point.variant.label(),
                        "compared": "bitwise"})


def _bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and bool(torch.equal(a, b) or (a.isnan() & b.isnan()).sum()
                                       == (a != b).sum())


def _tail(a: torch.Tensor, b: torch.Tensor) -> str:
    """`` (only in the last 12 of 64 elements: a vectorised loop's tail?)`` where every
    differing element sits at the end of the row."""
    diff = (a != b).reshape(-1).nonzero()
    if diff.numel() == 0 or a.numel() < 8:
        return ""
    first = int(diff.min())
    if first >= a.numel() // 2:
        return (f" (only in the last {a.numel() - first} of {a.numel()} elements: a "
                "vectorised loop's tail?)")
    return ""
