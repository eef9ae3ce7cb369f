"""The random directions of a sampled gradient check: ``⟨d<role>, t⟩`` along random
``t`` over the whole tensor against central differences of the kernel's forward, with the
tolerance of each projection (:func:`directions`). What checks no element by itself covers
every element this way (:mod:`gradcheck_bi.checks.shaped`)."""

from __future__ import annotations

import functools
import math

import torch

from gradcheck_bi.checks.shaped_point import Point, forward, seed_of
from gradcheck_bi.errors import Derived
from gradcheck_bi.fd.plan import DIRECTIONS, LEVELS, combine, noise_weight
from gradcheck_bi.fd.reduce import FUSED_MIN_ELEMENTS
from gradcheck_bi.fd.threads import run_steps
from gradcheck_bi.kernels.calling.shaped_call import ShapedKernel
from gradcheck_bi.sums.reduction import chosen_backend, resolve_backend, triton_available
from gradcheck_bi.tolerance.noise import K_SIGMA, K_TRUNC


def directions(kernel: ShapedKernel, point: Point, role: str, m: Derived, u: float,
               analytic: torch.Tensor, h: float, count: int = DIRECTIONS
               ) -> list[tuple[float, float]]:
    """``⟨d<role>, t⟩`` against central differences along random ``t`` over the whole
    tensor: ``(error, tolerance)`` per direction.

    A direction is :func:`rank_one`: an outer product of normals drawn per row and per
    column, ``t = a bᵀ``, never formed. Each level writes ``x ± o h a bᵀ`` straight into the
    point's own tensor in one op from its unperturbed values (rounded once to its dtype, as
    the kernel gets it) and keeps the step it took (``x₊ − x₋``, exact) in one fp64 buffer.
    A direction's levels are queued and their sums read back once.
    The kernel's own rounding projected, ``‖t ∘ σ_grad‖² = Σ_r a_r² Σ_c b_c² σ_rc²``, and
    the gradient's ``α`` projected, ``|a|ᵀ α |b|``, are matrix products over the rows, one
    pass for every direction. The truncation (level 4h: two of six calls) is computed for a
    direction the noise alone does not pass: a passing one's tolerance is given without it.
    """
    t = point.canonical()[role]
    gen = torch.Generator(device=t.device).manual_seed(seed_of(point.cfg) + 2)
    g = {k: v.to(torch.float64) for k, v in point.drawn.cotangents.items()}
    noise = sum(float((g[k] ** 2 * m.output_sigma[k] ** 2).sum()) for k in g)
    # the forward's α (y₊, y₋ each off by up to α): level o off by Σ|g|α / (o h), E4(h) by
    # 1.5 Σ|g|α / h
    lost = 1.5 * sum(float((g[k].abs() * m.output_absolute[k]).sum()) for k in g) / h
    factors = [rank_one(t.shape, gen, t.device) for _ in range(count)]
    # on the host, each read back once (not once per direction)
    sigma_k = (u * _projected(m.grad_sigma[role], factors, square=True).sqrt()).tolist()
    abs_g = m.grad_absolute[role]
    projected = _projected(abs_g, factors).tolist() if bool((abs_g > 0).any()) else None
    # the finite difference's noise, the same for every direction: ⟨g, y₊ − y₋⟩'s rounding
    # through E4(h)'s two levels
    w = noise_weight([torch.tensor(2 * o * h, dtype=torch.float64) for o in LEVELS[:2]])
    sigma_fd = u * math.sqrt(noise * float(w))
    flat_grad = analytic.reshape(-1)
    orig = t.clone()
    fused = _fused(t, analytic)
    taken = None if fused else torch.empty(t.shape, dtype=torch.float64, device=t.device)
    spare = _widening_buffer(t) if taken is not None else None
    out = []

    def level(d: tuple[torch.Tensor, torch.Tensor], o: int) -> list[torch.Tensor]:
        """Level ``o`` along ``d``, on the device: ``Σ ⟨g, y₊ − y₋⟩`` per output and
        ``⟨d<role>, x₊ − x₋⟩`` (``estimates`` reads them back)."""
        if fused:  # both signs' writes and the projection in two passes
            from gradcheck_bi.fd import _triton_directions

            va = (o * h * d[0]).reshape(-1)  # v·a first, as addcmul forms it
            _triton_directions.level(orig, va, d[1], t)
            y_plus = forward(kernel, point)
            along = _triton_directions.level(orig, va, d[1], t, analytic)
            assert along is not None
            ys = [y_plus, forward(kernel, point)]
        else:
            assert taken is not None
            ys = []
            for sign in (1, -1):
                _write_level(orig, d, sign * o * h, t, taken, spare)
                ys.append(forward(kernel, point))
            along = torch.dot(flat_grad, taken.reshape(-1))
        sums = [(g[k] * (ys[0][k] - ys[1][k])).sum() for k in g]
        return [*sums, along]

    def estimates(d: tuple[torch.Tensor, torch.Tensor], levels: tuple[int, ...]
                  ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per level of ``levels`` along ``d``, the finite difference's and the analytic
        gradient's second-order estimates of ``⟨d<role>, t⟩``: every level queued, one read
        back."""
        got = [level(d, o) for o in levels]
        flat = torch.stack([v for lv in got for v in lv]).tolist()
        n = len(g) + 1
        res = []
        for j, o in enumerate(levels):
            part = flat[j * n:(j + 1) * n]
            fd = sum(part[:-1])  # the outputs' sums added in order, as Python floats
            res.append((torch.tensor(fd / (2 * o * h), dtype=torch.float64),
                        torch.tensor(part[-1] / (2 * o * h), dtype=torch.float64)))
        return res

    def one(i: int) -> None:
        """Direction ``i``: its error and tolerance, appended to ``out``."""
        d = factors[i]
        fds, ans = map(list, zip(*estimates(d, LEVELS[:2]), strict=True))
        e_fd, e_an = ((4 * e[0] - e[1]) / 3 for e in (fds, ans))  # combine's E4(h)
        err = abs(float(e_fd) - float(e_an))
        tol = K_SIGMA * math.hypot(sigma_fd, sigma_k[i]) + lost
        if projected is not None:
            tol += projected[i]
        if not err <= tol:  # only then the truncation, from level 4h (two more calls)
            fds.append(estimates(d, LEVELS[2:3])[0][0])
            tol += K_TRUNC * float(combine(fds)[1])
        out.append((err, tol))

    try:
        run_steps([functools.partial(one, i) for i in range(count)], t.device)
    finally:
        t.copy_(orig)
    return out


WIDEN_BLOCK = 1 << 20  # fp64 elements a block of :func:`_write_level` computes at a time (8 MiB)


def _widening_buffer(t: torch.Tensor) -> torch.Tensor | None:
    """The fp64 block :func:`_write_level` computes a level of ``t`` in: on CPU, for a
    ``t`` in another dtype than fp64; ``None`` where torch's ops run as they are."""
    if t.device.type != "cpu" or t.dtype == torch.float64 or t.dim() == 0 or not t.numel():
        return None
    rows = max(1, min(t.shape[0], WIDEN_BLOCK // max(1, t[0].numel())))
    return torch.empty((rows, *t.shape[1:]), dtype=torch.float64)


def _write_level(orig: torch.Tensor, d: tuple[torch.Tensor, torch.Tensor], value: float,
                 t: torch.Tensor, taken: torch.Tensor, spare: torch.Tensor | None) -> None:
    """``t = orig + value a bᵀ`` computed in fp64 and rounded once to ``t``'s dtype, and
    the step: ``taken = t`` where ``value > 0``, else ``taken -= t`` (fp64, exact).

    The bits of ``torch.addcmul(orig, a, b, value=value, out=t)`` and ``taken.copy_(t)`` /
    ``taken.sub_(t)``; on CPU (``spare``, :func:`_widening_buffer`) a block of rows at a
    time through an fp64 buffer, as torch's mixed-dtype loops are slow there (an fp32
    (512, 32000) level, both signs: 177 ms, against 48 ms in blocks)."""
    a, b = d
    if spare is None:
        torch.addcmul(orig, a, b, value=value, out=t)
        if value > 0:
            taken.copy_(t)
        else:
            taken.sub_(t)
        return
    step = spare.shape[0]
    for r0 in range(0, t.shape[0], step):
        rows = slice(r0, min(r0 + step, t.shape[0]))
        wide = spare[: rows.stop - r0]
        wide.copy_(orig[rows])
        wide.addcmul_(a[rows], b, value=value)
        t[rows].copy_(wide)
        if value > 0:
            taken[rows].copy_(t[rows])
        else:
            wide.copy_(t[rows])
            taken[rows].sub_(wide)


def _fused(t: torch.Tensor, analytic: torch.Tensor) -> bool:
    """Whether a level runs as :mod:`gradcheck_bi.fd._triton_directions`' two passes: where
    ``row_sum`` runs Triton (compiled on CUDA; the interpreter on CPU when that backend is
    forced), on a contiguous fp32/fp64 tensor of rows and columns, on CUDA from
    :data:`~gradcheck_bi.fd.reduce.FUSED_MIN_ELEMENTS` elements (a compile costs more below)."""
    if (t.dim() < 2 or t.dtype not in (torch.float32, torch.float64)
            or not t.is_contiguous() or not analytic.is_contiguous()
            or analytic.dtype != torch.float64 or resolve_backend(t) != "triton"
            or not triton_available()):
        return False
    return not (t.is_cuda and t.numel() < FUSED_MIN_ELEMENTS and chosen_backend() is None)


def _projected(v: torch.Tensor, factors: list[tuple[torch.Tensor, torch.Tensor]],
               square: bool = False) -> torch.Tensor:
    """Per direction ``a bᵀ`` (:func:`rank_one`), ``Σ |a_r b_c| v_rc`` over the whole
    tensor, or (``square``) ``Σ (a_r b_c v_rc)²``: ``|a|ᵀ (V |B|)``, the columns of every
    direction in one product with ``V`` (the rows flattened, as the factors are)."""
    p = (lambda x: x * x) if square else torch.abs
    cols = factors[0][1].numel()
    flat = v.to(torch.float64).reshape(-1, cols)
    flat = flat * flat if square else flat
    b = torch.stack([p(f[1]).reshape(cols) for f in factors], dim=1)  # (cols, directions)
    by_row = flat @ b  # (rows, directions)
    a = torch.stack([p(f[0]).reshape(-1) for f in factors], dim=1)
    return (a * by_row).sum(0)


def rank_one(shape: torch.Size, gen: torch.Generator, device: torch.device
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """A random direction of ``shape`` (fp64) as its two factors ``(a, b)``, ``a bᵀ`` by
    broadcasting: ``a``, ``b`` standard normals over the rows (every axis but the last,
    flattened; ``a`` keeps the rows' shape, a trailing 1) and the last axis; a 1-d shape is
    a normal per element and ``b = 1``.

    As good a probe as a normal per element: for any fixed error ``e``, ``⟨e, a bᵀ⟩`` has
    mean 0 and variance ``‖e‖²`` (the products ``a_r b_c`` are uncorrelated, of unit
    variance), and it is 0 only where ``e``'s bilinear form vanishes on ``(a, b)``, a set of
    probability 0 — a defect anywhere in the tensor shows in every direction almost surely.
    It costs rows + columns normals instead of a normal per element, and nothing of the
    tensor's size: a level writes ``x ± o h a bᵀ`` in one op."""
    if len(shape) < 2:
        a = torch.randn(shape, generator=gen, dtype=torch.float64, device=device)
        return a, torch.ones(1, dtype=torch.float64, device=device)
    cols = shape[-1]
    rows = math.prod(shape[:-1])
    a = torch.randn(rows, 1, generator=gen, dtype=torch.float64, device=device)
    b = torch.randn(1, cols, generator=gen, dtype=torch.float64, device=device)
    return a.reshape(*shape[:-1], 1), b.reshape(cols)
