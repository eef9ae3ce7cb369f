"""One call path for every check: a kernel behind :meth:`OpAdapted.call`.

An RMSNorm kernel loaded as Megatron's ``apply(x, weight, eps, zero_centered_gamma)`` (a
Function, an :class:`~gradcheck_bi.kernels.adapting.adapters.Adapted`, an apply object) is wrapped
once per kernel into an :class:`~gradcheck_bi.kernels.adapting.opadapt.OpAdapted` of ``rms_norm``,
so the one engine (:mod:`gradcheck_bi.checks.rows`) calls every kernel by role.
"""

from __future__ import annotations

import weakref
from typing import Any

from gradcheck_bi.kernels.adapting.opadapt import OpAdapted


class _Apply:
    """Megatron's ``apply(x, weight, eps, zcg)`` (an RMSNorm kernel: a Function, an
    :class:`~gradcheck_bi.kernels.adapting.adapters.Adapted`, an apply object) called by role."""

    def __init__(self, kernel: Any) -> None:
        self.kernel = kernel

    def __call__(self, values: dict[str, Any]) -> Any:
        return self.kernel.apply(values["x"], values["weight"], values["eps"], values["zcg"])


_AS_OP: weakref.WeakKeyDictionary[Any, OpAdapted] = weakref.WeakKeyDictionary()


def as_op_kernel(fn: Any) -> Any:
    """``fn`` behind :meth:`OpAdapted.call`, the one call path every check uses: an
    :class:`OpAdapted` as it is; an RMSNorm kernel with Megatron's ``apply`` wrapped (one
    wrapper per kernel, so a first call at a shape is announced once: :mod:`.watch`). The
    wrapper asks every zcg setting of the kernel: an ``Adapted`` refuses those it lacks."""
    if isinstance(fn, OpAdapted) or not callable(getattr(fn, "apply", None)):
        return fn
    try:
        return _AS_OP[fn]
    except KeyError:
        pass
    except TypeError:  # not weakly referable: a fresh wrapper (the watch keys on it)
        return OpAdapted("rms_norm", _Apply(fn), frozenset({False, True}), "")
    wrapped = _AS_OP[fn] = OpAdapted("rms_norm", _Apply(fn), frozenset({False, True}), "")
    return wrapped
