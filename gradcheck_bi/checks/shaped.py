"""The checks of an op of any shape, written once against its record (:mod:`gradcheck_bi.
ops.shaped`): forward, every gradient, batch invariance — with layouts and mutation.

* ``forward``: every output against the op's fp64 reference, per element, at ``K σ u``
  with ``σ`` derived from the reference (:mod:`gradcheck_bi.errors`) and ``u`` the
  kernel's working precision (bf16/fp16: plus one ulp of the dtype, the output's rounding).
* ``d<role>``: the kernel's analytic gradient against central differences of its **own**
  forward (:mod:`gradcheck_bi.fd.plan`), per element: every element where the colours fit
  the budget, else a sample of colours holding the op's risky elements plus random
  directions over the whole tensor — the result says how many elements were checked each
  way (``--mode directional``: the random directions alone). Tolerance per element
  ``K √(σ_FD² + (u σ_grad)²) + K_T · truncation``: the FD noise from the forward's
  derived rounding, the kernel's own rounding of the gradient derived from the reference's
  autograd backward, Richardson's truncation (its two extra calls only for the colours and
  directions whose judgement it can change). A failing element within ±4h of a kink (its
  estimates at h and 2h disagree, or its truncation does not fall as h⁴) is estimated
  again at h/16 and judged there, or left unjudged and counted (:func:`_kinks`). In bf16/fp16 a
  difference of the forward cannot resolve a gradient: there the gradient is held to the
  reference's (fp64, at the same inputs) within its fp32 rounding and one ulp.
* ``batch_invariance``: bitwise, :mod:`gradcheck_bi.checks.shaped_batch`.

A point and the calls of its kernel (what it wrote into watched):
:mod:`gradcheck_bi.checks.shaped_point`; the random directions:
:mod:`gradcheck_bi.checks.shaped_directions`.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import torch

from gradcheck_bi.checks.shaped_batch import check_batch
from gradcheck_bi.checks.shaped_directions import directions
from gradcheck_bi.checks.shaped_point import (
    Point,
    draw_key,
    forward,
    make_point,
    seed_of,
    with_grads,
)
from gradcheck_bi.checks.shaped_precision import floor, working_unit
from gradcheck_bi.errors import Derived, derived, unit
from gradcheck_bi.fd.budget import keep_freed_memory
from gradcheck_bi.fd.plan import (
    LEVELS,
    combine,
    index_of,
    noise_weight,
    plan,
    shared_and_colour,
    step,
)
from gradcheck_bi.fd.refine import REFINE
from gradcheck_bi.fd.threads import cpu_threads, run_steps
from gradcheck_bi.kernels.calling.shaped_call import ShapedKernel, snapshot, unchanged
from gradcheck_bi.kernels.calling.writes import allowed_mutations
from gradcheck_bi.tolerance.noise import K_SIGMA, K_TRUNC
from gradcheck_bi.vocab import HALF_DTYPES, Config, ContractViolation, Measurement, Unsupported

LOWP_INSIDE = torch.float32  # what a bf16/fp16 kernel computes in, for its tolerance


# -- the error model at a point ----------------------------------------------------------
# The last model derived, with its draw's key: the checks of one draw run one after
# another, gradient checks first (runner.execution_order), and the forward check takes the
# outputs' part of theirs. One entry: one model's memory more, never more.
_kept_model: list[tuple[Any, Derived, bool]] = []


def model(point: Point, grads: bool = True) -> Derived:
    """The derived rounding at ``point``: its outputs' and (``grads``) its gradients' —
    a forward check needs no backward (a third of the cost) — with what leaving the range
    of the precision the kernel computes in loses (:func:`reach`). The model kept from the
    point before when it was derived at the same draw (the same values, however laid out)
    with what this one needs."""
    key = (draw_key(point.cfg, point.op), point.cfg.input_scale, reach(point))
    if _kept_model and _kept_model[0][0] == key and (_kept_model[0][2] or not grads):
        return _kept_model[0][1]
    wrt = [r.name for r in point.op.roles if grads and r.differentiable
           and point.drawn.tensors.get(r.name) is not None]
    g = {k: v.to(torch.float64) for k, v in point.drawn.cotangents.items()}
    _kept_model.clear()  # its memory free before the next one is derived
    m = derived(lambda t: point.op.reference(t, point.drawn.options), point.exact(), g, wrt,
                reach(point))
    _kept_model.append((key, m, grads))
    return m


def reach(point: Point) -> torch.dtype | None:
    """The precision whose range a correct kernel's intermediates live in: fp32 inside a
    bf16/fp16 call, an fp32 call's own (bf16 and TF32 inside one on a GPU share its
    exponent range); none for fp64: the reference computes in fp64, so a value beyond its
    range is lost there too and nothing is known of it (the channel would be zero)."""
    if point.cfg.dtype in HALF_DTYPES:
        return LOWP_INSIDE
    return point.dtype if point.dtype != torch.float64 else None


def ulp(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """One ulp of ``dtype`` at ``|t|`` (fp64): ``2^floor(log2|t|) · eps``."""
    fi = torch.finfo(dtype)
    mag = t.abs().clamp(min=fi.tiny)
    return torch.exp2(torch.floor(torch.log2(mag))) * fi.eps


# -- the checks --------------------------------------------------------------------------
def run_shaped_check(kernel: ShapedKernel, cfg: Config) -> Measurement:
    point = make_point(cfg)
    if cfg.device == "cpu":  # whole-tensor temporaries (the model's, the kernel's) reused
        keep_freed_memory(2 * 8 * max(v.numel() for v in point.drawn.tensors.values()
                                      if v is not None))
    if cfg.check == "forward":
        return check_forward(kernel, point)
    if cfg.check == "batch_invariance":
        return check_batch(kernel, point)
    role = point.op.gradient_checks.get(cfg.check)
    if role is None:
        raise ValueError(f"{cfg.op} has no check {cfg.check}")
    return check_gradient(kernel, point, role)


def _ratio(err: torch.Tensor, tol: torch.Tensor) -> torch.Tensor:
    """``err / tol`` per element; ∞ where ``err`` is not finite or exceeds a zero ``tol``."""
    ratio = torch.where(tol > 0, err / tol, torch.where(err > 0, math.inf, 0.0))
    return torch.where(~torch.isfinite(err), math.inf, ratio)


def _judge(err: torch.Tensor, tol: torch.Tensor) -> tuple[float, float, list[int], bool]:
    """The error and tolerance at the element nearest its tolerance, where it is, and
    whether every element is within."""
    bad = ~torch.isfinite(err)
    ratio = _ratio(err, tol)
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
    diffs, errs, tols = {}, {}, {}
    for k, ref in m.outputs.items():
        if k not in got:
            continue
        if got[k].shape != ref.shape:
            raise ContractViolation(f"output {k} has shape {tuple(got[k].shape)}; the "
                                    f"reference's is {tuple(ref.shape)}")
        diffs[k] = got[k] - ref
        errs[k] = diffs[k].abs()
    u, note = working_unit(point, diffs, m)
    for k, ref in m.outputs.items():
        if k in errs:
            tols[k] = _forward_tol(point, ref, m.output_sigma[k], u) + m.output_absolute[k]
    return _measured(errs, tols, point, note, what="forward")


def _forward_tol(point: Point, ref: torch.Tensor, sig: torch.Tensor, u: float) -> torch.Tensor:
    if point.cfg.dtype in HALF_DTYPES:
        return K_SIGMA * unit(LOWP_INSIDE) * sig + ulp(ref, point.dtype)
    return K_SIGMA * u * sig + floor(u)


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
        tol = K_SIGMA * unit(LOWP_INSIDE) * sig_g + ulp(ref, point.dtype) \
            + m.grad_absolute[role]
        return _measured({role: err}, {role: tol}, point, None, "gradient",
                         {"against": "the fp64 reference's gradient (bf16/fp16: no finite "
                                     "difference of the forward resolves it)"})
    got = forward(kernel, point)
    u, note = working_unit(point, {k: got[k] - m.outputs[k] for k in m.outputs if k in got},
                           m)
    # the kernel's calls on CPU: torch's threads by the tensor's size, one thread while one
    # proves faster (fd.threads: the FD's verdict is the same, the kernel's own reductions
    # may round differently on another thread count, inside the noise the tolerance holds)
    with cpu_threads(analytic.device, analytic.numel()):
        if point.cfg.mode == "directional":
            return _directional(kernel, point, role, m, u, analytic, note)
        fd = finite_differences(kernel, point, role, m, u, analytic)
        at = tuple(i.to(analytic.device) for i in fd.index)
        # flat, colour by colour, as the estimate (a 0-d role's one element included)
        held = analytic[at].reshape(-1)
        sig_k, abs_k = (u * sig_g[at]).reshape(-1), m.grad_absolute[role][at].reshape(-1)

        def tolerance_of(f: FD) -> torch.Tensor:
            return tolerance(f.sigma, sig_k, f.trunc, u) + f.absolute + abs_k

        err, tol = (held - fd.value).abs(), tolerance_of(fd)
        extra = {"elements": int(analytic.numel()), "checked_per_element": int(err.numel()),
                 "directions": len(fd.directions), "step": fd.h, "colours": fd.colours}
        err, kinks = _kinks(fd, held, err, tol, tolerance_of, extra)

    def locate(k: list[int]) -> list[int]:  # a checked element's place in the tensor
        return [int(i[k[0]]) for i in fd.index] if k else k

    measured = _measured({role: err.cpu()}, {role: tol.cpu()}, point, note, "gradient", extra,
                         locate)
    if kinks:
        measured.message = f"{measured.message}; {kinks}" if measured.message else kinks
    for i, (de, dt) in enumerate(fd.directions):
        if not de <= dt:
            measured.passed = False
            line = f"direction {i}: |⟨d{role}, t⟩ − FD| {de:.3e} > tol {dt:.3e}"
            measured.message = f"{measured.message}; {line}" if measured.message else line
            if measured.max_abs_err <= measured.tolerance:
                measured.max_abs_err, measured.tolerance, measured.worst = de, dt, None
    return measured


def _kinks(fd: FD, analytic: torch.Tensor, err: torch.Tensor, tol: torch.Tensor,
           tolerance_of: Any, extra: dict[str, Any]) -> tuple[torch.Tensor, str]:
    """The failing elements whose steps h and 2h disagree estimated again at ``h / REFINE``
    (as the row engine's :func:`~gradcheck_bi.checks.fd_judge.kink_verdict`): where the two
    estimates agree within their noise and truncation the function is smooth there and the
    failure stands; where
    they disagree the element is not differentiable within ±4h (a kink: relu at 0, a sort's
    swap) and is judged at the finer step, and left unjudged where it fails there too.
    Returns the errors so judged (``err`` where nothing failed) and the words to add; the
    counts go into ``extra``."""
    failing = err > tol
    if fd.refine is None or not bool(failing.any()):
        return err, ""
    # the lazy pass leaves out a colour that no verdict needs, a failing one too where a
    # worse one decided: each failing element judged with its own truncation first
    fd.truncate(failing)
    tol.copy_(tolerance_of(fd))
    failing = err > tol
    if not bool(failing.any()):
        return err, ""
    # Every failing element is estimated again where one's estimates at h and 2h disagree
    # beyond noise and by 1/64 of its error (15 T = their gap: a smooth function's is
    # h⁴-small against any error that fails; a kink's moves them by d/h), or where the
    # failing ones fill at most half the colours (a kink ≪ h from the point, a sort's
    # swap, bends neither level). A smooth defect failing in most colours fails at no
    # further cost.
    bend = 15 * fd.trunc
    bent = bool((failing & (64 * bend >= err) & (bend > K_SIGMA * fd.sigma)).any())
    colours = failing.reshape(-1, fd.per).any(1)
    if not bent and 2 * int(colours.sum()) > colours.numel():
        return err, ""
    fine = fd.refine(failing)
    allowed = K_SIGMA * torch.hypot(fd.sigma, fine.sigma) + K_TRUNC * (fd.trunc + fine.trunc)
    # not smooth: the two estimates disagree, or the truncation did not shrink with the
    # step as h⁴ (65536× at h/16; by 256× at least here: a sort's swap 1e-4 h from the
    # point fell 33×)
    kink = failing & (((fd.value - fine.value).abs() > allowed)
                      | ((REFINE**2 * fine.trunc > fd.trunc)
                         & (fine.trunc > K_SIGMA * fine.sigma)))
    n_kink = int(kink.sum())
    if not n_kink:
        return err, ""
    err = torch.where(kink, (analytic - fine.value).abs(), err)
    tol.copy_(torch.where(kink, tolerance_of(fine), tol))
    unjudged = kink & (err > tol)
    n_left = int(unjudged.sum())
    if n_left == err.numel():
        raise Unsupported(f"every element not differentiable within ±4h/{REFINE} (h = "
                          f"{fd.h:.3g}): the FD at h and h/{REFINE} disagree; nothing to judge")
    extra.update({"not_differentiable": n_kink, "not_differentiable_unjudged": n_left,
                  "finer_step_ratio": REFINE})
    words = (f"{n_kink} of {err.numel()} elements not differentiable within ±4h (h = "
             f"{fd.h:.3g}): the FD at h and at h/{REFINE} disagree beyond their noise and "
             f"truncation; judged at h/{REFINE}"
             + (f"; {n_left} of them not differentiable within ±4h/{REFINE} either, not "
                "judged" if n_left else ""))
    return torch.where(unjudged, torch.zeros_like(err), err), words


def _directional(kernel: ShapedKernel, point: Point, role: str, m: Derived, u: float,
                 analytic: torch.Tensor, note: str | None) -> Measurement:
    """``--mode directional``: ``⟨d<role>, t⟩`` along ``cfg.directions`` random ``t`` over
    the whole tensor (:func:`directions`), no element checked by itself."""
    h = step(point.canonical()[role], point.dtype, point.op.bend(role, point.drawn.options))
    dirs = directions(kernel, point, role, m, u, analytic, h, point.cfg.directions)
    i = max(range(len(dirs)), key=lambda k: dirs[k][0] / dirs[k][1] if dirs[k][1] > 0
            else math.inf)
    e, tol = dirs[i]
    passed = all(de <= dt for de, dt in dirs)
    details: dict[str, Any] = {
        "tensor": role, "variant": point.variant.label(), "mode": "directional",
        "directions": len(dirs), "projections_checked": len(dirs), "step": h,
        "coverage": f"d{role} projected on {len(dirs)} random direction(s) over the whole "
                    f"tensor; individual d{role} elements were not checked"}
    message = "" if passed else f"direction {i}: |⟨d{role}, t⟩ − FD| {e:.3e} > tol {tol:.3e}"
    if note:
        details["working_precision"] = note
        message = f"{message}; {note}" if message else note
    return Measurement(e, tol, passed, None, message, details)


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
    absolute: torch.Tensor | float = 0.0  # the estimate's bound from the forward's α
    refine: Any = None  # (mask of the flat elements) → this FD again at h / REFINE there
    per: int = 1  # elements per colour (the flat elements are colour by colour)
    truncate: Any = None  # (mask) → the truncation of its colours computed where it is not


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
    outs = [(o.name, o.axes) for o in op.outputs_at(dict(point.variant.values))]
    shared, colour = shared_and_colour(r.axes, [a for _, a in outs], op.coupled)
    perm = [r.axes.index(a) for a in (*shared, *colour)]
    tp = t.permute(perm)
    s_sizes = tuple(tp.shape[: len(shared)])
    c_sizes = tuple(tp.shape[len(shared):])
    h = step(t, dtype, op.bend(role, point.drawn.options))
    gen = torch.Generator().manual_seed(seed_of(point.cfg) + 1)
    risky = op.risky(point.drawn, role) if op.risky is not None else []
    if not s_sizes and risky and risky[0].numel() > 1:
        # a scalar output: each risky element of each row is a colour of its own; every
        # kind at one random row (then random elements: fd.plan)
        width = math.prod(c_sizes[1:])
        row = int(torch.randint(0, risky[0].numel(), (), generator=gen))
        risky = [torch.tensor(row * width + int(r.reshape(-1)[row])) for r in risky]
    colours = plan(s_sizes, c_sizes, risky, gen)
    g = {k: v.to(torch.float64) for k, v in point.drawn.cotangents.items()}
    noise = sum(_reduce(g[k] ** 2 * m.output_sigma[k] ** 2, axes, shared) for k, axes in outs)
    # every (level, sign) displacement of a colour at once: (2·levels, 1, …)
    shifts = torch.tensor([sign * o * h for o in LEVELS for sign in (1, -1)],
                          dtype=torch.float64, device=tp.device)
    # every colour's index, sent to the device in one copy: a copy from the host's pageable
    # memory waits for the GPU's queue, so one per colour kept the host from running ahead
    # of the kernel calls (the GPU idled while the host prepared each colour)
    idxs = [index_of(pick, s_sizes, c_sizes) for pick in colours.picks]
    dev_idxs: list[tuple[Any, ...]] = []
    if not s_sizes:  # a colour of one element: its place as ints, each write a view's copy
        # (a 0-dim index on the device is read back by the host at every write: a sync)
        dev_idxs = [tuple(int(i) for i in idx) for idx in idxs]
    for n in range(0, len(idxs) if s_sizes else 0, SEND_BLOCK):  # each axis stacked
        sent = [torch.stack(axis).to(tp.device)
                for axis in zip(*idxs[n:n + SEND_BLOCK], strict=True)]
        dev_idxs += [tuple(axis[j] for axis in sent) for j in range(len(sent[0]))]

    def levels(c: int, which: slice, by: torch.Tensor = shifts
               ) -> tuple[list[torch.Tensor], torch.Tensor]:
        """Colour ``c``'s estimate at the levels ``which`` (a slice of the (level, sign)
        rows of the displacements ``by``) and the displacements taken. The values the kernel
        gets (rounded to its dtype) and their steps are made once per colour: a call costs
        one write and the kernel (≈ 180 µs of the H200's 430 µs GEMM call went to per-call
        temporaries)."""
        at = dev_idxs[c]
        orig = tp[at].clone()
        exact = orig.double()
        moved = (exact + by[which].reshape(-1, *[1] * exact.dim())).to(dtype)
        taken = moved.double() - exact
        disp = taken[0::2] - taken[1::2]  # per level, on the tensor's device
        try:
            sums = _level_sums(kernel, point, tp, at, moved, g, outs, shared)
        finally:
            tp[at] = orig
        return [(s_ / d).reshape(-1) for s_, d in zip(sums, disp, strict=True)], disp

    # Levels h and 2h of every colour: the estimate E4(h) and its noise. Level 4h only
    # gives the truncation, a term the tolerance adds: a colour whose elements all sit
    # below it without one cannot fail with one, nor be the element reported as nearest
    # its tolerance while another colour holds a ratio that high (lazy_truncation).
    # E(h), E(2h) and their displacements, colour by colour, each a row of the shared axes.
    # On CPU written into one buffer: a small tensor kept per colour lands in the hole its
    # call's temporaries left, and glibc's heap then grew by every colour (1.5 GiB at a
    # (64, 1024) softmax, 24 GiB at (64, 4096), given back by malloc_trim). On CUDA kept
    # and joined once: its allocator pools small blocks apart, and a copy per colour would
    # be four more launches a colour.
    firsts = (torch.empty(4, len(idxs), math.prod(s_sizes), dtype=torch.float64)
              if buffered(tp.device) else None)
    kept: list[list[torch.Tensor]] = []

    def first_levels(c: int) -> None:
        got, disp = levels(c, slice(0, 4))
        row = [got[0], got[1], disp[0].reshape(-1), disp[1].reshape(-1)]
        if firsts is None:
            kept.append(row)
        else:
            for j, v in enumerate(row):
                firsts[j, c] = v

    run_steps([functools.partial(first_levels, c) for c in range(len(idxs))], tp.device)
    e1, e2, d1, d2 = ((f.reshape(-1) for f in firsts) if firsts is not None
                      else (torch.cat([r[j] for r in kept]) for j in range(4)))
    est = (4 * e1 - e2) / 3  # combine's E4(h), elementwise
    noises = torch.as_tensor(noise).reshape(-1).repeat(len(idxs))  # the same for every colour

    def noise_of(value: torch.Tensor, d: list[torch.Tensor], part: slice = slice(None)
                 ) -> torch.Tensor:
        """σ of the estimate ``value`` made with the displacements ``d`` (E(h)'s, E(2h)'s)
        at the flat elements ``part``: the forward's rounding through the differences, and
        the estimate's own fp64 arithmetic (g·Δy, ÷ the step, Richardson's combination) —
        all the noise an exact op has (relu, a gather: σ of its outputs is 0)."""
        return torch.hypot(u * torch.sqrt(noises[part] * noise_weight(d)),
                           FD_ARITH * value.abs())

    sigma = noise_of(est, [d1, d2])
    # the forward's α: each of y₊, y₋ off by up to α, so level o's estimate by 2 Σ|g|α / dₒ
    # and E4(h) = (4 E(h) − E(2h)) / 3 by (8/d₁ + 2/d₂)/3 · Σ|g|α
    lost = sum(_reduce(g[k].abs() * m.output_absolute[k], axes, shared) for k, axes in outs)
    lost = torch.as_tensor(lost).reshape(-1).repeat(len(idxs))
    absolute = lost * (8 / d1.abs() + 2 / d2.abs()) / 3 if bool((lost > 0).any()) else 0.0
    # back from (shared…, colour…) to the role's own axes
    index = tuple(torch.cat([idx[perm.index(j)].reshape(-1) for idx in idxs])
                  for j in range(len(perm)))
    at = tuple(i.to(analytic.device) for i in index)
    err = (analytic[at].reshape(-1) - est).abs()
    sig_k = (u * m.grad_sigma[role][at]).reshape(-1)
    abs_k = absolute + m.grad_absolute[role][at].reshape(-1)
    per = err.numel() // max(1, len(idxs))  # elements per colour

    truncated: set[int] = set()

    def colours_of(mask: torch.Tensor) -> list[int]:
        """The colours that hold a ``mask``ed element (flat, colour by colour)."""
        return mask.reshape(-1, per).any(1).nonzero().reshape(-1).tolist()

    def truncation(c: int) -> torch.Tensor:
        truncated.add(c)
        e4 = levels(c, slice(4, 6))[0][0]
        part = slice(c * per, (c + 1) * per)
        return combine([e1[part], e2[part], e4])[1]

    tr = lazy_truncation(err, lambda part, tr_: tolerance(sigma[part], sig_k[part], tr_, u)
                         + abs_k[part], per, truncation)

    def truncate(mask: torch.Tensor) -> None:
        """The truncation of every colour holding a ``mask``ed element, where the lazy
        pass left it out (it bounded no verdict; a kink's test reads it)."""
        for c in [c for c in colours_of(mask) if c not in truncated]:
            tr[c * per:(c + 1) * per] = truncation(c)

    def refine(mask: torch.Tensor) -> FD:
        """The estimate again at ``h / REFINE`` for every colour that holds a ``mask``ed
        element (every level: its own truncation), the others' as they were."""
        value, sig, trunc = est.clone(), sigma * REFINE, tr.clone()
        for c in colours_of(mask):
            got, disp = levels(c, slice(0, 6), shifts / REFINE)
            part = slice(c * per, (c + 1) * per)
            value[part], trunc[part] = combine(got)
            sig[part] = noise_of(value[part], [disp[0].reshape(-1), disp[1].reshape(-1)], part)
        return FD(index, value, sig, trunc, [], h / REFINE, "", absolute * REFINE, None, per)

    fd = FD(index, est, sigma, tr, [], h, f"{len(colours.picks)} of {colours.total}",
            absolute, refine, per, truncate)
    if not colours.full:
        fd.directions = directions(kernel, point, role, m, u, analytic, h)
    return fd


def buffered(device: torch.device) -> bool:
    """Whether a check's per-colour estimates go into one buffer as they come (CPU: glibc's
    heap) or are kept and joined once (CUDA's allocator pools small blocks apart)."""
    return device.type == "cpu"


def tolerance(sigma: torch.Tensor, sigma_kernel: torch.Tensor, trunc: torch.Tensor, u: float
              ) -> torch.Tensor:
    """Per element ``K √(σ_FD² + (u σ_grad)²) + K_T · truncation`` (``sigma_kernel``:
    ``u σ_grad``), above the floor."""
    return (K_SIGMA * torch.sqrt(sigma**2 + sigma_kernel**2) + K_TRUNC * trunc
            + floor(u))


def lazy_truncation(err: torch.Tensor, tol: Any, per: int, truncation: Any) -> torch.Tensor:
    """The truncation of each colour's ``per`` elements (flat, colour by colour), computed
    (``truncation(c)``: two more calls) only where the judgement needs it, 0 elsewhere.

    A truncation only raises a tolerance: an element's ratio ``err / tol`` without it
    bounds the ratio with it. Colours are taken by that bound, highest first, each
    truncation computed until the highest ratio found exceeds the next colour's bound:
    every colour left then stays below the worst element, so the verdict, the worst element
    and its tolerance are what every truncation computed would give. A failing colour below
    a worse one may be left without its own (:func:`_kinks` computes it before judging
    that colour's elements again)."""
    n = err.numel() // max(1, per)
    tr = torch.zeros_like(err)
    if n == 0:
        return tr
    bound = _ratio(err, tol(slice(None), tr)).reshape(n, per).amax(1).cpu()
    worst = -math.inf
    for c in bound.argsort(descending=True, stable=True).tolist():
        if bound[c] < worst:
            break
        part = slice(c * per, (c + 1) * per)
        tr[part] = truncation(c)
        worst = max(worst, float(_ratio(err[part], tol(part, tr[part])).max()))
    return tr


# σ of E4(h)'s fp64 arithmetic per |E|: each level's g·Δy and ÷ d rounded (u/√3 each),
# combined as (4 E(h) − E(2h)) / 3 and rounded twice more: ≈ 1.4 u
FD_ARITH = 1.5 * 2.0**-53
SEND_BLOCK = 256  # colours whose indices go to the device in one copy
STACK_MAX = 2**22  # output elements up to which a colour's calls are reduced together


def _level_sums(kernel: ShapedKernel, point: Point, tp: torch.Tensor,
                at: tuple[Any, ...], moved: torch.Tensor, g: dict[str, torch.Tensor],
                outs: list[tuple[str, tuple[str, ...]]], shared: tuple[str, ...]
                ) -> list[torch.Tensor]:
    """Per level, ``Σ ⟨g, y₊ − y₋⟩`` over every axis not shared: the kernel called at each
    of ``moved`` (written into ``tp`` at ``at``). Small outputs are stacked and cast to fp64
    once for the calls (a GEMM's dA makes 147k calls: each op saved is seconds)."""
    ys = []
    for s in range(len(moved)):
        tp[at] = moved[s]
        ys.append(forward(kernel, point, exact=False))
    sums: list[torch.Tensor] = []
    for k, axes in outs:
        if ys[0][k].numel() * 2 * len(LEVELS) <= STACK_MAX:
            y = torch.stack([y_[k] for y_ in ys]).to(torch.float64)
            diff = g[k] * (y[0::2] - y[1::2])
            parts = [_reduce(diff[j], axes, shared) for j in range(len(ys) // 2)]
        else:
            parts = [_reduce(g[k] * (ys[2 * j][k].to(torch.float64)
                                     - ys[2 * j + 1][k].to(torch.float64)), axes, shared)
                     for j in range(len(ys) // 2)]
        sums = [a + b for a, b in zip(sums, parts, strict=True)] if sums else parts
    return sums
