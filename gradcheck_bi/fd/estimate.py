"""Finite-difference gradients of a kernel's own forward, with their noise floors.

For ``L = Σ g·y`` the input gradient is estimated column by column with a central stencil

    dL/dx_k ≈ Σ_o w_o · Σ_i g_i (y_i(x + o h e_k) - y_i(x - o h e_k)) / h

(outputs differenced elementwise *before* the dot with ``g``: the pairs nearly cancel, so
the dot adds little rounding). Rows of a norm are independent, so perturbing column ``k``
of *every* row at once gives the derivative for all rows (a row-coloured Jacobian); the
``D`` columns × stencil points are stacked into batched forward calls, chunked under a
memory budget (:mod:`~gradcheck_bi.fd.budget`). A batch-invariant kernel gives each
perturbed row the same bits in any chunk, so the chunk size never changes the result.

The weight gradient uses that ``y_i`` depends on ``w`` only through ``w_i`` (the weight is
elementwise): one perturbation of every weight at once gives every ``∂y_i/∂w_i``.

Steps: :mod:`~gradcheck_bi.fd.step`; the noise floor of each estimate:
:mod:`~gradcheck_bi.fd.noise`.

>>> import torch
>>> from gradcheck_bi.kernels.rmsnorm import After
>>> x = torch.randn(4, 16, dtype=torch.float64); g = torch.randn(4, 16, dtype=torch.float64)
>>> w = torch.randn(16, dtype=torch.float64)
>>> est = input_grad(lambda t: After.apply(t, w, 1e-6, False), x, g, eps=1e-6)
>>> est.grad.shape
torch.Size([4, 16])
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from gradcheck_bi.fd.budget import check_budget, chunk_shape
from gradcheck_bi.fd.noise import rounding_coefficient, truncation
from gradcheck_bi.fd.stencil import CENTRAL4, Stencil, combine_sums, signed_offsets
from gradcheck_bi.fd.step import WEIGHT_STEP_REL, input_step_rel, row_steps, weight_step
from gradcheck_bi.kernels.reduction import row_sum


@dataclass
class FDEstimate:
    """A finite-difference gradient with its per-element noise-floor estimate."""

    grad: torch.Tensor  # fp64, shape of the differentiated tensor
    noise_floor: torch.Tensor  # fp64, same shape
    step: torch.Tensor  # fp64: per row for dx, a scalar for dw
    stencil: Stencil
    forward_calls: int


def _differences(ys: torch.Tensor, g: torch.Tensor, g_abs: torch.Tensor,
                 n_offsets: int, owned: bool) -> torch.Tensor:
    """Row sums ``[Σ_i g_i (y_i(+o) - y_i(-o)) for o..., Σ_i |g_i| max_o |y_i(±o)|]``.

    ``ys`` is ``(points, ..., D)`` with the ``+o`` outputs first; the differences are taken
    elementwise in fp64 (exact for nearby values) before the dot with ``g``.
    """
    work = torch.empty((n_offsets + 1, *ys.shape[1:]), dtype=torch.float64, device=ys.device)
    if ys.dtype == torch.float64:
        torch.sub(ys[:n_offsets], ys[n_offsets:], out=work[:n_offsets])
    else:
        work[:n_offsets].copy_(ys[:n_offsets])
        work[:n_offsets].sub_(ys[n_offsets:])
    work[:n_offsets].mul_(g)
    # ``owned``: ys shares no memory with the perturbed inputs, so |y| may overwrite it.
    mags = ys.abs_() if owned else ys.abs()
    if mags.dtype == torch.float64:
        torch.amax(mags, 0, out=work[n_offsets])
    else:
        work[n_offsets].copy_(torch.amax(mags, 0))
    work[n_offsets].mul_(g_abs)
    return row_sum(work)


def input_grad(
    forward: Callable[[torch.Tensor], torch.Tensor],
    x: torch.Tensor,
    g: torch.Tensor,
    eps: float,
    stencil: Stencil = CENTRAL4,
    step_rel: float | None = None,
    max_memory: int | None = None,
    *,
    chunk: tuple[int, int] | None = None,
) -> FDEstimate:
    """Central-difference ``dL/dx`` for ``L = Σ g·forward(x)``, every element, row-coloured.

    Chunk by chunk, ``points × columns × rows`` copies of the rows are perturbed in one
    column each and pushed through ``forward`` in one call; per row ``k`` and column ``c``::

        S_o = Σ_i g_i (y_i(x + o h e_c) - y_i(x - o h e_c))      (fixed-order row sum)
        dL/dx_c ≈ Σ_o w_o S_o / h,     2nd order: S_1 / (2h)

    The perturbed copies live in one buffer filled once per row block; only the perturbed
    elements are written and restored per chunk. ``chunk = (columns, rows)`` overrides
    :func:`chunk_shape` (for tests and benchmarks: the result's bits never depend on it,
    for a batch-invariant kernel). Raises :class:`MemoryBudgetError` when
    even the smallest chunk does not fit ``max_memory``.
    """
    n_cols = x.shape[-1]
    check_budget(tuple(x.shape), stencil, x.dtype, max_memory)
    x2 = x.detach().reshape(-1, n_cols)
    n_rows = x2.shape[0]
    dev = x.device
    g2 = g.detach().reshape(-1, n_cols).to(torch.float64)
    g2_abs = g2.abs()
    rel = input_step_rel(x.dtype, step_rel)
    h = row_steps(x2, eps, rel)
    signed = signed_offsets(stencil).to(dev)
    n_off, points = len(stencil.offsets), stencil.points
    # delta[p, r]: the step at stencil point p for row r, rounded to x's dtype once.
    delta = (signed[:, None] * h[None, :]).to(x.dtype)
    sums = torch.empty(n_off + 1, n_cols, n_rows, dtype=torch.float64, device=dev)
    n_c_max, n_r_max = chunk or chunk_shape(n_rows, n_cols, stencil, x.dtype, max_memory, dev)
    n_c_max, n_r_max = max(1, min(n_c_max, n_cols)), max(1, min(n_r_max, n_rows))
    calls = 0
    for r0 in range(0, n_rows, n_r_max):
        rows = x2[r0 : r0 + n_r_max]
        n_r = rows.shape[0]
        # points × n_c_max copies of the row block; any prefix of them is unperturbed rows.
        buf = rows.repeat(points * n_c_max, 1)
        g_r, g_abs_r, delta_r = g2[r0 : r0 + n_r], g2_abs[r0 : r0 + n_r], delta[:, r0 : r0 + n_r]
        for c0 in range(0, n_cols, n_c_max):
            n_c = min(n_c_max, n_cols - c0)
            xs = buf[: points * n_c * n_r].view(points, n_c, n_r, n_cols)
            local = torch.arange(n_c, device=dev)
            cols = local + c0
            base = rows[:, c0 : c0 + n_c].T  # (n_c, n_r)
            # xs[p, c, r, c0 + c] = x[r, c0 + c] + delta[p, r]; the index result is (n_c, p, r)
            xs[:, local, :, cols] = base[:, None, :] + delta_r[None, :, :]
            with torch.no_grad():
                ys = forward(xs.view(-1, n_cols))
            calls += 1
            if tuple(ys.shape) != (points * n_c * n_r, n_cols):
                raise ValueError(
                    f"forward returned shape {tuple(ys.shape)} for a batch of "
                    f"{(points * n_c * n_r, n_cols)}"
                )
            owned = ys.untyped_storage().data_ptr() != buf.untyped_storage().data_ptr()
            s = _differences(ys.reshape(points, n_c, n_r, n_cols), g_r, g_abs_r, n_off, owned)
            sums[:, c0 : c0 + n_c, r0 : r0 + n_r] = s
            xs[:, local, :, cols] = base[:, None, :].expand(n_c, points, n_r)
    num, num2 = combine_sums(sums[:n_off], stencil)
    grad = (num / h).T
    trunc = truncation((num2 - num) / h, rel).T
    rounding = rounding_coefficient(x.dtype, stencil) * (sums[n_off] / h).T
    floor = trunc + rounding
    return FDEstimate(grad.reshape(x.shape).contiguous(), floor.reshape(x.shape).contiguous(),
                      h, stencil, calls)


@dataclass
class DirectionalEstimate:
    """Finite-difference projections ``⟨dL/dx, v⟩`` along random directions, per row.

    ``directions[k]`` is the direction actually stepped along (the realised perturbations,
    combined with the stencil weights, divided by the step): compare ``Σ_i dx_i ·
    directions[k, ..., i]`` with ``projection[k, ...]``. Individual elements of ``dx`` are
    not estimated: an error orthogonal to every direction drawn goes unseen.
    """

    directions: torch.Tensor  # fp64, (K, *x.shape)
    projection: torch.Tensor  # fp64, (K, *x.shape[:-1])
    noise_floor: torch.Tensor  # fp64, same shape as projection
    step: torch.Tensor  # fp64, per row
    stencil: Stencil
    forward_calls: int


def directional_input_grad(
    forward: Callable[[torch.Tensor], torch.Tensor],
    x: torch.Tensor,
    g: torch.Tensor,
    eps: float,
    directions: int = 8,
    seed: int = 0,
    stencil: Stencil = CENTRAL4,
    step_rel: float | None = None,
    max_memory: int | None = None,
) -> DirectionalEstimate:
    """Central differences of ``L = Σ g·forward(x)`` along ``directions`` random unit vectors
    per row, as jax's ``check_vjp`` does with one: ``stencil.points × directions`` forward
    calls' worth of rows instead of ``stencil.points × D``.

    Each row ``r`` gets its own Gaussian direction ``v`` (unit length, drawn from ``seed``)
    and the step ``h_r`` of :func:`input_grad`; the stencil is applied to ``x_r + o h_r v``.
    Noise floor: the same rounding and truncation estimates as :func:`input_grad`.
    """
    n_cols = x.shape[-1]
    check_budget(tuple(x.shape), stencil, x.dtype, max_memory)
    if directions < 1:
        raise ValueError(f"directions must be >= 1, got {directions}")
    x2 = x.detach().reshape(-1, n_cols)
    n_rows, dev = x2.shape[0], x.device
    g2 = g.detach().reshape(-1, n_cols).to(torch.float64)
    rel = input_step_rel(x.dtype, step_rel)
    h = row_steps(x2, eps, rel)
    gen = torch.Generator().manual_seed(seed)
    v = torch.randn(directions, n_rows, n_cols, generator=gen, dtype=torch.float64)
    v = (v / torch.linalg.vector_norm(v, dim=-1, keepdim=True)).to(dev)
    n_off = len(stencil.offsets)
    signed = signed_offsets(stencil).to(dev)
    # Stack (direction, row) pairs as rows m = k·R + r.
    n_m = directions * n_rows
    x_m = x2.repeat(directions, 1)
    h_m = h.repeat(directions)
    g_m = g2.repeat(directions, 1)
    v_m = v.reshape(n_m, n_cols)
    _, per_call = chunk_shape(n_m, n_cols, stencil, x.dtype, max_memory, dev)
    sums = torch.empty(n_off + 1, n_m, dtype=torch.float64, device=dev)
    veff = torch.empty(n_m, n_cols, dtype=torch.float64, device=dev)
    calls = 0
    for m0 in range(0, n_m, per_call):
        sl = slice(m0, min(n_m, m0 + per_call))
        xm, hm = x_m[sl], h_m[sl]
        steps = signed[:, None, None] * hm[None, :, None] * v_m[sl][None]
        xs = xm[None] + steps.to(x.dtype)
        with torch.no_grad():
            ys = forward(xs.reshape(-1, n_cols))
        calls += 1
        if tuple(ys.shape) != (xs.shape[0] * xs.shape[1], n_cols):
            raise ValueError(f"forward returned shape {tuple(ys.shape)} for a batch of "
                             f"{(xs.shape[0] * xs.shape[1], n_cols)}")
        owned = ys.untyped_storage().data_ptr() != xs.untyped_storage().data_ptr()
        real = xs.to(torch.float64) - xm.to(torch.float64)[None]  # the steps actually taken
        sums[:, sl] = _differences(ys.reshape(xs.shape), g_m[sl], g_m[sl].abs(), n_off, owned)
        veff[sl] = combine_sums(real[:n_off] - real[n_off:], stencil)[0] / hm[:, None]
    num, num2 = combine_sums(sums[:n_off], stencil)
    proj = num / h_m
    trunc = truncation((num2 - num) / h_m, rel)
    rounding = rounding_coefficient(x.dtype, stencil) * (sums[n_off] / h_m)
    lead = (directions, *x.shape[:-1])
    return DirectionalEstimate(veff.reshape(directions, *x.shape), proj.reshape(lead),
                               (trunc + rounding).reshape(lead), h, stencil, calls)


def weight_grad(
    forward: Callable[[torch.Tensor], torch.Tensor],
    w: torch.Tensor,
    x: torch.Tensor,
    g: torch.Tensor,
    stencil: Stencil = CENTRAL4,
    step_rel: float = WEIGHT_STEP_REL,
) -> FDEstimate:
    """Central-difference ``dL/dw`` for ``L = Σ g·forward(w)``; the weight is elementwise.

    ``forward`` maps a weight vector to ``y`` of the shape of ``g``. The step is a power of
    two near ``step_rel · max(1, max|w|)``: ``y`` is linear in ``w`` for RMSNorm, so a large
    step costs no truncation error and divides the rounding error.
    """
    n_cols = w.shape[-1]
    g2 = g.detach().reshape(-1, n_cols).to(torch.float64)
    w0 = w.detach()
    h = weight_step(w0, step_rel)
    ys = []
    with torch.no_grad():
        for o in list(stencil.offsets) + [-o for o in stencil.offsets]:
            ys.append(forward(w0 + o * h).reshape(-1, n_cols).to(torch.float64))
    stacked = torch.stack(ys)
    n_off = len(stencil.offsets)
    # Per offset, Σ over rows of g·(y(+o) - y(-o)) (differences before the dot, as for dx),
    # as fixed-order row sums of the transpose; then the same stencil combination as dx.
    sums = row_sum(((stacked[:n_off] - stacked[n_off:]) * g2).transpose(1, 2).contiguous())
    num, num2 = combine_sums(sums, stencil)
    grad, grad2 = num / h, num2 / h
    gy_abs = row_sum((g2.abs() * stacked.abs().amax(0)).T.contiguous())  # (D,)
    trunc = truncation(grad2 - grad, step_rel)
    rounding = rounding_coefficient(x.dtype, stencil) * gy_abs / h
    return FDEstimate(grad, trunc + rounding, torch.tensor(h, dtype=torch.float64), stencil,
                      stencil.points)
