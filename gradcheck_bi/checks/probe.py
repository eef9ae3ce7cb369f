"""The probe: does a kernel refuse a device or dtype before the run measures it there?

One forward runs once per (kernel, device, dtype): an explicit refusal there
(:func:`gradcheck_bi.kernels.calling.refusal.refusal`) makes every result of that target
``unsupported`` without running it. A crash there decides nothing — each point then runs
and reports its own exception, classified the same way.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from gradcheck_bi.checks.rows.point import make_point
from gradcheck_bi.checks.shaped import forward as shaped_forward
from gradcheck_bi.checks.shaped import make_point as make_shaped_point
from gradcheck_bi.kernels.adapting.asop import as_op_kernel
from gradcheck_bi.kernels.calling import phase
from gradcheck_bi.kernels.calling.refusal import refusal
from gradcheck_bi.kernels.calling.trace import stops_the_run
from gradcheck_bi.ops import ROWS, SHAPED
from gradcheck_bi.vocab import Config, KernelSpec, Unsupported

__all__ = ["probe", "refusal"]


def probe(spec: KernelSpec, device: str, dtype: str, at: Config | None = None) -> str | None:
    """Why the kernel refuses this device/dtype (every result ``unsupported``), else ``None``.

    One forward at the shape (and group size) of the point ``at`` — the first the run
    measures there, so the probe feeds the kernel no shape the run would not — or, without
    one, at ``(2, 8)``. Only a refusal counts: a forward that crashes returns ``None``, so
    that each point runs and reports its own ``error``.
    """
    if device == "cuda" and not torch.cuda.is_available():
        return "--device cuda asked for, but no CUDA GPU is visible here"
    try:
        if spec.op in SHAPED:
            shaped = make_shaped_point(replace(at or Config(check="forward", op=spec.op,
                                                            shape=SHAPED[spec.op].default_shape),
                                               device=device, dtype=dtype, check="forward"))
            phase.now("forward (probe)")
            shaped_forward(spec.fn, shaped)
            return None
        options = ROWS[spec.op].point_options  # the op's options that are point fields
        if at is None:  # each option at the value a point leaves unset, resolved at D = 8
            at = Config(check="forward", shape=(2, 8), op=spec.op,
                        **{a.field: a.unset_at(8) for a in options})
        cfg = Config(check="forward", device=device, dtype=dtype, shape=at.shape, op=spec.op,
                     bias=at.bias, **{a.field: getattr(at, a.field) for a in options})
        phase.now("forward (probe)")
        with torch.no_grad():
            p = make_point(cfg)  # zcg off, unless only on is run
            as_op_kernel(spec.fn).call(p.inputs, p.params, p.options, min(spec.zcg))
    except Unsupported as exc:  # e.g. a user kernel whose module could not be imported here
        return str(exc)
    except BaseException as exc:  # a kernel may raise anything; only a refusal decides here
        if stops_the_run(exc):
            raise
        why = refusal(exc)
        return None if why is None else f"kernel refuses {device}/{dtype}: {why}"
    return None
