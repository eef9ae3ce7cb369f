"""gradcheck-bi: prove a GPU kernel's hand-written backward right or wrong.

The public API; everything else is internal. Names are loaded on first use, so that the
command line can refuse bad usage before torch is imported.

>>> from gradcheck_bi import Sweep, run_sweep
>>> results = run_sweep(Sweep(kernels=["after"], targets=[("cpu", "fp64")], checks=["dx"]))
>>> all(r.as_expected for r in results)
True
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from gradcheck_bi._version import __version__

if TYPE_CHECKING:
    from gradcheck_bi.api import GradcheckFailure, GradcheckSkipped, Report, check
    from gradcheck_bi.gate import exit_code
    from gradcheck_bi.kernels import BUNDLED
    from gradcheck_bi.runner import run as run_sweep
    from gradcheck_bi.sweep import Sweep
    from gradcheck_bi.vocab import Config, KernelSpec, Measurement, Result, Unsupported

# public name → (module, attribute)
_EXPORTS = {
    "BUNDLED": ("gradcheck_bi.kernels", "BUNDLED"),
    "Config": ("gradcheck_bi.vocab", "Config"),
    "GradcheckFailure": ("gradcheck_bi.api", "GradcheckFailure"),
    "GradcheckSkipped": ("gradcheck_bi.api", "GradcheckSkipped"),
    "KernelSpec": ("gradcheck_bi.vocab", "KernelSpec"),
    "Measurement": ("gradcheck_bi.vocab", "Measurement"),
    "Report": ("gradcheck_bi.api", "Report"),
    "Result": ("gradcheck_bi.vocab", "Result"),
    "Sweep": ("gradcheck_bi.sweep", "Sweep"),
    "Unsupported": ("gradcheck_bi.vocab", "Unsupported"),
    "check": ("gradcheck_bi.api", "check"),
    "exit_code": ("gradcheck_bi.gate", "exit_code"),
    "run_sweep": ("gradcheck_bi.runner", "run"),
}

__all__ = [
    "BUNDLED",
    "Config",
    "GradcheckFailure",
    "GradcheckSkipped",
    "KernelSpec",
    "Measurement",
    "Report",
    "Result",
    "Sweep",
    "Unsupported",
    "__version__",
    "check",
    "exit_code",
    "run_sweep",
]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'gradcheck_bi' has no attribute {name!r}")
    module, attr = _EXPORTS[name]
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
