"""Kernel names → kernel specs, with the defects each bundled kernel declares.

A :class:`KernelSpec` is what the rest of the tool checks: a Function with Megatron's
signature ``apply(x, weight, eps, zero_centered_gamma)`` and, for the bundled defective
kernels, where each defect must show. A defect shows at a set of (check, zcg, γ control)
points; everywhere else the kernel must pass — that is what makes γ=ones a *blind control*
rather than a measurement.

>>> resolve("after").name
'after'
>>> [d.name for d in resolve("before").defects]
['forward-ignores-zcg', 'dx-double-weight']
"""

from __future__ import annotations

import importlib.util
from dataclasses import replace
from typing import Any

from gradcheck_bi.kernels.adapting import sandbox
from gradcheck_bi.kernels.adapting.loader import complete_ref, load
from gradcheck_bi.kernels.adapting.named import NAMED, resolve_named
from gradcheck_bi.kernels.bundled import rmsnorm
from gradcheck_bi.vocab import CONTROLS, Defect, KernelLoadError, KernelSpec

FORWARD_IGNORES_ZCG = Defect(
    name="forward-ignores-zcg",
    summary="forward scales by raw w under zero_centered_gamma; the backward applies w + 1",
    # The forward is wrong by x·r for every γ, and the analytic dx (built for w + 1) no
    # longer matches the derivative of that forward. dw is blind: ∂y/∂w is x·r either way.
    checks=frozenset({"forward", "dx"}),
    zcg=frozenset({True}),
    controls=frozenset(CONTROLS),
)
DX_DOUBLE_WEIGHT = Defect(
    name="dx-double-weight",
    summary="dx multiplies the variance term by γ twice",
    # Error (γ_k - 1) r³ x_k s / D: zero at γ = ones (blind control), zero at γ = zeros
    # (s = 0 there), O(1) at γ = randn.
    checks=frozenset({"dx"}),
    zcg=frozenset({False, True}),
    controls=frozenset({"randn"}),
)


BUNDLED: dict[str, KernelSpec] = {
    "before": KernelSpec(
        "before", rmsnorm.Before, (FORWARD_IGNORES_ZCG, DX_DOUBLE_WEIGHT), "both defects"
    ),
    "after": KernelSpec("after", rmsnorm.After, (), "both defects fixed"),
    "fixed-forward": KernelSpec(
        "fixed-forward", rmsnorm.FixedForward, (DX_DOUBLE_WEIGHT,), "only defect 1 fixed"
    ),
    "fixed-dx": KernelSpec(
        "fixed-dx", rmsnorm.FixedDx, (FORWARD_IGNORES_ZCG,), "only defect 2 fixed"
    ),
}


def resolve(ref: str, kernel_args: dict[str, Any] | None = None) -> KernelSpec:
    """A bundled name, a named adapter (``torch``, ``liger``, ...), ``PATH.py:ATTR`` or
    ``package.module:ATTR`` → :class:`KernelSpec`. ``kernel_args`` go to the user's kernel
    (a bundled kernel takes none)."""
    if ref in BUNDLED:
        given = sorted(k for k in (kernel_args or {}) if k != "op")
        if given:  # said, not ignored: --generic, --kernel-arg
            what = "--generic" if "generic" in given else f"--kernel-arg {given[0]}"
            raise KernelLoadError(f"kernel {ref!r} is bundled (an RMSNorm) and takes no "
                                  f"{what}: it is for a kernel of your own")
        return BUNDLED[ref]
    spec = resolve_named(ref, kernel_args)
    if spec is None and (":" in ref or ref.endswith(".py")):
        spec = load(ref if ":" in ref else complete_ref(ref), kernel_args)
    if spec is not None:
        return replace(spec, loaded_with=tuple((kernel_args or {}).items()))
    raise KernelLoadError(
        f"unknown kernel {ref!r}: expected one of {', '.join([*BUNDLED, *NAMED])}, "
        "PATH.py:ATTR or package.module:ATTR (`gradcheck-bi kernels` lists them)"
        + _colon_hint(ref)
    )


def _colon_hint(ref: str) -> str:
    """`` (did you mean 'torch.nn:LayerNorm'?)`` for a dotted name whose last part is an
    attribute of an importable module (found, not imported; its parent packages are, as
    any lookup of a submodule imports them)."""
    if ":" in ref or "." not in ref or ref.endswith(".py"):
        return ""
    module, _, attr = ref.rpartition(".")
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    return f" (did you mean '{module}:{attr}'?)" if found and attr.isidentifier() else ""


sandbox.loader = resolve  # a spawned child records a CUDA-only kernel's calls after this
