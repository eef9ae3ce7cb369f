"""The four checks: forward, dx, dw, batch_invariance → a measured error and its tolerance.

Each check takes a kernel's Function and one :class:`~gradcheck_bi.vocab.Config` — device,
dtype, shape, eps, seed, γ control, zero_centered_gamma — and returns a
:class:`~gradcheck_bi.vocab.Measurement`: the max abs error, the tolerance it is held to,
where the worst element is, and what produced the number (reference, stencil, step, noise
floor).

* ``forward`` (:mod:`.forward`) — ``y`` against an independent fp64 reference;
* ``dx`` / ``dw`` (:mod:`.gradients`) — the analytic backward against central differences
  of the kernel's own forward;
* ``batch_invariance`` (:mod:`.batch_invariance`) — bitwise, alone vs. in batches, and
  run to run.

Tolerances: :mod:`.tolerance`; which of a config's settings act on each check's
tolerance: :data:`TOLERANCE_SETTINGS`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from gradcheck_bi.checks.batch_invariance import batch_sizes, check_batch_invariance
from gradcheck_bi.checks.family import run_op_check
from gradcheck_bi.checks.forward import check_forward
from gradcheck_bi.checks.gradients import check_dw, check_dx
from gradcheck_bi.kernels.opadapt import as_op_kernel
from gradcheck_bi.ops import OPS
from gradcheck_bi.vocab import Config, Measurement, Unsupported

CHECK_FUNCTIONS: dict[str, Callable[[Any, Config], Measurement]] = {
    "forward": check_forward,
    "dx": check_dx,
    "dw": check_dw,
    "batch_invariance": check_batch_invariance,
}


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
# The other ops' gradients (gradcheck_bi.checks.family): every element, no directions; an
# input's step is relative, a parameter's fixed.
for _op in OPS.values():
    for _name, _t in _op.gradient_checks.items():
        TOLERANCE_SETTINGS.setdefault(_name, ("atol", "rtol", "stencil", "step_rel")
                                      if _t in _op.inputs else ("atol", "rtol", "stencil"))


def run_check(fn: Any, cfg: Config) -> Measurement:
    """Run the check named by ``cfg.check``. Raises :class:`Unsupported` where it cannot run."""
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise Unsupported("--device cuda asked for, but no CUDA GPU is visible here")
    return run_op_check(as_op_kernel(fn), cfg)


__all__ = [
    "CHECK_FUNCTIONS",
    "TOLERANCE_SETTINGS",
    "batch_sizes",
    "check_batch_invariance",
    "check_dw",
    "check_dx",
    "check_forward",
    "run_check",
]
