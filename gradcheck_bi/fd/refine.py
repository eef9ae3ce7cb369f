"""A second, finer step for the elements a first finite difference did not match: kinks.

A central stencil at step ``h`` reaches ``±4h`` (:data:`~gradcheck_bi.fd.stencil.LEVELS`).
Where the function bends sharply or is not differentiable inside that reach (a ReLU after a
norm: ``relu'`` jumps at 0), the estimate blends the slopes on either side and disagrees
with a correct gradient. Such an element is told from a wrong gradient by estimating it
again at ``h' = h / REFINE`` and comparing the two estimates: a smooth function gives
``E(h) ≈ E(h')`` within their noise and Richardson truncation; a kink does not.

Only the failing elements are estimated again (a healthy kernel pays nothing): per row its
failing columns, perturbed one per row and block (row ``r`` of a block is a copy of row
``r``, as in the row-coloured estimates, so a forward that maps row ``i`` to its other
inputs' row ``i mod R`` sees the right ones), at the same levels ``±h', ±2h', ±4h'``.

>>> import torch
>>> t = torch.tensor([[-1.0, 0.01, 2.0]], dtype=torch.float64)
>>> g = torch.ones_like(t)
>>> fine = refine_elements(lambda v: [torch.relu(v)], t, [g], torch.tensor([2.0**-6],
...                        dtype=torch.float64), torch.tensor([[False, True, False]]))
>>> fine.grad[0, 1].item(), fine.step[0].item() == 2.0**-10
(1.0, True)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from gradcheck_bi.fd.budget import CPU_CHUNK_ELEMENTS, batch_rows, ladder_base
from gradcheck_bi.fd.chunks import pad_rows
from gradcheck_bi.fd.estimate import jumps
from gradcheck_bi.fd.stencil import (
    CENTRAL4,
    LEVELS,
    Stencil,
    level_offsets_on,
    stencil_estimate,
)

# h' = h / REFINE: a kink at distance d from the element leaves the finer stencil clean once
# d > 4h'; a power of two keeps the steps exact.
REFINE = 16


@dataclass
class Refined:
    """The finer estimate at the elements asked for (``mask``); elsewhere 0. All fp64,
    shaped ``(R, D)`` except ``step``, ``(R,)``."""

    grad: torch.Tensor
    truncation: torch.Tensor
    mask: torch.Tensor
    step: torch.Tensor
    forward_calls: int
    ratio: int = REFINE  # the first step over this one
    # (J_1, J_4): the second differences over the step (:func:`~gradcheck_bi.fd.estimate.jumps`)
    jumps: tuple[torch.Tensor, torch.Tensor] | None = None


def refine_elements(
    forward: Callable[[torch.Tensor], list[torch.Tensor]],
    t: torch.Tensor,
    gs: list[torch.Tensor],
    h: torch.Tensor,
    mask: torch.Tensor,
    stencil: Stencil = CENTRAL4,
    ratio: int = REFINE,
) -> Refined:
    """``dL/dt`` for ``L = Σ_k Σ gs[k] · forward(t)[k]`` at the elements of ``mask``
    (``(R, D)``, ``t`` as rows), step ``h / ratio`` per row (``h``: ``(R,)``).

    ``forward`` maps ``t`` at its own shape, or ``(N, D)`` rows whose row ``i`` is a copy of
    ``t``'s row ``i mod R``, to its outputs. Each level's sum is rescaled to the step really
    taken (``t ± o h'`` rounds where it crosses a binade).
    """
    n_cols = t.shape[-1]
    t2 = t.detach().reshape(-1, n_cols)
    n_rows, dev = t2.shape[0], t.device
    mask = mask.reshape(n_rows, n_cols).to(dev)
    fine = h / ratio
    grad = torch.zeros(n_rows, n_cols, dtype=torch.float64, device=dev)
    trunc, j1, j4 = torch.zeros_like(grad), torch.zeros_like(grad), torch.zeros_like(grad)
    with torch.no_grad():
        y0 = [y.reshape(-1, y.shape[-1]).to(torch.float64) for y in forward(t.detach())]
    g2 = [g.detach().reshape(-1, g.shape[-1]).to(torch.float64) for g in gs]
    calls = 1
    counts = mask.sum(-1)
    n_blocks = int(counts.max().item()) if mask.any() else 0
    if n_blocks == 0:
        return Refined(grad, trunc, mask, fine, calls, ratio, (j1, j4))
    # cols[b, r]: the b-th failing column of row r (rows with fewer: their first, unused)
    order = torch.argsort((~mask).to(torch.int8), dim=-1, stable=True)
    cols = order[:, :n_blocks].T.contiguous()  # (B, R)
    used = torch.arange(n_blocks, device=dev)[:, None] < counts[None, :]
    n_lev = len(LEVELS)
    delta = (level_offsets_on(dev)[:, None] * fine[None, :]).to(t.dtype)  # (2L, R)
    per_call = max(1, CPU_CHUNK_ELEMENTS // (2 * n_lev * n_rows * n_cols))
    ladder = ladder_base(dev)
    rows_idx = torch.arange(n_rows, device=dev)
    for b0 in range(0, n_blocks, per_call):
        b1 = min(n_blocks, b0 + per_call)
        c = cols[b0:b1]  # (nb, R)
        at = (torch.arange(b1 - b0, device=dev)[:, None], rows_idx[None, :], c)
        xs = t2.expand(2 * n_lev, b1 - b0, n_rows, n_cols).clone()
        xs[(slice(None), *at)] += delta[:, None]
        moved = xs[(slice(None), *at)]
        taken = moved.to(torch.float64) - t2[rows_idx[None, :], c].to(torch.float64)[None]
        rows = xs.numel() // n_cols
        with torch.no_grad():
            ys = forward(pad_rows(xs.reshape(rows, n_cols), batch_rows(rows, ladder)))
        calls += 1
        sums = torch.zeros(2 * n_lev, b1 - b0, n_rows, dtype=torch.float64, device=dev)
        for y, y_ref, g in zip(ys, y0, g2, strict=True):
            d = y[:rows].reshape(2 * n_lev, b1 - b0, n_rows, -1).to(torch.float64) - y_ref
            sums += (d * g).sum(-1)
        odd = sums[:n_lev] - sums[n_lev:]  # S_o = Σ g (y(+o) - y(-o)), each difference exact
        width = taken[:n_lev] - taken[n_lev:]
        nominal = 2 * level_offsets_on(dev)[:len(LEVELS), None, None]
        odd = odd * torch.where(width > 0, nominal * fine / torch.where(width > 0, width, 1.0),
                                1.0)
        est, tr = stencil_estimate(odd, stencil, fine)
        jump1, jump4 = jumps(sums[:n_lev] + sums[n_lev:], fine)
        keep = used[b0:b1]
        r_i = rows_idx[None, :].expand_as(c)[keep]
        grad[r_i, c[keep]] = est[keep]
        trunc[r_i, c[keep]] = tr[keep]
        j1[r_i, c[keep]] = jump1[keep]
        j4[r_i, c[keep]] = jump4[keep]
    return Refined(grad, trunc, mask, fine, calls, ratio, (j1, j4))
