"""The per-element ulp audit of a bf16/fp16 output, its pass rule and its diagnosis.

Torch, the standard library and the pass thresholds (:mod:`gradcheck_bi.tolerance.half`).
See :mod:`gradcheck_bi.lowp`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from gradcheck_bi.lowp.rounding import _format, _max_finite, _ordered, _round, error_ulp
from gradcheck_bi.tolerance.half import FRAC_THRESHOLD, MAX_ULP_THRESHOLD, MIN_COUNT

# ---- diagnosis thresholds (the pass thresholds: gradcheck_bi.tolerance.half) ----
WRONG_FORMULA_ULP = 8.0
"""Above this many ulps the error is not a rounding choice (double rounding measured ≤ 3.5)."""
WRONG_FORMULA_BIAS = 1.5
"""A mean signed error over all elements beyond this many ulps is a formula, not rounding."""
UNDERFLOW_RATIO = 2.0**-10
"""Large errors only on |exact| ≤ this × max |exact|: an intermediate underflowed."""


def _index(flat: int, shape: torch.Size) -> tuple[int, ...]:
    out = []
    for size in reversed(shape):
        out.append(flat % size)
        flat //= size
    return tuple(reversed(out))


@dataclass(frozen=True)
class AuditResult:
    """What :func:`audit` measured. Ulp errors use :func:`error_ulp` (the ulp at the correctly
    rounded value; where the exact value is 0 or subnormal, at ``|y|``); "signed" means
    ``(y - exact) · sign(exact)`` in ulps, i.e. positive when ``|y|`` is too large — a
    coherent sign over many elements is a bias."""

    dtype: str
    """``"bfloat16"`` or ``"float16"``."""
    n: int
    """Elements in ``y``."""
    n_compared: int
    """Elements whose exact reference is finite (all others are ignored and counted here)."""
    n_not_correctly_rounded: int
    """Elements with ``y != round_to(exact)`` (by value: -0 equals +0), less :attr:`n_ties`."""
    frac_not_correctly_rounded: float
    """``n_not_correctly_rounded / n_compared`` (0 when nothing was compared)."""
    max_ulp: float
    """max |y - exact| / ulp over elements where ``y`` and the exact value are finite."""
    max_steps: int
    """Most representable values between ``y`` and the correctly rounded value (finite y)."""
    mean_signed_ulp: float
    """Mean signed error in ulps over *all* finite compared elements (≈ 0 if unbiased)."""
    mean_signed_ulp_missed: float
    """Mean signed error in ulps over the *not correctly rounded* ones (NaN if none)."""
    n_overflow: int
    """``y`` non-finite where the correctly rounded exact value is finite."""
    n_zeroed: int
    """``y == 0`` where the correctly rounded exact value is not 0."""
    worst_index: tuple[int, ...] | None
    """Index of the element with the largest ulp error (None if nothing finite compared)."""
    worst_y: float
    worst_exact: float
    overflow_index: tuple[int, ...] | None
    """Index of the first overflowing element, if any."""
    sum_sq_overflows: bool | None
    """Given ``x``: whether some row's Σx² (exact) exceeds the dtype's largest finite value,
    so that a kernel squaring or summing in the input dtype overflows. None without ``x``."""
    max_abs_exact: float
    """Largest finite |exact| (0 if none)."""
    n_beyond: int
    """Elements more than ``WRONG_FORMULA_ULP`` ulps off (finite y)."""
    max_abs_exact_beyond: float
    """Largest |exact| among those (0 if none): tiny means an intermediate underflowed."""
    max_abs_exact_zeroed: float
    """Largest |exact| among the zeroed elements (0 if none): tiny means plain underflow."""
    n_ties: int = 0
    """Misses by one step within ``tie_bound`` of a tie: not counted in
    :attr:`n_not_correctly_rounded` (0 without a ``tie_bound``)."""

    @property
    def ok(self) -> bool:
        """Passes the thresholds of :func:`passes`."""
        return passes(self)


def audit(y: torch.Tensor, ref64: torch.Tensor, x: torch.Tensor | None = None,
          tie_bound: torch.Tensor | None = None) -> AuditResult:
    """Audit a bf16/fp16 output ``y`` against its exact fp64 reference ``ref64`` (same shape).

    ``ref64`` must be exact to far below the output ulp: compute it in fp64 from the *same*
    low-precision inputs the kernel saw (upcast exactly). ``x`` (optional, the kernel's input,
    last dim reduced) only adds the :attr:`AuditResult.sum_sq_overflows` hint. ``tie_bound``
    (optional, per element, absolute): the kernel's own wider arithmetic; a miss by one step
    whose exact value lies within it of the tie between ``y`` and the correctly rounded value
    is not counted (:attr:`AuditResult.n_ties`) — correct fp32 arithmetic may land on either
    side of a tie it cannot resolve.

    >>> import torch
    >>> from gradcheck_bi.lowp import round_to
    >>> ref = torch.randn(64, 256, dtype=torch.float64)
    >>> r = audit(round_to(ref, torch.bfloat16), ref)
    >>> r.n_not_correctly_rounded, r.max_ulp <= 0.5
    (0, True)
    """
    if ref64.dtype != torch.float64:
        raise TypeError(f"the exact reference must be fp64, got {ref64.dtype}")
    _format(y.dtype)
    if y.shape != ref64.shape:
        raise ValueError(f"y {tuple(y.shape)} and reference {tuple(ref64.shape)} differ in shape")
    y = y.detach()
    ref = ref64.detach().to(y.device)
    c64, _ = _round(ref, y.dtype)
    ulp = error_ulp(ref, y)
    y64 = y.to(torch.float64)
    diff = y64 - ref
    # Signed toward magnitude: positive when |y| is too large.
    signed = torch.where(ref < 0, -diff, diff).div_(ulp)
    abs_ulp = signed.abs()
    # Compared elements: exact value finite. Valid for ulp statistics: y finite as well.
    ref_fin = torch.isfinite(ref)
    all_fin = bool(ref_fin.all())
    valid = torch.isfinite(abs_ulp)  # false where y or ref is inf or NaN
    n_compared = ref.numel() if all_fin else int(ref_fin.sum())
    n_valid = int(valid.sum())
    if n_valid < abs_ulp.numel():
        abs_ulp = torch.where(valid, abs_ulp, -1.0)
        signed = torch.where(valid, signed, 0.0)

    missed = y64 != c64
    if not all_fin:
        missed &= ref_fin
    miss_idx = torch.nonzero(missed.reshape(-1)).squeeze(1)
    # Statistics over the misses: few elements, gathered once.
    m_c = c64.reshape(-1)[miss_idx]
    m_y = y.reshape(-1)[miss_idx]
    steps = (_ordered(m_y.view(torch.int16))
             - _ordered(m_c.to(y.dtype).view(torch.int16))).abs()
    n_ties = 0
    if tie_bound is not None and miss_idx.numel():
        mid = (m_y.to(torch.float64) + m_c) / 2
        near = (ref.reshape(-1)[miss_idx] - mid).abs()
        bound = tie_bound.detach().to(ref.device, torch.float64).reshape(-1)[miss_idx]
        kept = ~((steps == 1) & (near <= bound))
        n_ties = int((~kept).sum())
        miss_idx, m_c, m_y, steps = miss_idx[kept], m_c[kept], m_y[kept], steps[kept]
    n_missed = miss_idx.numel()
    m_valid = valid.reshape(-1)[miss_idx]
    m_signed = signed.reshape(-1)[miss_idx][m_valid]
    steps = steps[m_valid & torch.isfinite(m_c)]
    overflow = ~torch.isfinite(m_y) & torch.isfinite(m_c)
    zeroed = (m_y == 0) & (m_c != 0)

    worst_index: tuple[int, ...] | None = None
    worst_y = worst_exact = math.nan
    max_ulp = 0.0
    if n_valid:
        flat = int(torch.argmax(abs_ulp.reshape(-1)))
        max_ulp = float(abs_ulp.reshape(-1)[flat])
        worst_index = _index(flat, y.shape)
        worst_y = float(y64.reshape(-1)[flat])
        worst_exact = float(ref.reshape(-1)[flat])
    n_overflow = int(overflow.sum())
    overflow_index = (_index(int(miss_idx[overflow][0]), y.shape) if n_overflow else None)
    abs_ref = ref.abs() if all_fin else torch.where(ref_fin, ref.abs(), 0.0)
    max_abs_exact = float(abs_ref.max()) if abs_ref.numel() else 0.0
    beyond = m_valid & (abs_ulp.reshape(-1)[miss_idx] > WRONG_FORMULA_ULP)
    n_beyond = int(beyond.sum())
    max_abs_exact_beyond = (float(abs_ref.reshape(-1)[miss_idx][beyond].max())
                            if n_beyond else 0.0)
    max_abs_exact_zeroed = (float(abs_ref.reshape(-1)[miss_idx][zeroed].max())
                            if bool(zeroed.any()) else 0.0)
    sum_sq_overflows = None
    if x is not None:
        x64 = x.detach().to(torch.float64)
        sum_sq_overflows = bool((x64 * x64).sum(dim=-1).max() > _max_finite(y.dtype))
    return AuditResult(
        dtype=str(y.dtype).removeprefix("torch."),
        n=y.numel(),
        n_compared=n_compared,
        n_not_correctly_rounded=n_missed,
        frac_not_correctly_rounded=n_missed / n_compared if n_compared else 0.0,
        max_ulp=max_ulp,
        max_steps=int(steps.max()) if steps.numel() else 0,
        mean_signed_ulp=float(signed.sum()) / n_valid if n_valid else math.nan,
        mean_signed_ulp_missed=float(m_signed.mean()) if m_signed.numel() else math.nan,
        n_overflow=n_overflow,
        n_zeroed=int(zeroed.sum()),
        worst_index=worst_index,
        worst_y=worst_y,
        worst_exact=worst_exact,
        overflow_index=overflow_index,
        sum_sq_overflows=sum_sq_overflows,
        max_abs_exact=max_abs_exact,
        n_beyond=n_beyond,
        max_abs_exact_beyond=max_abs_exact_beyond,
        max_abs_exact_zeroed=max_abs_exact_zeroed,
        n_ties=n_ties,
    )


def passes(result: AuditResult) -> bool:
    """The pass rule: no overflow, misses ≤ max(MIN_COUNT, FRAC_THRESHOLD · n) and max error
    ≤ MAX_ULP_THRESHOLD ulps."""
    allowed = max(MIN_COUNT, FRAC_THRESHOLD * result.n_compared)
    return (result.n_overflow == 0 and result.n_not_correctly_rounded <= allowed
            and result.max_ulp <= MAX_ULP_THRESHOLD)


def _count(n: int) -> str:
    return f"{n} element" if n == 1 else f"{n} elements"


def _pct(frac: float) -> str:
    return f"{100 * frac:.3g}%"


def classify(result: AuditResult, formula_ruled_out: bool = False) -> str:
    """One line for a kernel maintainer. The first class that applies, in this order
    (``formula_ruled_out``: the same kernel is right in fp64, so class 3 is named
    ``precision lost``, never the formula):

    1. ``overflow`` — ``y`` non-finite where the correctly rounded exact value is finite; or
       (given ``x`` to :func:`audit`) elements zeroed — not only tiny ones — while Σx²
       exceeds the dtype's range: "overflow (likely)", the signature of x² summed in fp16
       and ``rsqrt(inf) = 0``;
    2. ``underflow`` — errors beyond WRONG_FORMULA_ULP only on values at most
       UNDERFLOW_RATIO of the largest |exact|: an intermediate went subnormal;
    3. ``wrong formula`` — max error above WRONG_FORMULA_ULP, or a mean signed error over
       all elements beyond WRONG_FORMULA_BIAS (a coherent bias no rounding makes);
    4. ``double rounding`` — fails :func:`passes` otherwise;
    5. ``correctly rounded`` — passes.

    >>> import torch
    >>> from gradcheck_bi.lowp import round_to
    >>> ref = torch.randn(4096, dtype=torch.float64)
    >>> classify(audit(round_to(ref, torch.bfloat16), ref))
    'correctly rounded (0 of 4096 elements off by one ulp, ties within fp32 noise)'
    """
    r = result
    where = (f" (worst at {list(r.worst_index)}: {r.worst_y:.6g} vs exact {r.worst_exact:.6g})"
             if r.worst_index is not None else "")
    missed = f"{_pct(r.frac_not_correctly_rounded)} of elements not correctly rounded"
    if r.n_overflow:
        return (f"overflow: {r.n_overflow} of {r.n_compared} elements non-finite where the "
                f"exact value is finite (first at {list(r.overflow_index or ())})")
    tiny = UNDERFLOW_RATIO * r.max_abs_exact
    if r.n_zeroed and r.sum_sq_overflows and r.max_abs_exact_zeroed > tiny:
        return (f"overflow (likely): {r.n_zeroed} of {r.n_compared} elements are 0 where the "
                f"exact value is not, and Σx² exceeds {r.dtype}'s largest finite value here, "
                f"so squaring or summing in {r.dtype} gives inf and rsqrt(inf) = 0 "
                f"(if the kernel accumulates in fp32, suspect the formula instead)")
    # (An all-zero exact output has no scale to underflow against: a nonzero y is a formula.)
    if r.n_beyond and r.max_abs_exact > 0 and r.max_abs_exact_beyond <= tiny:
        return (f"underflow: {_count(r.n_beyond)} with |exact| ≤ {r.max_abs_exact_beyond:.3g} "
                f"are off by up to {r.max_ulp:.3g} ulp (an intermediate went subnormal, e.g. "
                f"a value held in fp16 before a multiply); overall {missed}{where}")
    if r.max_ulp > WRONG_FORMULA_ULP or abs(r.mean_signed_ulp) > WRONG_FORMULA_BIAS:
        zeros = (f"; {r.n_zeroed} elements are 0 where the exact value is not"
                 if r.n_zeroed else "")
        what = "precision lost" if formula_ruled_out else "wrong formula"
        return (f"{what}: max error {r.max_ulp:.3g} ulp (far beyond rounding), "
                f"mean signed {r.mean_signed_ulp:+.3g} ulp, {missed}{zeros}{where}")
    if not passes(r):
        return (f"double rounding: {missed}, max {r.max_ulp:.3g} ulp, mean signed bias "
                f"{r.mean_signed_ulp_missed:+.2f} ulp on those ({r.mean_signed_ulp:+.2g} over "
                f"all; > 0: |y| too large){where}")
    return (f"correctly rounded ({r.n_not_correctly_rounded} of {r.n_compared} elements off "
            f"by one ulp, ties within fp32 noise)")
