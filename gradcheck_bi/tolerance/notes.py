"""Each check's tolerance in one line of words, for the tables: built from the constants.

>>> NOTES["batch_invariance"]
'tolerance: 0 — every compared element must be bitwise identical'
>>> "8σ" in NOTES["dx"] and "2× Richardson" in NOTES["dx"]
True
>>> from gradcheck_bi.ops import DEFAULT_OP
>>> forward_note(ROWS[DEFAULT_OP]) == NOTES["forward"]
True
>>> "the mean and the variance" in forward_note(ROWS["layer_norm"])
True
"""

from __future__ import annotations

from gradcheck_bi.ops import ROWS, Op
from gradcheck_bi.tolerance.half import FRAC_THRESHOLD, HALF_ULP, K_OPS, MAX_ULP_THRESHOLD
from gradcheck_bi.tolerance.noise import K_SIGMA, K_TRUNC
from gradcheck_bi.tolerance.summation import OPS_RSQRT, OPS_SCALE, R_PER_TERM

_HALF = "½" if HALF_ULP == 0.5 else f"{HALF_ULP:g}"
_ANY_ORDER = (f"{K_SIGMA:g}σ of the FD noise, measured from the forward, and of the kernel's "
              f"own rounding in any summation order, in quadrature, + {K_TRUNC:g}× Richardson "
              "truncation")
_NEAREST = "a cell shows the error at the element nearest its own tolerance"
_OPS = OPS_RSQRT + OPS_SCALE
NOTES = {
    "forward": "tolerance: output rounding + the mean square's rounding in any summation "
    f"order, u·min({K_SIGMA:g}·sqrt((D+1)/{1 / R_PER_TERM:g} + {_OPS:g}), D/2 + {_OPS:g}), "
    "× max|ref|",
    "dx": f"tolerance: per element, {_ANY_ORDER}; {_NEAREST}",
    "dw": f"tolerance: per element, {_ANY_ORDER}; {_NEAREST}",
    "batch_invariance": "tolerance: 0 — every compared element must be bitwise identical",
}


def forward_note(op: Op) -> str:
    """The forward's tolerance in words for ``op``: RMSNorm's formula, or the same model
    named by the op's own statistic and further roundings (:attr:`Op.statistic`)."""
    if op.statistic == Op.statistic:
        return NOTES["forward"]
    return (f"tolerance: output rounding + the rounding of {op.statistic} in any summation "
            f"order (u·{K_SIGMA:g}σ over its n terms, or n/2 if smaller, + {_OPS:g} + "
            f"{op.forward_extra:g} roundings per element) × max|ref|")


# The other row ops (gradcheck_bi.checks.rows): inputs as dx, parameters as dw.
LIKE = {check: "dx" if name in op.inputs else "dw" for op in ROWS.values()
        for check, name in op.gradient_checks.items() if check not in NOTES}
NOTES.update({check: NOTES[like] for check, like in LIKE.items()})

_HALF_SUM = (f"+ fp32 rounding in any summation order ({K_SIGMA:g}σ) and {K_OPS:g} ulps × "
             "the terms + the lifted FD noise floor")
# A kernel that computes in fp32 and rounds each output once is off by just under ½ ulp at
# its worst element: measured on `after` (benchmarks/half_ulp_margin.py), forward 0.497–0.5002
# ulp, dx and dw 0.490–0.500 ulp against tolerances of 0.500–0.505 ulp.
BY_CONSTRUCTION = (f"fp32 inside and one rounding sits within a few per cent of {_HALF} ulp, "
                   "by construction")


def _half_gradient(name: str) -> str:
    return (f"ulps of the output dtype at the element shown (reference 0 or subnormal: at "
            f"|{name}|, at least the smallest normal's ulp; the JSON keeps units of dL/"
            f"{name}); tolerance per element: {_HALF} ulp at |reference| {_HALF_SUM}; "
            + BY_CONSTRUCTION)


# The forward of every output, each element's fp32 arithmetic added to its threshold
# (gradcheck_bi.checks.rows.forward).
HALF_FORWARD = (
    "ulps of the output dtype at the exact value of the element shown (0 or subnormal: at "
    "|y|, at least the smallest normal's ulp; the JSON keeps absolute units); pass: "
    f"every element of every output within {MAX_ULP_THRESHOLD} ulp + its fp32 arithmetic "
    "(the statistic, the op's extra roundings, β, the mean), at most "
    f"{FRAC_THRESHOLD:.0%} of elements not correctly rounded, no overflow; "
    # an op with a second correct reference says which (ops.record.Stored.note)
    + "".join(f"{op.stored.note}; " for op in ROWS.values() if op.stored and op.stored.note)
    + BY_CONSTRUCTION)
HALF_NOTES = {
    "forward": HALF_FORWARD,
    "dx": _half_gradient("dx"),
    "dw": _half_gradient("dw"),
    "batch_invariance": NOTES["batch_invariance"],
}
# Every op's other gradients, each in its own name.
HALF_NOTES.update({check: _half_gradient(check) for check in LIKE})
