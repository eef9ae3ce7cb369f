"""The checks: forward, every gradient, batch_invariance → a measured error and its tolerance.

Each check takes a kernel and one :class:`~gradcheck_bi.vocab.Config` — op, device, dtype,
shape, eps, seed, γ control and its zero-centred mode — and returns a
:class:`~gradcheck_bi.vocab.Measurement`: the max abs error, the tolerance it is held to,
where the worst element is, and what produced the number (reference, stencil, step, noise
floor). One engine for every op whose inputs share rows (:mod:`.rows`, its record an
:class:`~gradcheck_bi.ops.record.Op`), one for every other op (:mod:`.shaped`), each
driven by the op's record (:mod:`gradcheck_bi.ops`); an RMSNorm kernel with Megatron's
``apply`` is called through the same path
(:func:`gradcheck_bi.kernels.adapting.asop.as_op_kernel`).

* ``forward`` — every output against the op's fp64 reference;
* ``d<input>`` / ``d<parameter>`` (dx, dw, …) — the analytic backward against central
  differences of the kernel's own forward (``--mode directional``: random projections);
* ``batch_invariance`` — bitwise, alone vs. in batches, and run to run.

Which of a config's settings act on each check's tolerance: :data:`TOLERANCE_SETTINGS`.
"""

from __future__ import annotations

from typing import Any

import torch

from gradcheck_bi.checks.rows import run_op_check
from gradcheck_bi.checks.rows.batch import batch_sizes
from gradcheck_bi.checks.shaped import run_shaped_check
from gradcheck_bi.kernels.adapting.asop import as_op_kernel
from gradcheck_bi.ops import ROWS, SHAPED
from gradcheck_bi.vocab import Config, Measurement, Unsupported

# The Config fields that set each check's tolerance (or what it is compared with): a
# result carries them (gradcheck_bi.point.public) and a baseline keys on them, so that a
# run with another atol, mode or stencil is not taken for the recorded one. dw always checks
# every element with its own fixed step (fd.step).
TOLERANCE_SETTINGS: dict[str, tuple[str, ...]] = {
    "forward": ("atol", "rtol"),
    "dx": ("atol", "rtol", "mode", "stencil", "step_rel"),
    "dw": ("atol", "rtol", "stencil"),
    "batch_invariance": (),  # bitwise: nothing loosens it
}
# Every op's other gradients as RMSNorm's: an input's (every element or, with --mode
# directional, projections) at a relative step; a parameter's, every element at a fixed one.
for _op in ROWS.values():
    for _name, _t in _op.gradient_checks.items():
        TOLERANCE_SETTINGS.setdefault(_name, TOLERANCE_SETTINGS["dx"] if _t in _op.inputs
                                      else TOLERANCE_SETTINGS["dw"])
# An op of any shape derives every tolerance from its reference: no setting loosens it.
for _shaped in SHAPED.values():
    for _name in _shaped.checks:
        TOLERANCE_SETTINGS.setdefault(_name, ())


def tolerance_settings(check: str) -> tuple[str, ...]:
    """The settings that act on ``check``'s tolerance (:data:`TOLERANCE_SETTINGS`); none
    for a check named only at run time (a generic op's ``d<param>``, its tolerance derived
    from the kernel's own forward)."""
    return TOLERANCE_SETTINGS.get(check, ())


def run_check(fn: Any, cfg: Config) -> Measurement:
    """Run the check named by ``cfg.check``. Raises :class:`Unsupported` where it cannot run."""
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise Unsupported("--device cuda asked for, but no CUDA GPU is visible here")
    if cfg.op in SHAPED:
        return run_shaped_check(fn, cfg)
    return run_op_check(as_op_kernel(fn), cfg)


__all__ = ["TOLERANCE_SETTINGS", "batch_sizes", "run_check", "tolerance_settings"]
