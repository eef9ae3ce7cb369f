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

>>> from gradcheck_bi.kernels.bundled.rmsnorm import After, Before
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

import torch

from gradcheck_bi.cases import check_values
from gradcheck_bi.fd import threads as fd_threads
from gradcheck_bi.gate import EXIT_UNEXPECTED, EXIT_UNSUPPORTED, Summary, summarize, verdict_line
from gradcheck_bi.generic import own_checks, prepare
from gradcheck_bi.kernels import adapt, resolve
from gradcheck_bi.kernels.adapting.loader import crashed
from gradcheck_bi.point import BY_KEY
from gradcheck_bi.report.tables import describe
from gradcheck_bi.runner import run
from gradcheck_bi.sweep import not_run, sweep_of, unchecked
from gradcheck_bi.vocab import (
    DEVICES,
    DTYPE_ALIASES,
    DTYPES,
    KernelCrashed,
    KernelLoadError,
    KernelSpec,
    Result,
    did_you_mean,
)


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
    strict: bool = False  # an unsupported result, or nothing checked, is not as expected
    # One line per zcg setting the kernel was not run at (it has no zcg, or has it built in).
    not_run: list[str] = field(default_factory=list)
    # (kernel, why) when every point asked of the kernel was dropped: nothing was checked.
    unchecked: list[tuple[str, str]] = field(default_factory=list)
    # What a generic check measured and left out (its dependency pattern, no forward).
    notes: list[str] = field(default_factory=list)

    @property
    def summary(self) -> Summary:
        return summarize(self.results, self.strict, self.unchecked)

    @property
    def exit_code(self) -> int:
        """The CLI's code for these results: 0 as expected; 1 not (or, when ``strict``, any
        unsupported or nothing checked); 3 nothing wrong, but unsupported or nothing checked."""
        return self.summary.code

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    @property
    def failed(self) -> list[Result]:
        """Results not as expected (a wrong gradient, a kernel error, a defect not shown)."""
        return self.summary.unexpected

    @property
    def unsupported(self) -> list[Result]:
        return self.summary.unsupported

    def __str__(self) -> str:
        lines = ["gradcheck-bi: " + verdict_line(self.summary)]
        lines += ["  " + describe(r) for r in self.failed]
        lines += [f"  (not run: {note})" for note in self.not_run]
        lines += [f"  ({note})" for note in self.notes]
        if self.unsupported:
            lines.append(f"  ({len(self.unsupported)} unsupported here, e.g. "
                         f"{self.unsupported[0].message})")
        return "\n".join(lines)


# The sweep keys check() takes (gradcheck_bi.point: every case key of the point, by the case
# files' names); device, dtype and zcg are its own arguments. A crossed axis takes a list.
_LISTS = (*(key for key, axis in BY_KEY.items() if axis.plural and key != "zcg"),
          "allow_mutation")
_SETTINGS = (*(key for key, axis in BY_KEY.items() if not axis.plural), "expect", "timeout")
_ZCG = {"off": [False], "on": [True], "both": [False, True]}


def _as_list(name: str, value: Any) -> Any:
    """A single value as a list of one (``eps=1e-5``, ``checks="dx"``, ``shapes=(4, 64)``);
    tuples as lists, as a case file has them. Anything else is left to the validators."""
    if name == "shapes" and isinstance(value, (list, tuple)) and value and all(
            isinstance(d, int) and not isinstance(d, bool) for d in value):
        return [list(value)]
    if isinstance(value, (str, int, float)) or value is None:
        return [value]
    if isinstance(value, (list, tuple)):
        return [list(v) if isinstance(v, tuple) else v for v in value]
    return value


def _zcg(value: Any) -> list[bool]:
    __tracebackhide__ = True
    if isinstance(value, bool):
        return [value]
    if isinstance(value, str) and value in _ZCG:
        return list(_ZCG[value])
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, bool) for v in value):
        return list(dict.fromkeys(value))
    raise ValueError(f"check(): argument 'zcg': expected a bool, 'off', 'on', 'both' or a "
                     f"non-empty list of bools, got {value!r}{did_you_mean(value, tuple(_ZCG))}")


def _dtype(value: Any) -> str:
    __tracebackhide__ = True
    if isinstance(value, torch.dtype):
        names = {dt: name for name, dt in DTYPES.items()}
        if value in names:
            return names[value]
    elif isinstance(value, str) and (value in DTYPES or value in DTYPE_ALIASES):
        return DTYPE_ALIASES.get(value, value)
    allowed = (*DTYPES, *DTYPE_ALIASES)
    raise ValueError(f"check(): argument 'dtype': expected one of {', '.join(DTYPES)} (or "
                     f"torch's name or torch.dtype), got {value!r}{did_you_mean(value, allowed)}")


def sweep_values(*, device: str, dtype: Any, zcg: Any, **values: Any) -> dict[str, Any]:
    """:func:`check`'s arguments → validated :class:`~gradcheck_bi.sweep.Sweep` fields, by
    the case files' rules (:func:`gradcheck_bi.cases.check_values`): a ``ValueError`` for a
    bad value, a ``TypeError`` for an unknown keyword, before any kernel is loaded."""
    __tracebackhide__ = True
    known = (*_LISTS, *_SETTINGS)
    for name in values:
        if name not in known:
            near = did_you_mean(name, (*known, "device", "dtype", "zcg", "strict",
                                       "raise_on_failure", "kernel_args"))
            raise TypeError(f"check() got an unexpected keyword argument {name!r}{near}")
    if device not in DEVICES:
        near = " (did you mean 'cuda'?)" if device == "gpu" else did_you_mean(device, DEVICES)
        raise ValueError(f"check(): argument 'device': expected one of {', '.join(DEVICES)}, "
                         f"got {device!r}{near}")
    checks = values.pop("checks")
    given = {k: (_as_list(k, v) if k in _LISTS else v) for k, v in values.items()}
    if checks is not None:
        given["checks"] = _as_list("checks", checks)
    checked = check_values(given, "check()")
    return {**checked, "zcg": _zcg(zcg), "targets": [(device, _dtype(dtype))],
            "shapes": [tuple(s) for s in checked["shapes"]]}


def _spec(fn: Any, kernel_args: dict[str, Any] | None) -> KernelSpec:
    __tracebackhide__ = True
    if isinstance(fn, KernelSpec):
        return fn
    name = fn if isinstance(fn, str) else getattr(fn, "__qualname__", None) or type(fn).__name__
    try:
        if isinstance(fn, str):
            return resolve(fn, kernel_args)
        return adapt(fn, name, "api", kernel_args)
    except KernelLoadError as exc:
        if isinstance(fn, str):
            raise
        raise TypeError(str(exc)) from None
    except KernelCrashed as exc:  # one error result; nothing of it ran
        return crashed(name, str(exc))


def check(
    fn: Any,
    *,
    checks: Sequence[str] | str | None = None,
    weights: Sequence[str] | str = ("randn", "ones", "zeros"),
    zcg: Sequence[bool] | bool | str = (False, True),
    shapes: Sequence[Sequence[int]] | Sequence[int] = ((2, 8, 256),),
    device: str = "cpu",
    dtype: str | torch.dtype = "fp64",
    eps: Sequence[float] | float = (1e-6,),
    seeds: Sequence[int] | int = (0,),
    input_scales: Sequence[float] | float = (1.0,),
    weight_scales: Sequence[float] | float = (1.0,),
    expect: str = "pass",
    strict: bool = False,
    raise_on_failure: bool = True,
    kernel_args: dict[str, Any] | None = None,
    threads: int | None = None,
    inputs: Sequence[Any] | None = None,
    **sweep_options: Any,
) -> Report:
    """Check ``fn`` over a small sweep: an autograd Function, a function
    ``f(x, weight, eps[, zero_centered_gamma])``, an nn.Module class or factory, or a kernel
    name (``"after"``, ``"torch"``, ``"liger"``, ``"PATH.py:ATTR"``). ``kernel_args`` fill
    parameters the adapter cannot (as ``--kernel-arg``). ``threads`` pins torch's CPU
    threads as ``--threads`` does (default: ``OMP_NUM_THREADS``, else the CLI's choice by
    work size); the caller's thread settings are restored afterwards.

    Every axis takes a list, as in a case file (a single value is a list of one);
    ``checks=None`` runs every check. ``zcg`` takes a bool, ``"off"``/``"on"``/``"both"``
    or a list of bools; ``dtype`` the CLI's names, torch's (``"bfloat16"``) or a
    ``torch.dtype``. ``expect="fail"`` states that every result must fail. ``sweep_options``
    are the case files' other keys (``atol``, ``rtol``, ``stencil``, ``step_rel``,
    ``max_memory``, ``mode``, ``directions``, ``layouts``, ``allow_mutation``, ``timeout``
    — seconds a point may run before it is an ``error``, none by default; for the
    other ops ``biases``, ``group_sizes``, ``norm_before_gate``). Every argument is
    validated before any kernel runs, with the case files' rules: a bad value is a
    ``ValueError`` naming it, an unknown keyword a ``TypeError``.

    ``inputs``: example arguments (tensors, as :func:`torch.autograd.gradcheck` takes
    them) for a kernel that computes no op here — the **generic check**
    (:mod:`gradcheck_bi.generic`): every floating input's gradient per element against
    central differences of the kernel's own forward, at the examples' dtype and device,
    its dependency pattern measured and said in the report's notes, no forward check.

    Raises :class:`GradcheckFailure` when a result is not as expected (with ``strict=True``,
    also when any is unsupported or nothing was checked) and :class:`GradcheckSkipped` when
    nothing could be checked here (every result unsupported, or every point dropped),
    unless ``raise_on_failure=False``; returns the :class:`Report`.
    """
    __tracebackhide__ = True  # pytest: the user's call, not our frames, leads the report
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int)
                                or threads < 1):
        raise ValueError(f"threads={threads!r}: expected an integer >= 1, or None")
    own: list[str] = []
    if inputs is not None and checks is not None:  # a generic kernel's gradients are
        checks, own = own_checks(_as_list("checks", checks))  # named by its parameters
    values = sweep_values(checks=checks, weights=weights, zcg=zcg, shapes=shapes,
                          device=device, dtype=dtype, eps=eps, seeds=seeds,
                          input_scales=input_scales, weight_scales=weight_scales,
                          expect=expect, **sweep_options)
    notes: list[str] = []
    with fd_threads.policy(threads):  # adapting a kernel may call it too
        if inputs is not None:
            generic = prepare(fn, inputs)
            spec, notes = generic.spec, list(generic.notes)
            values["targets"] = [(generic.device, generic.dtype)]
            if own:
                values["checks"] = [*(values.get("checks") or []), *own]
        else:
            spec = _spec(fn, kernel_args)
        if spec.source == "bundled":
            values.pop("expect")  # a bundled kernel's declared defects say what it must show
        sweep = sweep_of(kernels=[spec.name], **values)
        results = run(sweep, [spec])
    idle = unchecked([sweep], [spec], (r.kernel for r in results))
    report = Report(results, strict, [] if idle or inputs is not None
                    else not_run([sweep], [spec]), idle, notes)
    if raise_on_failure and report.exit_code == EXIT_UNEXPECTED:
        raise GradcheckFailure(report)
    if raise_on_failure and report.exit_code == EXIT_UNSUPPORTED and (
            idle or all(r.status == "unsupported" for r in report.results)):
        raise GradcheckSkipped(report)
    return report
