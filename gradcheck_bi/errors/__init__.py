"""The error model of ops of any shape: a correct kernel's rounding, derived per element
from the op's own fp64 reference (:mod:`.derive`)."""

from gradcheck_bi.errors.derive import ROUNDINGS, Derived, derived, forward_sigma, unit

__all__ = ["ROUNDINGS", "Derived", "derived", "forward_sigma", "unit"]
