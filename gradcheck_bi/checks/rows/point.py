"""The data of one point of any op: inputs, parameters, cotangents, options.

``x``, the stored weight and ``y``'s cotangent are the RMSNorm draws of the point
(:func:`gradcheck_bi.inputs.make_inputs`: same seed, same bits), so a fused add, a layer norm
and an RMSNorm at one point see one ``x``. The rest — a second input (two draws: an op may
pin its input to either, ``Op.stream``), the cotangent of a second output and β — come from
a second stream of the same seed, drawn in one fixed order whatever the op, in fp64 and only
then cast. A second input is scaled by the point's input scale like ``x``, unless its op
says not (``Op.unscaled``: a gate is not a signal). β: randn or zeros (its control).

Also here, in fp64: the op's reference at the point (:func:`reference`) and its exact
gradients by torch.autograd through that reference (:func:`exact_grads`) — what the
rounding model (:mod:`gradcheck_bi.tolerance.rows`) scales, never what a gradient is
compared with.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from gradcheck_bi import lowp
from gradcheck_bi.inputs import make_inputs, placed
from gradcheck_bi.kernels.calling.opcall import op_forward
from gradcheck_bi.ops import ROWS, Op
from gradcheck_bi.ops.record import ZCG
from gradcheck_bi.vocab import Config

Tensors = dict[str, torch.Tensor]
EXTRA_STREAM = 0x5EED0F  # added to the seed: the extras' own generator


@dataclass
class OpPoint:
    """One point: tensors as the kernel gets them, the effective parameters in fp64."""

    op: Op
    inputs: Tensors  # shaped like x, in the point's dtype and device
    params: Tensors  # stored (weight = γ − 1 under zcg)
    cotangents: Tensors  # one per output
    options: dict[str, Any]
    zcg: bool

    @property
    def effective(self) -> Tensors:
        """The parameters as the op uses them, fp64: γ = stored (+ 1 under zcg), β."""
        out = {n: t.to(torch.float64) for n, t in self.params.items()}
        gamma = self.op.offset_param
        if self.zcg and gamma is not None and gamma.name in out:
            out[gamma.name] = out[gamma.name] + 1.0
        return out

    @property
    def lead(self) -> torch.Tensor:
        """The op's first input (``x``): its shape, dtype and device are the point's."""
        return self.inputs[self.op.inputs[0]]

    @property
    def inputs64(self) -> Tensors:
        return {n: t.to(torch.float64) for n, t in self.inputs.items()}


@functools.lru_cache(maxsize=4)
def _extras(seed: int, shape: tuple[int, ...]) -> tuple[torch.Tensor, ...]:
    """``(second input, another second input, cotangent of a second output, β)``, unscaled
    fp64, one fixed order."""
    gen = torch.Generator().manual_seed(seed + EXTRA_STREAM)
    n = math.prod(shape)
    drawn = [torch.randn(n, generator=gen, dtype=torch.float64).view(shape) for _ in range(3)]
    return (*drawn, torch.randn(shape[-1], generator=gen, dtype=torch.float64))


def options_of(cfg: Config) -> dict[str, Any]:
    """The op's options at the point: ``eps``; those its record declares as point fields
    (:attr:`~gradcheck_bi.ops.record.Op.point_options`, each at its ``unset`` value where
    the point has none); its own options (:attr:`~gradcheck_bi.ops.record.Op.axes`), from
    ``cfg.variant``."""
    op = ROWS[cfg.op]
    options: dict[str, Any] = {"eps": cfg.eps, **op.defaults(), **dict(cfg.variant)}
    for axis in op.point_options:
        value = getattr(cfg, axis.field)
        options[axis.field] = axis.unset if value is None else value
    return options


def make_point(cfg: Config) -> OpPoint:
    """The point's tensors; fresh copies every call (a kernel cannot reach the draw)."""
    op = ROWS[cfg.op]
    x, w, g = make_inputs(cfg)
    *streams, g_res, beta = _extras(cfg.seed, tuple(cfg.shape))
    dt, dev = cfg.torch_dtype, torch.device(cfg.device)
    # The first input is x; each other takes the stream its op pins it to (Op.stream), else
    # the next one left; an unscaled one (a gate) is not scaled.
    left = [i for i in range(len(streams)) if i not in op.stream.values()]
    inputs = {op.inputs[0]: x}
    for n in op.inputs[1:]:
        t = streams[op.stream[n] if n in op.stream else left.pop(0)]
        inputs[n] = placed(t, None if n in op.unscaled else cfg.input_scale, dt, dev)
    params = {}
    for p in op.params:
        if p.offset:  # γ: the RMSNorm draw, its control and mode applied (make_inputs)
            params[p.name] = w
        elif p.added_last:  # β: randn or zeros, by its control; an optional one left unset
            control = getattr(cfg, p.control.field)
            if not (p.optional and control is None):
                b = beta if control in (None, "randn") else torch.zeros_like(beta)
                params[p.name] = b.to(dev, dt)
        else:  # an op record's mistake, not the user's
            raise ValueError(f"{op.name}: parameter {p.name} is neither stored with an offset "
                             "(γ) nor added last (β): the row ops' point draws no other")
    drawn = [g] + [placed(g_res, None, dt, dev)] * (len(op.outputs) > 1)
    cots = dict(zip(op.outputs, drawn, strict=False))
    # γ stored as γ − 1: the point's field for γ's mode (its record's, ops.record.ZCG)
    return OpPoint(op, inputs, params, cots, options_of(cfg), getattr(cfg, ZCG.field))


def reference(point: OpPoint) -> Tensors:
    """The op's fp64 outputs at the point."""
    return point.op.reference(point.inputs64, point.effective, point.options)


def exact_grads(point: OpPoint, outputs: tuple[str, ...] | None = None) -> Tensors:
    """``dL/d(every input and parameter)`` in fp64 by autograd through the reference, for
    the cotangents of ``outputs`` (default: every output of the op)."""
    names = outputs if outputs is not None else point.op.outputs
    leaves = {n: t.detach().clone().requires_grad_(True)
              for n, t in {**point.inputs64, **point.effective}.items()}
    with torch.enable_grad():
        outs = point.op.reference({n: leaves[n] for n in point.inputs},
                                  {n: leaves[n] for n in point.params}, point.options)
        loss = torch.stack([(outs[n] * point.cotangents[n].to(torch.float64)).sum()
                            for n in names]).sum()
        grads = torch.autograd.grad(loss, list(leaves.values()), allow_unused=True)
    return {n: (g if g is not None else torch.zeros_like(leaves[n])).detach()
            for n, g in zip(leaves, grads, strict=True)}


class ExactGrads(Mapping[str, torch.Tensor]):
    """:func:`exact_grads` of a point for every output, computed when first read: the
    rounding model of an op that does not read them (RMSNorm's, from the inputs alone)
    costs no autograd pass through the reference."""

    def __init__(self, point: OpPoint) -> None:
        self._point = point
        self._grads: Tensors | None = None

    def _all(self) -> Tensors:
        if self._grads is None:
            self._grads = exact_grads(self._point)
        return self._grads

    def __getitem__(self, name: str) -> torch.Tensor:
        return self._all()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())


def lifted_point(point: OpPoint, dtype: torch.dtype) -> OpPoint:
    """The same point in ``dtype`` (an exact upcast of every tensor)."""
    def up(ts: Tensors) -> Tensors:
        return {n: t.to(dtype) for n, t in ts.items()}

    return OpPoint(point.op, up(point.inputs), up(point.params), up(point.cotangents),
                   point.options, point.zcg)


def stored(point: OpPoint) -> OpPoint:
    """The point as a kernel that stores an intermediate sees it (``Op.stored``: the fused
    add's ``x := round(x + residual)``, ``residual := 0``), each input correctly rounded to
    the point's dtype."""
    assert point.op.stored is not None
    dtype = point.lead.dtype
    ins = {n: lowp.round_to(t, dtype)
           for n, t in point.op.stored.inputs(point.inputs64).items()}
    return OpPoint(point.op, ins, point.params, point.cotangents, point.options, point.zcg)


def returns_y_alone(point: OpPoint, returned: list[str]) -> dict[str, Any]:
    """``{"note": …}`` where the op has an output the kernel did not return."""
    missing = [o for o in point.op.outputs if o not in returned]
    if missing:
        return {"note": f"the kernel returns {', '.join(returned)} alone: no "
                        f"{', '.join(missing)} to check"}
    return {}


def input_forward(fn: Any, point: OpPoint, name: str, returned: list[str]
                   ) -> Callable[[torch.Tensor], list[torch.Tensor]]:
    """The op's outputs as a function of input ``name`` alone: at the point's own shape, or
    as ``(N, D)`` rows (the perturbed copies, then padding), row ``i`` holding the other
    inputs' row ``i mod R``."""
    d = point.lead.shape[-1]
    others = {n: t.reshape(-1, d) for n, t in point.inputs.items() if n != name}
    n_rows = point.lead.numel() // d

    tiled: dict[int, dict[str, torch.Tensor]] = {}  # the other inputs at N rows, made once

    def forward(t2: torch.Tensor) -> list[torch.Tensor]:
        if t2.shape == point.inputs[name].shape:
            ins = {**point.inputs, name: t2}
        else:
            k, n = -(-t2.shape[0] // n_rows), t2.shape[0]
            if n not in tiled:
                tiled[n] = {n_: o.repeat(k, 1)[:n] for n_, o in others.items()}
            ins = {name: t2, **tiled[n]}
        outs = op_forward(fn, ins, point.params, point.options, point.zcg)
        if list(outs) != returned:
            raise ValueError(f"forward returned {list(outs)} here, {returned} before")
        return [outs[o] for o in returned]

    return forward
