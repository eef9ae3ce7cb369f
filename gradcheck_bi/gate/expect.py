"""What each point must show: a case's rules, ``--expect``, then the kernel's declared defects.

A bundled defective kernel declares where its defect must show; everywhere else it must
pass — that is what makes γ=ones a *blind control* rather than a measurement. Every other
kernel is expected to pass everywhere unless ``--expect fail`` says otherwise.

>>> from gradcheck_bi.kernels import resolve
>>> from gradcheck_bi.sweep import Sweep
>>> from gradcheck_bi.vocab import Config
>>> expected(resolve("before"), Config(check="dx", control="randn"), Sweep())
'fail'
>>> expected(resolve("before"), Config(check="dx", control="ones"), Sweep())
'pass'
"""

from __future__ import annotations

from gradcheck_bi.sweep import Sweep
from gradcheck_bi.vocab import Config, KernelSpec


def declared(spec: KernelSpec, cfg: Config) -> str:
    """``"fail"`` where one of the kernel's declared defects must show, else ``"pass"``."""
    shows = any(d.shows(cfg.check, cfg.zero_centered_gamma, cfg.control) for d in spec.defects)
    return "fail" if shows else "pass"


def expected(spec: KernelSpec, cfg: Config, sweep: Sweep) -> str:
    """The status ``spec`` must show at ``cfg``: the last matching rule, else ``expect``
    (kernels that declare nothing), else the declared defects."""
    for rule in reversed(sweep.expectations):
        if rule.matches(spec.name, cfg):
            return rule.status
    # --expect overrides only kernels that declare nothing: bundled ones know their defects.
    if sweep.expect is not None and spec.source != "bundled":
        return sweep.expect
    return declared(spec, cfg)
