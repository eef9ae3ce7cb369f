"""Finite differences planned from an op's axes: colours, sampled colours, directions.

An input role's canonical axes split in two for each output (:mod:`gradcheck_bi.ops.
shaped`): the **shared** axes (in every output, not coupled) and the **colour** axes (the
rest: contracted, or along which the effect spreads). Elements that differ only in their
shared indices reach disjoint output elements, so one perturbation moves all of them at
once: a *colour* is one flat colour index per shared index, and ``Π colour sizes`` colours
give every element. Where that is more forward calls than :data:`FULL_COLOURS` (a
cross-entropy's classes at V = 128k, every element of a scalar loss), a sample of colours
holds the risky ones the op names plus :data:`RANDOM_COLOURS` random ones (at least
:data:`MIN_SAMPLED`, at most :data:`SAMPLED_COLOURS` in all), and random directions over
the whole tensor check what no colour held (``checks.shaped.directions``). Each colour
costs four forward calls, six where its truncation is needed (``checks.shaped.
lazy_truncation``): at (512, 32000) a cross-entropy's forward is 0.12 CPU s, so a colour
that only adds one more random element is what a sample leaves out.

Per colour the forward runs at ``x ± o·h`` for ``o`` in :data:`LEVELS`; ``h`` is a power of
two times the tensor's RMS (:func:`step`), and every element's *taken* displacement is
what divides (``fl(x + o h) - x``, exact in fp64). With ``S_o = Σ_i g_i (y_i(+o) − y_i(−o))``
over the outputs an element reaches, ``E_o = S_o / D_o`` is a second-order estimate;
``E4(h) = (4E_1 − E_2)/3`` the fourth-order one, and Richardson's ``|E4(2h) − E4(h)| / 15``
its truncation (level 4 only where a tolerance without it leaves the judgement open).

>>> import torch
>>> shared_and_colour(("n", "v"), [("n",)], ())
(('n',), ('v',))
>>> shared_and_colour(("o", "k"), [("n", "o")], ())
(('o',), ('k',))
>>> shared_and_colour(("n", "v"), [()], ())
((), ('n', 'v'))
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

LEVELS = (1, 2, 4)
# The most colours checked element by element before a check samples.
FULL_COLOURS = 4096
SAMPLED_COLOURS = 64  # the most a sample holds (an op's risky colours first)
RANDOM_COLOURS = 6  # random colours beside the risky ones
MIN_SAMPLED = 16
DIRECTIONS = 8
# Step relative to a tensor's RMS, by dtype: about u^(1/5) for the fourth-order estimate.
STEP = {torch.float64: 2.0**-10, torch.float32: 2.0**-5}


def shared_and_colour(axes: tuple[str, ...], outputs: Sequence[tuple[str, ...]],
                      coupled: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The role's axes that every output shares (and no statistic couples), and the rest."""
    shared = tuple(a for a in axes if a not in coupled and all(a in o for o in outputs))
    return shared, tuple(a for a in axes if a not in shared)


def step(t: torch.Tensor, dtype: torch.dtype, bend: float | None = None) -> float:
    """``2^round(log2 L) · STEP[dtype]`` (a power of two: ``x ± o h`` rounds rarely), ``L``
    the tensor's RMS, or ``bend`` where smaller: the length over which the op's outputs bend
    along it (silu's ``1 / m_g``), whatever the inputs' scale."""
    rms = float(t.double().pow(2).mean().sqrt()) if t.numel() else 1.0
    if bend is not None and bend > 0 and not rms <= bend:
        rms = bend
    scale = 2.0 ** round(math.log2(rms)) if rms > 0 and math.isfinite(rms) else 1.0
    return scale * STEP.get(dtype, 2.0**-5)


@dataclass(frozen=True)
class Colours:
    """The colours of one check: ``picks[c]`` holds, per shared index (shaped like the
    shared axes), the flat colour index perturbed in colour ``c``; ``full``: every element
    is in some colour."""

    picks: list[torch.Tensor]
    full: bool
    total: int  # colours there are


def plan(shared_sizes: tuple[int, ...], colour_sizes: tuple[int, ...],
         risky: list[torch.Tensor], gen: torch.Generator, limit: int = FULL_COLOURS,
         sampled: int = SAMPLED_COLOURS) -> Colours:
    """Every colour when there are at most ``limit``, else the ``risky`` picks (at most
    ``sampled``) and :data:`RANDOM_COLOURS` random ones — at least :data:`MIN_SAMPLED` in
    all, at most ``sampled`` (each pick a flat colour index per shared index)."""
    total = math.prod(colour_sizes)
    if total <= limit:
        return Colours([torch.full(shared_sizes, c, dtype=torch.long) for c in range(total)],
                       True, total)
    picks = [r.long().reshape(shared_sizes) % total for r in risky][:sampled]
    wanted = min(sampled, max(MIN_SAMPLED, len(picks) + RANDOM_COLOURS))
    while len(picks) < wanted:
        picks.append(torch.randint(0, total, shared_sizes, generator=gen))
    return Colours(picks, False, total)


def index_of(pick: torch.Tensor, shared_sizes: tuple[int, ...],
             colour_sizes: tuple[int, ...]) -> tuple[torch.Tensor, ...]:
    """The advanced index (shared axes first, colour axes after) of a colour's elements."""
    grids = torch.meshgrid(*(torch.arange(s) for s in shared_sizes), indexing="ij") \
        if shared_sizes else ()
    flat = pick.reshape(shared_sizes)
    colour = torch.unravel_index(flat, colour_sizes) if colour_sizes else ()
    return (*grids, *colour)


def combine(e: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """``(E4(h), truncation)`` from the second-order estimates at the levels 1, 2, 4."""
    e4_h = (4 * e[0] - e[1]) / 3
    e4_2h = (4 * e[1] - e[2]) / 3
    return e4_h, (e4_2h - e4_h).abs() / 15


def noise_weight(d: list[torch.Tensor]) -> torch.Tensor:
    """``Var E4(h) / Var S`` for the taken displacements ``D_1, D_2`` (``S``: one level's
    difference sum, whose variance is twice one point's)."""
    return 2 * ((4 / 3) ** 2 / d[0] ** 2 + (1 / 3) ** 2 / d[1] ** 2)
