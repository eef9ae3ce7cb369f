"""The kernels under test: fixed-order Triton reduction, BI RMSNorm Functions, registry."""

from gradcheck_bi.kernels.registry import BUNDLED, KernelLoadError, KernelSpec, resolve
from gradcheck_bi.kernels.rmsnorm import After, Before, FixedDx, FixedForward, KernelInputError

__all__ = [
    "BUNDLED",
    "After",
    "Before",
    "FixedDx",
    "FixedForward",
    "KernelInputError",
    "KernelLoadError",
    "KernelSpec",
    "resolve",
]
