"""One point measured in this process: its check run, what the kernel raised judged.

:func:`run_point` is the whole of what happens to a point wherever it runs — in the process
that writes the report, or in a worker process (:mod:`gradcheck_bi.workers`);
:class:`PointMeasurer` adds the probe each kernel gets once per (device, dtype).

Anything the kernel raises is a result of that point: ``SystemExit``, ``GeneratorExit`` and
a ``KeyboardInterrupt`` the kernel raised itself included (a gate must never take a kernel's
``sys.exit(0)`` for a pass). What stops the run instead: gradcheck-bi's own slip (exit 4,
:func:`~gradcheck_bi.kernels.calling.trace.is_internal`), the user's Ctrl-C and memory exhausted
(:func:`~gradcheck_bi.kernels.calling.trace.stops_the_run`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from gradcheck_bi.checks import run_check
from gradcheck_bi.checks.precision import Working, measure
from gradcheck_bi.checks.probe import probe
from gradcheck_bi.checks.twins import Twins
from gradcheck_bi.gate import expected, judge, judge_raised
from gradcheck_bi.generic import load_spec as _generic  # noqa: F401  (run --generic)
from gradcheck_bi.kernels.calling.trace import is_internal, stops_the_run
from gradcheck_bi.kernels.calling.writes import declared_mutations
from gradcheck_bi.sweep import Sweep
from gradcheck_bi.vocab import Config, KernelSpec, Measurement, Result


def run_point(spec: KernelSpec, cfg: Config, sweep: Sweep, refused: str | None,
              check: Callable[[Any, Config], Measurement] = run_check) -> Result:
    """Measure one point by ``check``; what the kernel raised is judged by
    :func:`~gradcheck_bi.gate.judge.judge_raised` (a refusal, a broken contract, a crash)."""
    must = expected(spec, cfg, sweep)
    if refused is not None:
        return judge(spec.name, must, cfg, status="unsupported", message=refused)
    try:
        allowed = spec.allow_mutation | frozenset(sweep.allow_mutation)
        with declared_mutations(allowed) as mutations:
            measurement = check(spec.fn, cfg)
    except BaseException as exc:  # the kernel's own failure, reported per result
        if stops_the_run(exc) or is_internal(exc):
            raise  # the user's Ctrl-C; gradcheck-bi's own bug: exit 4, never the kernel's
        return judge_raised(spec.name, must, cfg, exc)
    result = judge(spec.name, must, cfg, measurement)
    if spec.mismatch and cfg.check == "forward" and not measurement.passed:
        # names said one op, the output matches another (kernels/adapting/behaviour.py)
        result.message = f"{result.message}; {spec.mismatch}" if result.message \
            else spec.mismatch
    if mutations:  # declared by the kernel: a note, never a pass in silence
        note = "declared mutation: " + "; ".join(mutations)
        result.message = f"{result.message}; {note}" if result.message else note
        result.details["declared_mutation"] = list(mutations)
    return result


class PointMeasurer:
    """:func:`run_point` with each kernel probed, and its working precision measured
    (:mod:`gradcheck_bi.checks.precision`), once per (device, dtype); a layout point's
    gradient judged by its contiguous twin where that decides (:mod:`gradcheck_bi.checks.
    twins`)."""

    def __init__(self) -> None:
        self.twins = Twins()
        self.refusals: dict[tuple[str, str, str], str | None] = {}
        self.working: dict[tuple[str, str, str, str], Working] = {}

    def __call__(self, spec: KernelSpec, cfg: Config, sweep: Sweep) -> Result:
        key = (spec.name, cfg.device, cfg.dtype)
        if key not in self.refusals:
            self.refusals[key] = probe(spec, cfg.device, cfg.dtype, cfg)
        working = Working(None)
        if self.refusals[key] is None:
            working = self._working(spec, cfg)
            cfg = replace(cfg, working_precision=working.precision)
        result = run_point(spec, cfg, sweep, self.refusals[key], self.twins.check)
        result.working_precision = cfg.working_precision
        if working.fallback:  # one note per kernel says it (cli.execute.working_notes)
            result.details["working_precision_fallback"] = working.fallback
        return result

    def _working(self, spec: KernelSpec, cfg: Config) -> Working:
        key = (spec.name, cfg.device, cfg.dtype, cfg.precision)
        if key not in self.working:
            try:
                self.working[key] = measure(spec, cfg)
            except BaseException as exc:  # decides nothing: each point reports its own
                if stops_the_run(exc) or is_internal(exc):
                    raise
                self.working[key] = Working(None)
        return self.working[key]
