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
"""

from __future__ import annotations

import unittest
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from gradcheck_bi.gate import EXIT_UNEXPECTED, EXIT_UNSUPPORTED, exit_code
from gradcheck_bi.kernels import resolve
from gradcheck_bi.report.tables import describe
from gradcheck_bi.runner import run
from gradcheck_bi.sweep import Sweep
from gradcheck_bi.vocab import KernelSpec, Result


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
        if self.unsupported:
            lines.append(f"  ({len(self.unsupported)} unsupported here, e.g. "
                         f"{self.unsupported[0].message})")
        return "\n".join(lines)


def _spec(fn: Any) -> KernelSpec:
    if isinstance(fn, KernelSpec):
        return fn
    if isinstance(fn, str):
        return resolve(fn)
    if not callable(getattr(fn, "apply", None)):
        raise TypeError(f"check() needs an autograd Function with apply(x, weight, eps, "
                        f"zero_centered_gamma), a kernel name or ref; got {type(fn).__name__}")
    name = getattr(fn, "__qualname__", None) or type(fn).__name__
    return KernelSpec(name, fn, (), source="api")


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
    **sweep_options: Any,
) -> Report:
    """Check ``fn`` (an autograd Function with Megatron's signature) over a small sweep.

    Every axis takes a list, as in a case file; ``checks=None`` runs every check the dtype
    supports. ``expect="fail"`` states that every result must fail. ``sweep_options`` are
    further :class:`~gradcheck_bi.sweep.Sweep` fields (``atol``, ``rtol``, ``stencil``,
    ``step_rel``, ``max_memory``). Raises :class:`GradcheckFailure` when a result is not as
    expected (with ``strict=True``, also when any is unsupported) and
    :class:`GradcheckSkipped` when every result is unsupported, unless
    ``raise_on_failure=False``; returns the :class:`Report`.
    """
    spec = _spec(fn)
    sweep = Sweep(
        kernels=[spec.name], targets=[(device, dtype)],
        shapes=[tuple(s) for s in shapes], input_scales=list(input_scales),
        weight_scales=list(weight_scales), eps=list(eps), seeds=list(seeds),
        checks=list(checks) if checks is not None else None, weights=list(weights),
        zcg=list(zcg), expect=expect if spec.source != "bundled" else None, **sweep_options,
    )
    report = Report(run(sweep, [spec]), strict)
    if raise_on_failure and report.exit_code == EXIT_UNEXPECTED:
        raise GradcheckFailure(report)
    if raise_on_failure and report.exit_code == EXIT_UNSUPPORTED and all(
            r.status == "unsupported" for r in report.results):
        raise GradcheckSkipped(report)
    return report
