"""The working precision of a kernel of any shape, read from its forward's errors against the
op's fp64 reference at the point being checked.

A kernel called in one dtype may compute in a coarser one inside (fp32 inside an fp64 call;
TF32 or bf16 inside an fp32 call on a GPU: :func:`plausible`). Its forward is then judged
at that precision's rounding where its errors are **rounding at it**:

* their size: every element within ``K σ u_p`` (``σ`` the derived rounding of the
  reference) and, over many elements, the largest a fair fraction of it (a formula a
  little off is within a coarse unit too, but nothing rounds at that unit there);
* for fp32 inside an fp64 call, unbiased: rounding to nearest leaves an error uncorrelated
  with the output, so the least-squares scale of the error on the output,
  ``c = Σ e·y / Σ y²`` (a mean relative error weighted by ``y²``: near-zero outputs, whose
  relative errors are unbounded, weigh nothing), stays within ``BIAS_SE`` standard errors
  of 0 plus ``BIAS_U · u_p`` (the norms' test, :mod:`gradcheck_bi.checks.precision`, in a
  form for any output). The standard error is clustered by the output's rows (its first
  axis): a rounding of a row's statistic is shared by the row. The rounding of an operand
  shared along the other axes (a column's weight or bias, an element of a GEMM's A) moves
  every output that uses it by up to one ``u``, and with few columns that need not average
  out — a correct fp32 GEMM of 8 × 4 outputs showed a scale of 0.94 u at 3.8 row-clustered
  standard errors — so ``BIAS_U`` is 2 units, not the norms' half. A wrong eps (RMSNorm's
  eps outside the root: 8.4 u), a scaled output, a constant off by a few units err
  systematically and stay judged at the dtype. Tested where the output has at least
  ``BIAS_MIN_ROWS`` rows holding a nonzero value (fewer give no standard error to trust).
  TF32 and bf16 inside an fp32 call keep the size test alone: a tensor core may truncate
  fp32 to TF32 rather than round it, a bias of about one unit in a correct kernel.
"""

from __future__ import annotations

import math

import torch

from gradcheck_bi.checks.shaped_point import Point
from gradcheck_bi.errors import Derived, unit
from gradcheck_bi.tolerance.noise import K_SIGMA
from gradcheck_bi.vocab import HALF_DTYPES

# Working precisions coarser than a dtype, finest first: what a kernel may compute in inside.
COARSER = (("fp32", 2.0**-24), ("tf32", 2.0**-11), ("bf16", 2.0**-8))
# A coarser unit is taken where the largest forward error over at least ROUNDS_LIKE_N
# elements reaches ROUNDS_LIKE_MIN of that unit's u·σ: one rounding's error is spread evenly
# up to u·|y|, so each element stays below 0.05·u·σ with a probability of a few percent, and
# all 64 of them essentially never.
ROUNDS_LIKE_N = 64
ROUNDS_LIKE_MIN = 0.05
BIAS_SE = 4.0  # standard errors of the scale c (the norms' test's)
BIAS_U = 2.0  # units of u_p a correct kernel's shared roundings may leave in c (see above)
BIAS_MIN_ROWS = 8  # an output's rows from which its errors' bias is tested


def plausible(name: str, dtype: str, device: str, products: bool) -> bool:
    """Whether a kernel called in ``dtype`` can compute in ``name`` inside: fp32 inside an
    fp64 call (anywhere); TF32 (a GEMM's tensor cores, so an op that multiplies matrices)
    and bf16 inside an fp32 call on a GPU alone. Anything else is not rounding: a forward
    that far off is wrong, and a coarser unit would hide it."""
    if dtype == "fp64":
        return name == "fp32"
    if dtype == "fp32" and device.startswith("cuda"):
        return name == "bf16" or (name == "tf32" and products)
    return False


def floor(u: float) -> float:
    return u * 2.0**-60  # nothing a kernel computes is that small but an exact zero


def bias(err: torch.Tensor, ref: torch.Tensor) -> tuple[float, float] | None:
    """``(c, se)``: the least-squares scale ``c = Σ e·y / Σ y²`` of the signed error ``err``
    on the output ``ref`` and its standard error, clustered by ``ref``'s rows (its first
    axis); ``None`` where fewer than ``BIAS_MIN_ROWS`` rows hold a nonzero output.

    >>> y = torch.linspace(-2, 2, 64, dtype=torch.float64).reshape(16, 4)
    >>> c, se = bias(1e-6 * y, y)
    >>> round(c, 9), se < 1e-20
    (1e-06, True)
    """
    if ref.dim() == 0:
        return None
    e, y = err.reshape(ref.shape[0], -1), ref.reshape(ref.shape[0], -1)
    w = (y * y).sum(1)
    rows = w > 0
    n_rows = int(rows.sum())
    if n_rows < BIAS_MIN_ROWS:
        return None
    s, w = (e * y).sum(1)[rows], w[rows]
    total = float(w.sum())
    c = float(s.sum()) / total
    resid = s - c * w  # each row's part of Σ e·y beyond the common scale
    se = math.sqrt(float((resid * resid).sum()) * n_rows / (n_rows - 1)) / total
    return c, se


def working_unit(point: Point, diffs: dict[str, torch.Tensor], m: Derived
                 ) -> tuple[float, str | None]:
    """The unit roundoff the kernel delivers, from its forward's signed errors ``diffs``
    (output − reference): its dtype's, or the finest coarser one whose rounding its errors
    are (see the module) among those it can have (:func:`plausible`), with the note that
    says so — or, where fp32's size fits but the errors are biased, the note that says
    why the dtype's rounding judges it; ``--precision exact`` keeps the dtype's."""
    u = unit(point.dtype)
    if point.cfg.dtype in HALF_DTYPES or point.cfg.precision == "exact":
        return u, None
    sig = m.output_sigma
    errs = {k: d.abs() for k, d in diffs.items()}

    def within(u_: float) -> bool:
        return all(bool((e <= K_SIGMA * u_ * s + floor(u_)).all()) for e, s in
                   ((errs[k], sig[k]) for k in errs))

    def rounds_like(u_: float) -> bool:
        """The errors are of the size ``u_``'s roundings leave: over many elements the
        largest is a fair fraction of ``u_·σ``. A forward off by a small formula difference
        (GELU's tanh form judged as erf: 4e-3 of bf16's) is within a coarse unit too, but
        nothing rounds at that unit there."""
        if sum(e.numel() for e in errs.values()) < ROUNDS_LIKE_N:
            return True  # too few elements for the largest to say anything
        return max(float((e / (u_ * s + floor(u_))).max()) for e, s in
                   ((errs[k], sig[k]) for k in errs)) >= ROUNDS_LIKE_MIN

    def biased(u_: float) -> str:
        """Why the errors are not rounding at ``u_`` though their size is: "" if none."""
        for k, d in diffs.items():
            found = bias(d, m.outputs[k])
            if found is not None and abs(found[0]) > BIAS_SE * found[1] + BIAS_U * u_:
                return (f"{k} errs by a systematic relative {found[0] / u_:+.3g} u of fp32 "
                        f"(limit {(BIAS_SE * found[1] + BIAS_U * u_) / u_:.3g} u)")
        return ""

    if within(u):
        return u, None
    for name, coarse in COARSER:
        if coarse > u and plausible(name, point.cfg.dtype, point.cfg.device, m.products) \
                and within(coarse) and rounds_like(coarse):
            why = biased(coarse) if name == "fp32" else ""
            if why:
                return u, (f"not fp32 rounding inside: within its size, but {why}; judged "
                           f"at {point.cfg.dtype} rounding")
            return coarse, (f"computes in {name} inside: judged at {name} rounding "
                            f"(--precision exact: {point.cfg.dtype})")
    return u, None
