"""Batch invariance of every op: every output and every input gradient of a
row alone vs inside batches of other sizes, bitwise; and every output and every gradient
(the parameters' too) run to run. The probe rows are the first, middle and last; the batch
sizes fixed (:func:`batch_sizes`); the rows that fill a batch are fresh random rows of
every input and cotangent, drawn from the seed alone.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from gradcheck_bi.checks._measure import BitwiseLog
from gradcheck_bi.checks.rows.point import make_point
from gradcheck_bi.kernels.calling.opcall import op_grads
from gradcheck_bi.vocab import Config, Measurement

Tensors = dict[str, torch.Tensor]
# Batch sizes a probe row is placed into, capped so a batch stays under this many elements.
BATCH_SIZES = (3, 8, 64, 512, 4096)
MAX_BATCH_ELEMENTS = 1 << 22


def batch_sizes(n_cols: int) -> list[int]:
    """The batch sizes a probe row is placed in: fixed, capped by ``MAX_BATCH_ELEMENTS``."""
    return [b for b in BATCH_SIZES if b * n_cols <= MAX_BATCH_ELEMENTS] or [2]


@functools.lru_cache(maxsize=4)
def _fillers(seed: int, n_cols: int, scale: float, names: tuple[str, ...],
             scaled: tuple[str, ...]) -> list[dict[str, torch.Tensor]]:
    """Per batch size, fp64 CPU rows for every name (inputs and cotangents); those not
    ``scaled`` (a gate, the cotangents) unscaled."""
    gen = torch.Generator().manual_seed(seed + 1)
    out = []
    for size in batch_sizes(n_cols):
        rows = {}
        for n in names:
            t = torch.randn(size, n_cols, generator=gen, dtype=torch.float64)
            rows[n] = t * scale if n in scaled else t
        out.append(rows)
    return out


def check_op_batch_invariance(fn: Any, cfg: Config) -> Measurement:
    """Bitwise: rows alone vs in the checked shape and in batches; run to run."""
    point = make_point(cfg)
    d = cfg.shape[-1]
    ins = {n: t.reshape(-1, d) for n, t in point.inputs.items()}
    cots = {n: t.reshape(-1, t.shape[-1]) for n, t in point.cotangents.items()}
    lead = ins[point.op.inputs[0]]
    n_rows = lead.shape[0]
    probes = sorted({0, n_rows // 2, n_rows - 1})
    log = BitwiseLog()
    compare = log.compare

    def run(i: Tensors, c: Tensors) -> tuple[Tensors, Tensors]:
        log.settle()  # what the kernel returned before, compared before it runs again
        return op_grads(fn, i, point.params, c, point.options, point.zcg)

    def rows(ts: Tensors) -> Tensors:
        return {n: t.reshape(-1, t.shape[-1]) for n, t in ts.items()}

    # At the point's own shape (a 2-D view of a 3-D x would be one more shape to compile for)
    outs, grads = (rows(t) for t in run(point.inputs, point.cotangents))
    again = tuple(rows(t) for t in run(point.inputs, point.cotangents))
    for name, t in {**outs, **{f"d{n}": g for n, g in grads.items()}}.items():
        other = again[0].get(name) if name in outs else again[1][name[1:]]
        if other is not None:
            compare(f"{name} run to run", t, other, 0)
    rowwise = {**outs, **{f"d{n}": grads[n] for n in ins}}
    alone = {}
    for p in probes:
        o1, g1 = run({n: t[p:p + 1] for n, t in ins.items()},
                     {n: t[p:p + 1] for n, t in cots.items()})
        alone[p] = {**o1, **{f"d{n}": g1[n] for n in ins}}
        for name, t in alone[p].items():
            compare(f"{name} row {p} alone vs in shape {cfg.shape}", t[0], rowwise[name][p], p)
    names = tuple(ins) + tuple(cots)
    scaled = tuple(n for n in ins if n not in point.op.unscaled)
    for size, fill in zip(batch_sizes(d), _fillers(cfg.seed, d, cfg.input_scale, names,
                                                   scaled), strict=True):
        positions = [size - 1, size // 2, 0][: len(probes)]
        widths = {n: t.shape[-1] for n, t in {**ins, **cots}.items()}
        batch = {n: fill[n][:, :widths[n]].to(lead.device, lead.dtype, copy=True)
                 for n in names}
        for p, at in zip(probes, positions, strict=True):
            for n in ins:
                batch[n][at] = ins[n][p]
            for n in cots:
                batch[n][at] = cots[n][p]
        ob, gb = run({n: batch[n] for n in ins}, {n: batch[n] for n in cots})
        inside = {**ob, **{f"d{n}": gb[n] for n in ins}}
        for p, at in zip(probes, positions, strict=True):
            for name, t in alone[p].items():
                compare(f"{name} row {p} alone vs at {at} in a batch of {size}", t[0],
                        inside[name][at], p)
    return log.measurement({"batch_sizes": batch_sizes(d), "probe_rows": probes,
                            "compared": sorted(rowwise)})
