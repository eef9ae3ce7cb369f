"""``check(fn, ...)``: the sweep from inside a test suite, no CLI, no Typer, no Rich.

Put a γ=randn gradient check next to an existing parity test::

    import gradcheck_bi
    from my_project.norms import MyRMSNormFn

    def test_rmsnorm_backward_moves_with_gamma():
        gradcheck_bi.check(MyRMSNormFn, checks=["dx", "dw"], shapes=[(4, 1000)])

``check`` raises :class:`GradcheckFailure` (an ``AssertionError``, so pytest shows it as a
failed assertion) listing every result that was not as expected — a wrong gradient, a defect
not shown, or a kernel that raised (``error``: anything but an explicit refusal of the device
or dtype). When *every* result is ``unsupported`` (``device="cuda"`` without a GPU, a kernel
refusing the dtype) it raises :class:`GradcheckSkipped`, a ``unittest.SkipTest``, so pytest
reports a skip rather than a pass; ``strict=True`` makes any ``unsupported`` a failure. With
``raise_on_failure=False`` it raises neither and returns the :class:`Report` to inspect.

>>> from gradcheck_bi.kernels.rmsnorm import After, Before
>>> check(After, checks=["dx"], weights=["randn"], shapes=[(3, 16)]).ok
True
>>> report = check(Before, checks=["dx"], weights=["randn"], zcg=[False], shapes=[(3, 16)],
...                raise_on_failure=False)
>>> report.exit_code, report.failed[0].status
(1, 'fail')
>>> import torch
>>> check(torch.nn.RMSNorm, dtype="fp32", checks=["dx"], shapes=[(3, 16)]).not_run
['RMSNorm: zcg=on results not run — zero_centered_gamma is absent (γ = w)']
"""

from __future__ import annotations

import unittest
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from gradcheck_bi.gate import EXIT_UNEXPECTED, EXIT_UNSUPPORTED, exit_code
from gradcheck_bi.kernels import adapt, resolve
from gradcheck_bi.report.tables import describe
from gradcheck_bi.runner import run
from gradcheck_bi.sweep import Sweep, not_run
from gradcheck_bi.vocab import KernelLoadError, KernelSpec, Result


class GradcheckFailure(AssertionError):
    """Some results were not as expected; ``.report`` holds all of them."""

    def __init__(self, report: Report) -> None:
        super().__init__(str(report))
        self.report = report


class GradcheckSkipped(unittest.SkipTest):
    """Every result was ``unsupported`` here: nothing was checked. ``.report`` holds them.

    A ``unittest.SkipTest``, so pytest and unittest report the test as skipped.
    """

    def __init__(self, report: Report) -> None:
        super().__init__(str(report))
        self.report = report


@dataclass
class Report:
    """The results of one :func:`check` call and what they add up to."""

    results: list[Result] = field(default_factory=list)
    strict: bool = False  # an unsupported result counts as not as expected
    # One line per zcg setting the kernel was not run at (it has no zcg, or has it built in).
    not_run: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        """The CLI's code for these results: 0 as expected, 1 not (or any unsupported when
        ``strict``), 3 nothing wrong but something unsupported."""
        return exit_code(self.results, strict=self.strict)

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    @property
    def failed(self) -> list[Result]:
        """Results not as expected (a wrong gradient, a kernel error, a defect not shown)."""
        return [r for r in self.results if not r.as_expected and r.status != "unsupported"]

    @property
    def unsupported(self) -> list[Result]:
        return [r for r in self.results if r.status == "unsupported"]

    def __str__(self) -> str:
        if self.failed:
            head = (f"gradcheck-bi: {len(self.failed)} of {len(self.results)} results not as "
                    "expected")
        elif self.unsupported and self.strict:
            head = (f"gradcheck-bi: {len(self.unsupported)} of {len(self.results)} results "
                    "unsupported here (strict)")
        elif self.unsupported and len(self.unsupported) == len(self.results):
            head = f"gradcheck-bi: all {len(self.results)} results unsupported here"
        else:
            head = f"gradcheck-bi: all {len(self.results)} results as expected"
        lines = [head] + ["  " + describe(r) for r in self.failed]
        lines += [f"  (not run: {note})" for note in self.not_run]
        if self.unsupported:
            lines.append(f"  ({len(self.unsupported)} unsupported here, e.g. "
                         f"{self.unsupported[0].message})")
        return "\n".join(lines)


def _spec(fn: Any, kernel_args: dict[str, Any] | None) -> KernelSpec:
    if isinstance(fn, KernelSpec):
        return fn
    if isinstance(fn, str):
        return resolve(fn, kernel_args)
    name = getattr(fn, "__qualname__", None) or type(fn).__name__
    try:
        return adapt(fn, name, "api", kernel_args)
    except KernelLoadError as exc:
        raise TypeError(str(exc)) from None


def check(
    fn: Any,
    *,
    checks: Sequence[str] | None = None,
    weights: Sequence[str] = ("randn", "ones", "zeros"),
    zcg: Sequence[bool] = (False, True),
    shapes: Sequence[Sequence[int]] = ((2, 8, 256),),
    device: str = "cpu",
    dtype: str = "fp64",
    eps: Sequence[float] = (1e-6,),
    seeds: Sequence[int] = (0,),
    input_scales: Sequence[float] = (1.0,),
    weight_scales: Sequence[float] = (1.0,),
    expect: str = "pass",
    strict: bool = False,
    raise_on_failure: bool = True,
    kernel_args: dict[str, Any] | None = None,
    **sweep_options: Any,
) -> Report:
    """Check ``fn`` over a small sweep: an autograd Function, a function
    ``f(x, weight, eps[, zero_centered_gamma])``, an nn.Module class or factory, or a kernel
    name (``"after"``, ``"torch"``, ``"liger"``, ``"PATH.py:ATTR"``). ``kernel_args`` fill
    parameters the adapter cannot (as ``--kernel-arg``).

    Every axis takes a list, as in a case file; ``checks=None`` runs every check the dtype
    supports. ``expect="fail"`` states that every result must fail. ``sweep_options`` are
    further :class:`~gradcheck_bi.sweep.Sweep` fields (``atol``, ``rtol``, ``stencil``,
    ``step_rel``, ``max_memory``). Raises :class:`GradcheckFailure` when a result is not as
    expected (with ``strict=True``, also when any is unsupported) and
    :class:`GradcheckSkipped` when every result is unsupported, unless
    ``raise_on_failure=False``; returns the :class:`Report`.
    """
    spec = _spec(fn, kernel_args)
    sweep = Sweep(
        kernels=[spec.name], targets=[(device, dtype)],
        shapes=[tuple(s) for s in shapes], input_scales=list(input_scales),
        weight_scales=list(weight_scales), eps=list(eps), seeds=list(seeds),
        checks=list(checks) if checks is not None else None, weights=list(weights),
        zcg=list(zcg), expect=expect if spec.source != "bundled" else None, **sweep_options,
    )
    report = Report(run(sweep, [spec]), strict, not_run([sweep], [spec]))
    if raise_on_failure and report.exit_code == EXIT_UNEXPECTED:
        raise GradcheckFailure(report)
    if raise_on_failure and report.exit_code == EXIT_UNSUPPORTED and all(
            r.status == "unsupported" for r in report.results):
        raise GradcheckSkipped(report)
    return report
