"""fp64 → bf16/fp16 correctly rounded (on the bit pattern), and the ulp at each value.

A leaf: torch and the standard library only. See :mod:`gradcheck_bi.lowp`.
"""

from __future__ import annotations

import math

import torch

# (significant bits p including the implicit one, emin, emax) of each target format.
_FORMATS: dict[torch.dtype, tuple[int, int, int]] = {
    torch.bfloat16: (8, -126, 127),
    torch.float16: (11, -14, 15),
}

_ABS_MASK = 0x7FFF_FFFF_FFFF_FFFF
_FRAC_MASK = (1 << 52) - 1
_HIDDEN = 1 << 52


def _format(dtype: torch.dtype) -> tuple[int, int, int]:
    try:
        return _FORMATS[dtype]
    except KeyError:
        raise TypeError(
            f"target dtype must be torch.bfloat16 or torch.float16, got {dtype}"
        ) from None


def _max_finite(dtype: torch.dtype) -> float:
    p, _, emax = _format(dtype)
    return (2.0 - 2.0 ** (1 - p)) * 2.0**emax


def _pow2(exponent: torch.Tensor) -> torch.Tensor:
    """Exact ``2.0 ** exponent`` in fp64 for integer exponents in [-1022, 1023]."""
    return ((exponent + 1023) << 52).view(torch.float64)


def _round(ref64: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(correctly rounded value, its ulp), both fp64; see :func:`round_to` and :func:`ulp_of`."""
    if ref64.dtype != torch.float64:
        raise TypeError(f"need an fp64 tensor (the exact reference), got {ref64.dtype}")
    p, emin, emax = _format(dtype)
    x = ref64.contiguous()
    mag = x.view(torch.int64) & _ABS_MASK
    biased = mag >> 52
    normal = biased > 0
    # |x| = sig · 2^e2 exactly, sig < 2^53; an fp64 subnormal has biased = 0, e2 = -1074.
    sig = mag & _FRAC_MASK
    sig = torch.where(normal, sig | _HIDDEN, sig)
    biased = biased.clamp(min=1)  # now lead exponent = biased - 1023, e2 = biased - 1075
    # The target's quantum at this magnitude is 2^q, q = max(lead, emin) - (p - 1); the bits
    # to drop are q - e2 (≥ 53 - p). Above 54 everything rounds to 0: cap at 60 so that
    # 1 << shift stays inside int64.
    q = biased.clamp(min=emin + 1023) - (1023 + p - 1)
    shift = (q - (biased - 1075)).clamp(max=60)
    kept = sig >> shift
    half = torch.ones_like(shift) << (shift - 1)
    rem = sig - (kept << shift)
    # Round to nearest, ties to even: up if rem > half, or rem == half and kept is odd.
    kept += ((rem > half) | ((rem == half) & ((kept & 1) == 1))).to(torch.int64)
    # A carry into the next binade (kept == 2^p) doubles the ulp; the top binade's ulp
    # stands for ±inf.
    q_ulp = (q + (kept >> p)).clamp(max=emax - (p - 1))
    ulp = _pow2(q_ulp)
    # kept ≤ 2^p and q ≤ 1023 - (p - 1): the product is exact, or inf when it overflows fp64.
    value = kept.to(torch.float64) * _pow2(q.clamp(max=1023))
    value = torch.where(value > _max_finite(dtype), math.inf, value)
    value = torch.copysign(value, x)
    nan = torch.isnan(x)
    if bool(nan.any()):
        value = torch.where(nan, math.nan, value)
        ulp = torch.where(nan, math.nan, ulp)
    return value, ulp


def round_to(ref64: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``ref64`` (fp64) correctly rounded to ``dtype`` (bf16 or fp16), round-to-nearest-even.

    Done on the fp64 bit pattern with integer arithmetic: the 53-bit significand is shifted
    right to the target's quantum at that magnitude (which is fixed below ``emin``, so
    subnormals of the target come out right), the remainder compared with half a quantum,
    ties to even. Values at or above the midpoint between the largest finite value and
    ``2^(emax+1)`` become ±inf (fp16: |v| ≥ 65520 → inf, 65519.99… → 65504). Signed zeros
    and infinities keep their sign; NaN stays NaN (sign and payload not preserved).

    >>> import torch
    >>> v = torch.tensor([65519.9, 65520.0, -0.0, 2.0**-25, 2.0**-25 * 1.0001],
    ...                  dtype=torch.float64)
    >>> round_to(v, torch.float16).tolist()
    [65504.0, inf, -0.0, 0.0, 5.960464477539063e-08]
    """
    value, _ = _round(ref64, dtype)
    # Every value is representable in dtype (and in fp32), so this .to() is exact.
    return value.to(dtype)


def ulp_of(ref64: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The ulp of ``dtype`` at each correctly rounded value ``c = round_to(ref64, dtype)``, fp64.

    ``ulp = 2^(max(e, emin) - (p - 1))`` where ``2^e ≤ |c| < 2^(e+1)`` is the binade of ``c``
    (``p`` significant bits: 8 for bf16, 11 for fp16):

    * at a power of two, ``c = ±2^e``, it is the spacing *above* ``|c|`` (the larger of the
      two neighbouring gaps). So a correctly rounded element is always within 0.5 ulp of the
      exact value, whichever side of 2^e the exact value lies; the price is that an element
      one step *below* a power of two reads as only 0.25–0.5 ulp wrong — which is why the
      audit counts misses (``y != c``) directly and does not infer them from the ulp error;
    * for ``c = 0`` and subnormal ``c`` it is the subnormal spacing ``2^(emin - p + 1)``;
    * for ``c = ±inf`` it is the ulp of the top binade ``2^(emax - p + 1)``; NaN gives NaN.

    >>> import torch
    >>> v = torch.tensor([1.0, 0.999, 0.998, 3.0, 0.0], dtype=torch.float64)
    >>> ulp_of(v, torch.bfloat16).tolist()  # 0.999 rounds up to 1.0, 0.998 down to 0.99609375
    [0.0078125, 0.0078125, 0.00390625, 0.015625, 9.183549615799121e-41]
    """
    return _round(ref64, dtype)[1]


def error_ulp(ref64: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The ulp that ``|y - exact|`` is measured in, per element (fp64): :func:`ulp_of` at the
    exact value, except where the exact value is 0 or subnormal — there the ulp at ``|y|``,
    which is never below the ulp at the smallest normal (bf16 2^-133, fp16 2^-24).

    Measured in the subnormal spacing, a ``y`` of 1 where the exact value is 0 would read as
    1e+40 bf16 ulps; measured at ``|y|`` it reads as its own size, 2^(p-1) to 2^p ulps (bf16
    128–256, fp16 1024–2048). Where ``y`` is 0 or subnormal too, both rules give the subnormal
    spacing, so a correctly rounded element stays within 0.5 ulp.

    >>> import torch
    >>> ref = torch.tensor([0.0, 0.0, 1.0], dtype=torch.float64)
    >>> error_ulp(ref, torch.tensor([0.0, 1.0, 1.0], dtype=torch.bfloat16)).tolist()
    [9.183549615799121e-41, 0.0078125, 0.0078125]
    """
    _, emin, _ = _format(y.dtype)
    ulp = _round(ref64, y.dtype)[1]
    tiny = ref64.abs() < 2.0**emin
    if bool(tiny.any()):
        ulp = torch.where(tiny, _round(y.detach().to(torch.float64).abs(), y.dtype)[1], ulp)
    return ulp


def _ordered(bits16: torch.Tensor) -> torch.Tensor:
    """Map 16-bit float patterns to integers whose order and difference count representable
    steps (±0 both map to 0)."""
    b = bits16.to(torch.int64) & 0xFFFF
    magnitude = b & 0x7FFF
    return torch.where(b >= 0x8000, -magnitude, magnitude)
