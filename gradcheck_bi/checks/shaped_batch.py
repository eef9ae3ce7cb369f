"""Bitwise comparisons of a shaped kernel's calls: batch invariance over the op's batch axis,
and a layout point against its contiguous twin.

* ``batch_invariance``: over the op's batch axis, the rows of every output and of the
  gradients that carry the axis against the same rows in batches of other sizes, bitwise:
  the first and last alone and in n + 3 rows, and the point's rows in batches of 3 … 1025
  (:data:`BATCH_SIZES`: a kernel that switches at a row count shows from either side), the
  rows that fill a batch drawn fresh (a draw of the op with that many rows, another seed);
  and run to run, everything bitwise.
* a layout point whose every output and gradient has its contiguous twin's bits takes the
  twin's measurement (:mod:`gradcheck_bi.checks.twins`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from gradcheck_bi.checks._measure import tail
from gradcheck_bi.checks.shaped_point import Point, bits, make_point, with_grads
from gradcheck_bi.kernels.calling.shaped_call import ShapedKernel
from gradcheck_bi.ops.shaped import ShapedOp
from gradcheck_bi.vocab import Config, Measurement


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
            if k not in mine or k not in theirs or not bits(mine[k], theirs[k]):
                return f"{'' if part == 0 else 'd'}{k} differs from the contiguous call's"
    return None


# -- batch invariance --------------------------------------------------------------------
# Batch sizes a probe row is placed in besides alone, its point's n rows and n + 3: below
# any block (3), one past the row-block heights and split heuristics real kernels switch at
# (32, 64, 128 rows: a tile's height, a split-K or persistent schedule keyed on M) and past
# 1024 and 4096 (the norms' largest, :mod:`gradcheck_bi.checks.rows.batch`). A row alone
# and in one of these sizes sit on either side of any switch up to 4096 rows.
BATCH_SIZES = (3, 33, 65, 129, 1025)
# A batch's rows hold at most this many elements (inputs, outputs): a size past it is left
# out (the norms' cap).
MAX_BATCH_ELEMENTS = 1 << 22
FILLER_SEED = 7919  # the fillers' draw: the point's seed plus this


def batch_sizes(n: int, row_elements: int) -> list[int]:
    """The sizes a probe row is placed in beyond alone, ``n`` and ``n + 3``: those of
    :data:`BATCH_SIZES` other than these whose rows stay under ``MAX_BATCH_ELEMENTS``."""
    return [b for b in BATCH_SIZES
            if b not in (1, n, n + 3) and b * row_elements <= MAX_BATCH_ELEMENTS]


def _rows(t: torch.Tensor, axes: tuple[str, ...], axis: str, rows: torch.Tensor
          ) -> torch.Tensor:
    return t.index_select(axes.index(axis), rows.to(t.device))


def _shape_for(op: ShapedOp, shape: tuple[int, ...], axis: str, rows: int
               ) -> tuple[int, ...] | None:
    """A shape of the op whose ``axis`` has ``rows`` and every other axis its size at
    ``shape``: ``(rows, *shape[i:])``, the fewest leading dims replaced; ``None`` if none
    (an op whose sizes do not follow its shape)."""
    want = op.sizes(shape)
    names = {a for r in op.roles for a in r.axes} | {a for o in op.outputs for a in o.axes}
    for i in range(1, len(shape)):
        cand = (rows, *shape[i:])
        try:
            got = op.sizes(cand)
        except ValueError:
            continue
        if got.get(axis) == rows and all(got.get(a) == want.get(a) for a in names - {axis}):
            return cand
    return None


def _fillers(point: Point, axis: str, rows: int, shape: tuple[int, ...] | None
             ) -> tuple[list[dict[str, Any]], list[dict[str, torch.Tensor]]]:
    """Fresh rows to fill batches with, at least ``rows`` along ``axis`` in all: the
    canonical tensors and cotangents of one draw of the op at ``shape`` (another seed);
    without one, draws of the point's own shape, seed after seed."""
    draws: list[Point] = []
    have = 0
    while have < rows:
        cfg = replace(point.cfg, seed=point.cfg.seed + FILLER_SEED * (len(draws) + 1),
                      shape=shape or point.cfg.shape)
        draws.append(make_point(cfg))
        have += draws[-1].drawn.sizes[axis]
    return [d.canonical() for d in draws], [d.drawn.cotangents for d in draws]


def check_batch(kernel: ShapedKernel, point: Point) -> Measurement:
    """Rows 0 and n − 1 alone and in n + 3 rows (fresh rows after the point's), and the
    point's rows in each of :func:`batch_sizes` (its first rows, fresh rows, its last row
    at the batch's end: the tail), against in its own n rows, bitwise; and the n rows run
    to run."""
    op, options = point.op, point.drawn.options
    axis = op.batch_axis(dict(point.variant.values))
    if axis is None:
        raise ValueError(f"{op.name} has no batch axis at {point.variant.label()}")
    canon = point.canonical()
    n = point.drawn.sizes[axis]
    outs_at = op.outputs_at(dict(point.variant.values))
    out_axes = {o.name: o.axes for o in outs_at}
    role_axes = {r.name: r.axes for r in op.roles}
    batched = [r.name for r in op.roles if axis in r.axes and canon.get(r.name) is not None]
    row_elements = (sum(canon[k].numel() for k in batched)
                    + sum(point.drawn.cotangents[k].numel() for k in out_axes
                          if axis in out_axes[k])) // max(n, 1)
    probes = sorted({0, n - 1})
    sizes = batch_sizes(n, row_elements)

    def needed() -> int:  # filler rows: n + 3's three, each size's beyond the point's
        return max([3, *(b - min(n, b) for b in sizes)])

    shape = _shape_for(op, point.cfg.shape, axis, needed())
    if shape is None:  # filled by whole draws of the point: as many as the cap holds
        per_draw = sum(v.numel() for v in (*point.drawn.tensors.values(),
                                           *point.drawn.cotangents.values())
                       if isinstance(v, torch.Tensor))
        sizes = [b for b in sizes if -(-b // n) * per_draw <= MAX_BATCH_ELEMENTS]
    fill_c, fill_g = _fillers(point, axis, needed(), shape)
    # a batch: (source, rows) segments, source -1 the point, j the j-th filler draw
    Segments = list[tuple[int, torch.Tensor]]

    def fresh(count: int) -> Segments:
        """``count`` filler rows, draw after draw."""
        out: Segments = []
        for j, c in enumerate(fill_c):
            if count <= 0:
                break
            take = min(count, c[batched[0]].shape[role_axes[batched[0]].index(axis)])
            out.append((j, torch.arange(take)))
            count -= take
        return out

    def sub(segments: Segments) -> tuple[dict[str, Any], dict[str, Any]]:
        tensors: dict[str, Any] = {}
        for r in op.roles:
            if r.name not in batched:
                tensors[r.name] = point.drawn.tensors.get(r.name)
                continue
            part = torch.cat([_rows(canon[r.name] if j < 0 else fill_c[j][r.name], r.axes,
                                    axis, rows) for j, rows in segments],
                             dim=r.axes.index(axis))
            like = point.drawn.tensors[r.name]
            assert like is not None
            tensors[r.name] = op.restore(r.name, part, like, options)
        gs = {}
        for o in outs_at:
            gv = point.drawn.cotangents[o.name]
            if axis in o.axes:
                gv = torch.cat([_rows(gv if j < 0 else fill_g[j][o.name], o.axes, axis, rows)
                                for j, rows in segments], dim=o.axes.index(axis))
            gs[o.name] = gv
        return tensors, gs

    carried = [k for k in batched if op.role(k).differentiable]
    differ: list[str] = []
    everything: Segments = [(-1, torch.arange(n))]
    base = with_grads(kernel, point, *sub(everything))
    again = with_grads(kernel, point, *sub(everything))
    for part in (0, 1):
        for k, v in base[part].items():
            if not bits(v, again[part][k]):
                differ.append(f"{'' if part == 0 else 'd'}{k} differs run to run")

    def compare(got: tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]],
                rows: list[int], at: list[int], label: str) -> None:
        """The point's ``rows`` in ``got`` (at ``at``) against in its n rows: per output
        and gradient, the first row that differs, and how many."""
        for part, names, axes in ((0, [k for k in base[0] if axis in out_axes[k]], out_axes),
                                  (1, carried, role_axes)):
            for k in names:
                dim = axes[k].index(axis)
                mine = _rows(base[part][k], axes[k], axis, torch.tensor(rows)).movedim(dim, 0)
                theirs = _rows(got[part][k], axes[k], axis, torch.tensor(at)).movedim(dim, 0)
                same = (mine == theirs) | (mine.isnan() & theirs.isnan())
                bad = (~same.reshape(len(rows), -1).all(1)).nonzero().reshape(-1).tolist()
                if bad:
                    more = f" (and {len(bad) - 1} more of its {len(rows)} rows)" \
                        if len(bad) > 1 else ""
                    differ.append(f"{'' if part == 0 else 'd'}{k} row {rows[bad[0]]} differs "
                                  f"{label} vs in {n} rows{more}"
                                  + tail(mine[bad[0]], theirs[bad[0]]))

    bigger = with_grads(kernel, point, *sub(everything + fresh(3)))
    for row in probes:
        alone = with_grads(kernel, point, *sub([(-1, torch.tensor([row]))]))
        compare(alone, [row], [0], "alone")
        compare(bigger, [row], [row], f"in {n + 3} rows")
    for size in sizes:
        # the point's first rows, fresh rows, its last row at the batch's end (its tail)
        head = list(range(min(n, size) - 1))
        got = with_grads(kernel, point, *sub([(-1, torch.tensor(head, dtype=torch.long)),
                                              *fresh(size - len(head) - 1),
                                              (-1, torch.tensor([n - 1]))]))
        compare(got, [*head, n - 1], [*head, size - 1], f"in {size} rows")
    passed = not differ
    return Measurement(0.0 if passed else 1.0, 0.0, passed, None,
                       "" if passed else "; ".join(dict.fromkeys(differ)),
                       {"axis": axis, "variant": point.variant.label(),
                        "compared": "bitwise",
                        "batch_sizes": sorted({1, n, n + 3, *sizes})})
