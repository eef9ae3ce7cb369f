"""Low-precision forward audit: a bf16/fp16 output compared, element by element and in ulps,
with the correctly rounded value of its exact (fp64) reference.

It imports torch, the standard library and its pass thresholds
(:mod:`gradcheck_bi.tolerance.half`).

* :func:`round_to` — fp64 → bf16/fp16, correctly rounded (round to nearest, ties to even),
  computed from the fp64 bit pattern. ``tensor.to(torch.bfloat16)`` is *not* that: torch
  converts fp64 → fp32 → bf16, a double rounding that is wrong on the elements lying within
  2^-24 (relative) of a bf16 midpoint.
* :func:`ulp_of` — the spacing of the target format at the correctly rounded value;
  :func:`error_ulp` — the ulp errors are measured in (at ``|y|`` where the exact value is 0
  or subnormal, so that no error reads as 1e+40 ulps).
* :func:`audit` — fraction of elements not correctly rounded, max |error| in ulps against the
  exact reference, mean signed error, overflow count, the worst element.
* :func:`classify` — one line of plain English for a kernel maintainer, using the thresholds
  of :mod:`.audit` (derived from measurements, see ``docs/low_precision.md``).

>>> import torch
>>> ref = torch.tensor([1 + 2**-8 + 2**-30], dtype=torch.float64)
>>> ref.to(torch.bfloat16).item(), round_to(ref, torch.bfloat16).item()
(1.0, 1.0078125)
"""

from gradcheck_bi.lowp.audit import (
    UNDERFLOW_RATIO,
    WRONG_FORMULA_BIAS,
    WRONG_FORMULA_ULP,
    AuditResult,
    audit,
    classify,
    passes,
)
from gradcheck_bi.lowp.rounding import error_ulp, round_to, ulp_of

__all__ = [
    "UNDERFLOW_RATIO",
    "WRONG_FORMULA_BIAS",
    "WRONG_FORMULA_ULP",
    "AuditResult",
    "audit",
    "classify",
    "error_ulp",
    "passes",
    "round_to",
    "ulp_of",
]
