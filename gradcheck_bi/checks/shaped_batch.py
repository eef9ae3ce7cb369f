"""Bitwise comparisons of a shaped kernel's calls: batch invariance over the op's batch axis,
and a layout point against its contiguous twin.

* ``batch_invariance``: over the op's batch axis, the first and last rows of every output
  and of the gradients that carry the axis, alone and inside batches of other sizes,
  bitwise; and run to run, everything bitwise.
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
            if not bits(v, again[part][k]):
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
                if not bits(mine, theirs):
                    differ.append(f"{k} row {row} differs {label} vs in {n} rows"
                                  f"{tail(mine, theirs)}")
            for k in carried:
                mine = _rows(base[1][k], role_axes[k], axis, torch.tensor([row]))
                theirs = _rows(got[1][k], role_axes[k], axis, torch.tensor([at]))
                if not bits(mine, theirs):
                    differ.append(f"d{k} row {row} differs {label} vs in {n} rows"
                                  f"{tail(mine, theirs)}")
    passed = not differ
    return Measurement(0.0 if passed else 1.0, 0.0, passed, None,
                       "" if passed else "; ".join(dict.fromkeys(differ)),
                       {"axis": axis, "variant": point.variant.label(),
                        "compared": "bitwise"})

