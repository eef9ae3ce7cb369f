"""Central difference stencils: ``f' ≈ Σ_o w_o (f(x + o h) - f(x - o h)) / h``.

Every check evaluates the forward at the offsets ``±o·h`` for ``o`` in ``LEVELS`` — the
stencil's own, their doubles (the same stencil at ``2h``, for Richardson's truncation
estimate) and one more even level for the rounding remainder
(:mod:`gradcheck_bi.tolerance.noise`) — and once unperturbed.

>>> CENTRAL4.points, CENTRAL4.order, LEVELS
(6, 4, (1, 2, 4))
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from gradcheck_bi.tolerance.noise import level_total, truncation, weighted_levels

# Offsets (× h) the forward is evaluated at, on both sides. Covers the stencils below at h
# and at 2h, and the three even levels the noise remainder needs.
LEVELS = (1, 2, 4)


@dataclass(frozen=True)
class Stencil:
    """A central difference: ``f' ≈ Σ_o weights[o] (f(x+o h) - f(x-o h)) / h``."""

    name: str
    offsets: tuple[int, ...]
    weights: tuple[float, ...]
    order: int

    @property
    def points(self) -> int:
        """Perturbed forward evaluations per column: ``±o·h`` for every ``o`` in ``LEVELS``."""
        return 2 * len(LEVELS)

    @property
    def rss_weight(self) -> float:
        """``sqrt(2 Σ w_o²)``: the noise of ``Σ w_o S_o`` in units of one point's noise."""
        return math.sqrt(2 * sum(w * w for w in self.weights))


CENTRAL2 = Stencil("central-2", (1,), (0.5,), 2)
CENTRAL4 = Stencil("central-4", (1, 2), (8 / 12, -1 / 12), 4)
STENCILS = {s.name: s for s in (CENTRAL2, CENTRAL4)}


def level_offsets() -> torch.Tensor:
    """``[+o..., -o...]`` for ``o`` in ``LEVELS``, fp64: the order points are stacked in."""
    return torch.tensor([*LEVELS, *(-o for o in LEVELS)], dtype=torch.float64)


@functools.lru_cache(maxsize=8)
def level_offsets_on(device: torch.device) -> torch.Tensor:
    """:func:`level_offsets` on ``device``, made once and only read: a copy from the host
    per check is, on CUDA, a wait for the device."""
    return level_offsets().to(device)


@functools.lru_cache(maxsize=8)
def level_offsets_in(dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """:func:`level_offsets` in ``dtype`` on ``device`` (small integers: exact in any float
    dtype), made once and only read: ``offsets * h`` is each point's ``o * h``."""
    return level_offsets().to(device=device, dtype=dtype)


def stencil_sum(odd: torch.Tensor, stencil: Stencil, scale: int = 1) -> torch.Tensor:
    """``Σ_j w_j S_{scale·o_j}`` from the odd level sums ``odd[l] = S_{LEVELS[l]}``.

    ``scale = 2`` gives the same stencil at twice the step; divide by ``scale · h``.
    """
    at = {o: i for i, o in enumerate(LEVELS)}
    total = stencil.weights[0] * odd[at[scale * stencil.offsets[0]]]
    for o, w in zip(stencil.offsets[1:], stencil.weights[1:], strict=True):
        total = total + w * odd[at[scale * o]]
    return total


def stencil_estimate(odd: torch.Tensor, stencil: Stencil, h: torch.Tensor | float
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(E(h), T)``: the estimate ``Σ w S_o / h`` (the bits of ``stencil_sum(odd) / h``)
    and its truncation error, from the same stencil at ``2h``
    (:func:`gradcheck_bi.tolerance.noise.truncation`), the stencil at ``h`` taken once for
    both."""
    both = _at_both_steps(odd, stencil)
    if both is None:
        both = torch.stack([stencil_sum(odd, stencil), stencil_sum(odd, stencil, 2)])
    e_h = both[0] / h
    return e_h, truncation(e_h, both[1] / (2 * h), stencil.order)


def _at_both_steps(odd: torch.Tensor, stencil: Stencil) -> torch.Tensor | None:
    """``[Σ w S_o, Σ w S_2o]`` with one op per term for both steps (each element the same
    products and additions, in the same order, as :func:`stencil_sum` at scales 1 and 2):
    where the levels of ``o`` and ``2o`` are neighbours in ``odd`` (``None`` elsewhere)."""
    at = {o: i for i, o in enumerate(LEVELS)}
    first = [at.get(o) for o in stencil.offsets]
    if any(i is None or at.get(2 * o) != i + 1 for o, i in zip(stencil.offsets, first,
                                                              strict=True)):
        return None
    total = None
    for i, w in zip(first, stencil.weights, strict=True):
        assert i is not None
        term = w * odd[i:i + 2]
        total = term if total is None else total + term
    return total


def stencil_var(pairs: torch.Tensor, stencil: Stencil, h: float) -> torch.Tensor:
    """The variance of ``E = Σ w_o S_o / h`` from each level's pair of points' (``pairs[l] =
    v(+o) + v(-o)``, ``v`` a point's variance): ``Σ_o w_o² (v(+o) + v(-o)) / h²``."""
    at = {o: i for i, o in enumerate(LEVELS)}
    squares = [0.0] * len(LEVELS)
    for o, wt in zip(stencil.offsets, stencil.weights, strict=True):
        squares[at[o]] = wt * wt
    terms = weighted_levels(pairs, tuple(squares))
    return level_total(terms, (at[o] for o in stencil.offsets)) / (h * h)


def level_pairs(v: torch.Tensor) -> torch.Tensor:
    """``v(+o) + v(-o)`` per level from the ``(2L, …)`` points (``+o`` levels first)."""
    n = len(LEVELS)
    return v[:n] + v[n:]
