"""gradcheck-bi: prove a batch-invariant RMSNorm's hand-written backward right or wrong.

The public API; everything else is internal.

>>> from gradcheck_bi import Sweep, run_sweep
>>> results = run_sweep(Sweep(kernels=["after"], targets=[("cpu", "fp64")], checks=["dx"]))
>>> all(r.as_expected for r in results)
True
"""

from gradcheck_bi._version import __version__
from gradcheck_bi.api import GradcheckFailure, GradcheckSkipped, Report, check
from gradcheck_bi.gate import exit_code
from gradcheck_bi.kernels import BUNDLED
from gradcheck_bi.runner import run as run_sweep
from gradcheck_bi.sweep import Sweep
from gradcheck_bi.vocab import Config, KernelSpec, Measurement, Result, Unsupported

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
