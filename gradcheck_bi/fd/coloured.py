"""Row-coloured finite differences of a forward with several outputs (the row ops).

For ``L = Σ_outputs Σ g_out · y_out`` and an input ``t`` shaped like x, perturbing column
``c`` of *every* row at once gives ``dL/dt_c`` for all rows (a row op computes
each row from that row alone), with the stencils and levels of :mod:`~gradcheck_bi.fd.stencil`::

    S_o = Σ_out Σ_i g_i (y_i(t + o h e_c) - y_i(t - o h e_c)),   dL/dt_c ≈ Σ_o w_o S_o / h

The outputs are treated as one row of all their elements. The rounding model of one point
(:func:`~gradcheck_bi.tolerance.noise.model_sigma`) runs, per row *and column*, over the output
elements the perturbed element reaches: ``reach[k]`` is, for output ``k``, the size of the
consecutive group of elements that column ``c`` moves (D: the whole row, as RMSNorm's
shared ``r``; a group's size for a statistic over groups; 1: only element ``c``, as an
elementwise path or an output that adds inputs — each op's record says, ``Op.reach``).
An element out of reach is computed alike at every level and adds no noise; one in reach adds
its rounding even when its bits do not move (a staircase below one ulp). ``λ`` is measured
from the stencil's remainder as for RMSNorm; where some output does not reach the whole row,
``y0``'s own rounding is no longer shared by the row's columns, so it is modelled (``Y0_VAR =
(2 Σ c_o)² = 90²`` times one point's variance) rather than centred away, and ``λ`` is held
at 1 or more: an element moved little rounds all or nothing (``x + o h`` shifted by a
multiple of its ulp rounds alike at every level, or one ulp apart), so the pooled ``λ``
measures how often its roundings differ, not how large one difference is.
Columns are stacked into batched calls of at most :func:`elements_per_call` elements per output,
each padded to a ladder step (:func:`~gradcheck_bi.fd.budget.batch_rows`); each output's sums
are RMSNorm's (:func:`~gradcheck_bi.fd.reduce.level_sums`: one fused Triton pass on CUDA,
fp64 differences taken elementwise before the product with g).

>>> import torch
>>> x = torch.randn(3, 8, dtype=torch.float64); g = torch.randn(3, 8, dtype=torch.float64)
>>> h = torch.full((3,), 2.0**-8, dtype=torch.float64)
>>> est = input_grad_outputs(lambda t: [t * t], x, [g], h)
>>> bool(torch.allclose(est.grad, 2 * x * g))
True
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import torch

from gradcheck_bi.fd.budget import (
    CPU_CHUNK_ELEMENTS,
    batch_rows,
    budget,
    cuda_room,
    keep_freed_memory,
    ladder_base,
    ladder_chunk,
    over_budget,
)
from gradcheck_bi.fd.estimate import FDEstimate, jumps
from gradcheck_bi.fd.reduce import level_sums, native_worth
from gradcheck_bi.fd.stencil import (
    CENTRAL4,
    LEVELS,
    Stencil,
    level_offsets_on,
    stencil_estimate,
)
from gradcheck_bi.fd.threads import cpu_threads, run_steps
from gradcheck_bi.tolerance.noise import (
    REMAINDER_VAR,
    Y0_VAR,
    model_sigma,
    noise_floor,
    noise_scales,
    pow2_scale,
    reached_sigma,
    stencil_remainder,
    unit_roundoff,
)

MAX_ELEMENTS = 1 << 22  # per output and call: the stacked perturbed rows × D
# On CUDA a call that small is launch-bound: at (64, 8192) it perturbs one column, 8192
# calls per input, and Liger's fused add spent 9 s of an 11.3 s check around them (H200,
# docs/ops.md). There a call takes up to CUDA_MAX_ELEMENTS per output, as the free device
# memory allows at BYTES_PER_ELEMENT (the perturbed input, the other inputs repeated, every
# output, the forward's temporaries), rounded down to a power of two so that the chunking
# does not move between runs. The sums' bits do not depend on it. At 2^26 (64, 8192) still
# took 820 calls of 4096 rows per input, and the check was bound by the host's ~1 ms of work
# per call (the H200 profile in docs/benchmarks.md); 2^28 gives 97 calls of 32768 rows (1 GiB
# of fp32).
CUDA_MAX_ELEMENTS = 1 << 28
BYTES_PER_ELEMENT = 64


def elements_per_call(device: torch.device, max_memory: int | None = None, held: int = 0
                      ) -> int:
    """Perturbed elements per output in one forward call on ``device`` (see above), within
    what the memory budget (:func:`gradcheck_bi.fd.budget.budget` of ``max_memory``) leaves
    after the ``held`` bytes the check keeps throughout; a power of two, 0 if nothing fits."""
    if device.type != "cuda" or not torch.cuda.is_available():
        # on CPU sized to stay in cache, as RMSNorm's chunks (fd.budget.CPU_CHUNK_ELEMENTS)
        most = min(MAX_ELEMENTS, CPU_CHUNK_ELEMENTS) if device.type == "cpu" else MAX_ELEMENTS
    else:
        room = cuda_room(device, BYTES_PER_ELEMENT)
        most = max(MAX_ELEMENTS, min(CUDA_MAX_ELEMENTS, 1 << (room.bit_length() - 1)))
    spare = (budget(max_memory) - held) // BYTES_PER_ELEMENT
    return min(most, 1 << (spare.bit_length() - 1)) if spare > 0 else 0


def least_bytes(shape: tuple[int, ...]) -> int:
    """Bytes :func:`input_grad_outputs` needs at least for an input of ``shape``: the sums
    and taken steps it holds (fp64, every level, column and row), and one call perturbing
    one column of every row at every level."""
    n_cols = shape[-1] if shape else 1
    n_rows = math.prod(shape[:-1])
    points = 2 * len(LEVELS) * n_rows * n_cols
    return 2 * points * 8 + points * BYTES_PER_ELEMENT


def check_input_budget(shape: tuple[int, ...], dtype: torch.dtype, max_memory: int | None
                       ) -> None:
    """Raise :class:`MemoryBudgetError` (with the estimate) if :func:`input_grad_outputs`
    cannot run for an input of ``shape`` within ``max_memory``."""
    need = least_bytes(shape)
    if need > budget(max_memory):
        raise over_budget(shape, dtype, need, max_memory)


def plan(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device,
         max_memory: int | None = None) -> tuple[int, int]:
    """``(columns, rows)`` of :func:`input_grad_outputs`'s calls for an input of ``shape``:
    the columns perturbed per call (every row, every level) and the rows each call feeds the
    kernel, padding included — a benchmark's forward floor uses the same calls."""
    n_cols = shape[-1] if shape else 1
    n_rows = math.prod(shape[:-1])
    n_lev = len(LEVELS)
    ladder = ladder_base(device)
    column = 2 * n_lev * n_rows * n_cols  # one perturbed column of every row
    held = 2 * column * 8  # the check's fp64 sums and taken steps, every level and column
    room = elements_per_call(device, max_memory, held)
    if room < column:  # below the preferred call size (or its power of two): one column a call
        check_input_budget(shape, dtype, max_memory)
        room = column
    per_call, _ = ladder_chunk(room // n_cols, n_rows, n_cols, 2 * n_lev, ladder)
    return per_call, batch_rows(2 * n_lev * per_call * n_rows, ladder)


def _steps_taken(sums: torch.Tensor, taken: torch.Tensor, h: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """The odd sums rescaled to the nominal steps: ``S_o · 2 o h / (δ⁺_o − δ⁻_o)``.

    ``x ± o h`` rounds where it crosses into a coarser binade (``x + 4h`` past 1.0): the
    step taken is off by up to half an ulp of x, an error of ``u |x| |dL/dx| / h`` that no
    output rounding model contains (it dominates where a sum of inputs nearly cancels).
    Rescaling each level by the step it really took removes it to first order.
    """
    n_lev = len(LEVELS)
    nominal = 2 * level_offsets_on(h.device)[:n_lev, None, None] * h
    width = taken[:n_lev] - taken[n_lev:]
    scale = torch.where(width > 0, nominal / torch.where(width > 0, width, 1.0), 1.0)
    return sums[:n_lev] * scale, sums[n_lev:]


def _joined(ts: list[torch.Tensor]) -> torch.Tensor:
    """The outputs' rows side by side (one output: itself, no copy)."""
    return ts[0] if len(ts) == 1 else torch.cat(ts, -1)


def input_grad_outputs(
    forward: Callable[[torch.Tensor], list[torch.Tensor]],
    t: torch.Tensor,
    gs: list[torch.Tensor],
    h: torch.Tensor,
    stencil: Stencil = CENTRAL4,
    reach: list[int] | None = None,
    shared: torch.Tensor | None = None,
    offsets: list[torch.Tensor | None] | None = None,
    max_memory: int | None = None,
    meanwhile: Callable[[], None] | None = None,
) -> FDEstimate:
    """Central-difference ``dL/dt`` for ``L = Σ_k Σ gs[k] · forward(t)[k]``, every element.

    ``forward`` maps ``t`` (at its own shape, for the unperturbed outputs) or ``(N, D)``
    rows to its outputs, each shaped as what it was given; row ``i`` of the ``N`` is a
    perturbed copy of ``t``'s row ``i mod R`` (the last rows are padding) and holds the
    other inputs' row ``i mod R``; ``h`` is the step per row, ``(R,)``, fp64;
    ``reach`` the group each output's elements move in (default: the whole row);
    ``shared`` (``(R,)``, in units of ``u``) a rounding every element of a row shares that
    the model's ``(Σ g y)²`` term does not contain (a layer norm's mean: additive, not
    relative), added to one point's variance; ``offsets`` per output, a part of ``y`` that
    the statistic does not scale (a layer norm's β): the model then runs on ``y − offset``
    (what rounds relative to the statistic) and adds the final addition's own rounding of
    each ``y`` — where ``n γ`` and β nearly cancel, ``|y|`` would understate both.
    ``max_memory``: the budget the calls are sized within (``None``: the default); one
    that cannot hold a call of one perturbed column raises :class:`MemoryBudgetError`.
    ``meanwhile``: host work of the caller's run once every call is issued and before
    anything here waits for them — on a GPU it runs while they do (a check's analytic
    backward and rounding model: ~5 ms of host time at (64, 8192), once exposed).
    """
    n_cols = t.shape[-1]
    t2 = t.detach().reshape(-1, n_cols)
    n_rows, dev = t2.shape[0], t.device
    g2 = [g.detach().reshape(-1, g.shape[-1]).to(torch.float64) for g in gs]
    with torch.no_grad():  # at t's own shape: no new shape for the kernel
        y0 = [y.reshape(-1, y.shape[-1]).to(torch.float64) for y in forward(t.detach())]
    if len(y0) != len(g2):
        raise ValueError(f"forward returned {len(y0)} outputs for {len(g2)} cotangents")
    widths = [y.shape[-1] for y in y0]
    reach = list(reach) if reach is not None else widths
    n_lev = len(LEVELS)
    delta = (level_offsets_on(dev)[:, None] * h[None, :]).to(t.dtype)  # (2L, R)
    sums = torch.empty(2 * n_lev, n_cols, n_rows, dtype=torch.float64, device=dev)
    taken = torch.empty_like(sums)  # the steps x ± o h actually took, after rounding
    per_call, batch = plan(tuple(t.shape), t.dtype, dev, max_memory)
    calls = 1
    # RMSNorm's CPU machinery: the compiled one-pass sums (same bits) and freed chunks kept
    native = native_worth(2 * n_lev * n_rows * n_cols * sum(widths), dev, t.dtype)
    if dev.type == "cpu":
        keep_freed_memory()
    # One batch for every call: t's rows repeated (row i is row i mod R; the rows past a
    # chunk's are the padding), perturbed in place at the chunk's columns and put back after
    # the call — no copy of the batch per call (a kernel declared to write into its inputs
    # is handed a copy: kernels.calling.opcall.op_forward).
    buf = t2.repeat(-(-batch // n_rows), 1)[:batch]
    # Every perturbed value x ± o h (in t's dtype, as the kernel gets it) and the step it
    # took after rounding, made once for every column: (2L, D, R).
    pert = t2.T[None] + delta[:, None, :]
    taken.copy_(pert.to(torch.float64) - t2.T.to(torch.float64)[None])

    def call(c0: int) -> None:  # one batched forward of columns c0 … c0 + per_call
        c1 = min(n_cols, c0 + per_call)
        chunk = (2 * n_lev, c1 - c0, n_rows)
        rows = math.prod(chunk)
        # Level l, column c0 + j, row r of the chunk is row (l, j, r) of the batch, perturbed
        # at column c0 + j: one strided diagonal of the chunk's rows, (2L, R, j) — written,
        # and put back after the call, with one copy each (no index tensors).
        spots = buf[:rows].view(*chunk, n_cols).diagonal(c0, 1, 3)
        spots.copy_(pert[:, c0:c1].transpose(1, 2))
        with torch.no_grad():
            ys = forward(buf)
        if len(ys) != len(g2):
            raise ValueError(f"forward returned {len(ys)} outputs for {len(g2)} cotangents")
        spots.copy_(t2[:, c0:c1].expand_as(spots))  # the batch unperturbed again
        # RMSNorm's sums, output by output (the padding's rows left out), straight into the
        # check's (2L, D, R) sums: one fused pass on CUDA, each difference exact.
        level_sums(ys[0][:rows].reshape(*chunk, widths[0]), y0[0], g2[0], native=native,
                   out=sums[:, c0:c1])
        for y, y_ref, g in zip(ys[1:], y0[1:], g2[1:], strict=True):
            sums[:, c0:c1] += level_sums(y[:rows].reshape(*chunk, y_ref.shape[-1]),
                                         y_ref, g, native=native)

    # RMSNorm's thread choice: torch's threads by the call's size, and one thread while one
    # proves faster (fd.threads.run_steps: two threads on two shared cores can be 10× slower)
    starts = range(0, n_cols, per_call)
    with cpu_threads(dev, batch * sum(widths)):
        run_steps([functools.partial(call, c0) for c0 in starts], dev)
    calls += len(starts)
    if meanwhile is not None:
        meanwhile()
    odd, even = _steps_taken(sums, taken, h)
    grad, trunc = stencil_estimate(odd, stencil, h)
    grad = grad.T
    # An uneven step pair leaves G·(δ⁺ + δ⁻) in the even sums: first order, removed.
    even = even - (taken[:n_lev] + taken[n_lev:]) * grad.T[None]
    j1, j4 = jumps(even, h)
    u = unit_roundoff(t.dtype)
    # y0's rounding shared by a row's columns
    coupled = all(k == w for k, w in zip(reach, widths, strict=True))
    offs = list(offsets) if offsets is not None else [None] * len(y0)
    scaled = [y if o is None else y - o.to(y) for y, o in zip(y0, offs, strict=True)]
    if coupled:  # one per row, every column alike: (1, R), spread over the columns last
        sigma_m = model_sigma(_joined(g2), _joined(scaled), u)[None]
    else:  # column c reaches its group of output columns
        sigma_m = u * reached_sigma(g2, scaled, reach)
    extra = sum((((g * y) ** 2).sum(-1) for g, y, o in zip(g2, y0, offs, strict=True)
                 if o is not None), torch.zeros(n_rows, dtype=torch.float64, device=dev))
    if shared is not None:
        extra = extra + shared.to(extra) ** 2
    # squared on a power of two per element: an output of 1e-240 (silu far below 0) keeps
    # its rounding (:func:`~gradcheck_bi.tolerance.noise.pow2_scale`, the same bits elsewhere)
    p2 = pow2_scale(torch.maximum(sigma_m, u * extra.sqrt()))
    sigma_m = p2 * torch.sqrt((sigma_m / p2) ** 2 + u * u * extra / p2 / p2)
    resid_var = REMAINDER_VAR + (0.0 if coupled else Y0_VAR)
    p2 = pow2_scale(sigma_m)  # one per row where coupled (centring subtracts across columns)
    resid, model_var = stencil_remainder(even) / p2, resid_var * (sigma_m / p2) ** 2
    lam, robust = noise_scales(resid, model_var, centre=coupled)
    if not coupled:  # all-or-nothing roundings: at least the dtype model's
        lam, robust = max(lam, 1.0), max(robust, 1.0)
    sigma_e = (lam * stencil.rss_weight * sigma_m / h).expand(n_cols, n_rows)

    def shaped(v: torch.Tensor) -> torch.Tensor:
        return v.reshape(t.shape).contiguous()

    return FDEstimate(shaped(grad), shaped(noise_floor(sigma_e, trunc).T), h,
                      stencil, calls, lam, lam * u, shaped(sigma_e.T), shaped(trunc.T),
                      noise_scale_robust=robust,
                      jumps=(shaped(j1.T), shaped(j4.T)))
