"""Shards: a deterministic 1/N of a run's points, balanced by estimated cost.

``gradcheck-bi run --shard K/N`` measures shard K of N; ``gradcheck-bi merge`` puts the
shards' JSON reports back together into the report the unsharded run writes. The machines
are the user's scheduler's (a CI matrix, a Slurm array): gradcheck-bi only splits and
merges. Every shard computes the same grid from the same arguments, so the split needs no
coordination: the points are dealt out by :func:`assign` from their costs alone.

The cost model counts forward-call work, ``rows × D`` elements per call:

* an input's gradient (``dx``, and every ``d<input>`` of the op's record:
  ``dresidual``, ``dz``, ...; every gradient of an op of any shape: ``da``, ``dA``,
  ``dlogits``, ...): the row-coloured differences call the forward once per
  stencil point and column chunk, about ``4 · D`` calls (:mod:`gradcheck_bi.fd.coloured`);
  with ``--mode directional`` a handful;
* a parameter's gradient (``dw``, ``dbias``), forward: a handful of calls;
* batch_invariance: rows alone and in batches of several sizes: a few dozen calls.

>>> from gradcheck_bi.vocab import Config
>>> points = [Config(check=c, shape=(4, 256)) for c in ("dx", "dw", "forward", "dx")]
>>> assign(points, 2)  # the two dx points apart, the cheap ones filling in
[0, 0, 1, 1]
>>> parse_shard("2/3")
(2, 3)
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import replace

from gradcheck_bi.ops import ROWS, SHAPED
from gradcheck_bi.vocab import Config

# Forward calls per point; an input's gradient: × D in full mode.
INPUT_CALLS = 4.0
CALLS = {"dw": 8.0, "forward": 3.0, "batch_invariance": 40.0}


class ShardError(ValueError):
    """A --shard value or a set of shard reports that cannot be used (exit 2)."""


def parse_shard(text: str) -> tuple[int, int]:
    """``"K/N"`` → ``(K, N)`` with ``1 <= K <= N``."""
    k_text, sep, n_text = text.partition("/")
    try:
        k, n = int(k_text), int(n_text)
    except ValueError:
        k = n = 0
    if not sep or n < 1 or not 1 <= k <= n:
        raise ShardError(f"--shard {text!r}: expected K/N with 1 <= K <= N, e.g. 2/3")
    return k, n


def cost(cfg: Config) -> float:
    """Estimated work of one point (relative units: forward-call elements)."""
    elements = float(math.prod(cfg.shape))
    if cfg.check in _input_checks(cfg.op):
        calls = INPUT_CALLS * (cfg.shape[-1] if cfg.mode == "full" else 1)
    else:
        calls = CALLS.get(cfg.check, 8.0)
    return calls * elements


def _input_checks(op: str) -> set[str]:
    """The checks whose finite differences perturb an input column by column (``dx``,
    ``dresidual``, ...; every gradient check of an op of any shape: ``da``, ``dA``,
    ``dlogits``, ...); ``dx`` for an op no record names."""
    record = ROWS.get(op)
    if record is not None:
        return {f"d{name}" for name in record.inputs}
    shaped = SHAPED.get(op)
    return set(shaped.gradient_checks) if shaped is not None else {"dx"}


def twin_groups(points: Sequence[Config], kernels: Sequence[str] | None = None) -> list[int]:
    """Each point's group: a layout point's is its contiguous twin's — the same kernel
    (``kernels``, by point) and point at ``contiguous``, earlier in the run — for the twin
    judges it where both run in one process (:mod:`gradcheck_bi.checks.twins`), and a shard
    must say what the unsharded run says; every other point is a group of its own."""
    names = list(kernels) if kernels is not None else [""] * len(points)
    first: dict[tuple[str, Config], int] = {}
    group = []
    for i, (name, cfg) in enumerate(zip(names, points, strict=True)):
        if cfg.layout == "contiguous":
            first.setdefault((name, cfg), i)
            group.append(i)
        else:
            group.append(first.get((name, replace(cfg, layout="contiguous")), i))
    return group


def assign(points: Sequence[Config], n: int, kernels: Sequence[str] | None = None
           ) -> list[int]:
    """The shard (0-based) of each point: the longest group (:func:`twin_groups`) first,
    each to the least loaded shard (ties to the lowest shard), so that every shard gets
    about 1/N of the work."""
    group = twin_groups(points, kernels)
    costs: dict[int, float] = {}
    for i, g in enumerate(group):
        costs[g] = costs.get(g, 0.0) + cost(points[i])
    loads = [(0.0, s) for s in range(n)]
    owner: dict[int, int] = {}
    for g in sorted(costs, key=lambda g: (-costs[g], g)):
        load, shard = heapq.heappop(loads)
        owner[g] = shard
        heapq.heappush(loads, (load + costs[g], shard))
    return [owner[g] for g in group]


def select(points: Sequence[Config], k: int, n: int,
           kernels: Sequence[str] | None = None) -> list[int]:
    """Indices (in run order) of the points shard ``k`` of ``n`` measures (1-based ``k``)."""
    return [i for i, owner in enumerate(assign(points, n, kernels)) if owner == k - 1]
