"""The kernels under test: the ones bundled (:mod:`.bundled`), a user's adapted
(:mod:`.adapting`), calling either (:mod:`.calling`); :func:`resolve` turns any reference
into a :class:`KernelSpec` (:mod:`.registry`)."""

from gradcheck_bi.kernels.adapting.adapters import adapt
from gradcheck_bi.kernels.adapting.named import NAMED
from gradcheck_bi.kernels.bundled.rmsnorm import (
    After,
    Before,
    FixedDx,
    FixedForward,
    KernelInputError,
)
from gradcheck_bi.kernels.registry import BUNDLED, resolve
from gradcheck_bi.vocab import KernelLoadError, KernelSpec

__all__ = [
    "BUNDLED",
    "NAMED",
    "After",
    "Before",
    "FixedDx",
    "FixedForward",
    "KernelInputError",
    "KernelLoadError",
    "KernelSpec",
    "adapt",
    "resolve",
]
