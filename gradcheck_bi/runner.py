"""The runner: probe each kernel, measure every point, judge it — for a sweep or a case.

Kernels are loaded once, up front (a kernel that cannot load stops the run: exit 2). Each
kernel is probed once per (device, dtype) with a tiny forward; a refusal there makes that
target's results ``unsupported``; a crash is no refusal (each point then reports its own
``error``). Every point is then measured by its check
(:mod:`gradcheck_bi.checks`) and judged against what it must show (:mod:`gradcheck_bi.gate`).

>>> from gradcheck_bi.sweep import Sweep
>>> s = Sweep(kernels=["after"], targets=[("cpu", "fp64")], checks=["forward"])
>>> [r.status for r in run(s)][:3]
['pass', 'pass', 'pass']
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gradcheck_bi import fd
from gradcheck_bi.checks import run_check
from gradcheck_bi.checks.probe import probe, refusal
from gradcheck_bi.gate import expected, judge
from gradcheck_bi.kernels import resolve
from gradcheck_bi.kernels.loader import normal_ref
from gradcheck_bi.sweep import Sweep, grid
from gradcheck_bi.vocab import (
    DTYPES,
    HALF_DTYPES,
    Config,
    KernelSpec,
    Result,
    Unsupported,
    first_line,
)


def check_memory(sweep: Sweep) -> None:
    """Refuse up front (``fd.MemoryBudgetError``, with the estimate) a shape whose dx or dw
    check cannot fit in ``sweep.max_memory``."""
    for _, dtype in sweep.targets:
        if not {"dx", "dw"} & set(sweep.checks_for(dtype)) or dtype in HALF_DTYPES:
            continue
        for shape in sweep.shapes:
            checked = tuple(shape)
            if sweep.mode == "directional":  # one stacked row per (direction, row)
                checked = (sweep.directions, *checked)
            fd.check_budget(checked, fd.STENCILS[sweep.stencil], DTYPES[dtype],
                            sweep.max_memory)


def resolve_kernels(refs: list[str], kernel_args: dict[str, Any] | None = None
                    ) -> list[KernelSpec]:
    """Load every kernel once, up front: a kernel that cannot load stops the run (exit 2).

    Two spellings of one file (``./k.py:F``, ``k.py:F``) are one kernel."""
    first = {normal_ref(ref): ref for ref in reversed(refs)}
    return [resolve(first[key], kernel_args)
            for key in dict.fromkeys(normal_ref(ref) for ref in refs)]


def run_point(spec: KernelSpec, cfg: Config, sweep: Sweep, refused: str | None) -> Result:
    """Measure one point; a kernel's exception is ``unsupported`` when it is an explicit
    refusal of the device or dtype (:func:`~gradcheck_bi.checks.probe.refusal`), else an
    ``error`` result (a crash: exit 1), with its message either way."""
    must = expected(spec, cfg, sweep)
    if refused is not None:
        return judge(spec.name, must, cfg, status="unsupported", message=refused)
    try:
        measurement = run_check(spec.fn, cfg)
    except Unsupported as exc:
        return judge(spec.name, must, cfg, status="unsupported", message=str(exc))
    except (KeyboardInterrupt, MemoryError):
        raise
    except Exception as exc:  # the kernel's own failure, reported per result
        why = refusal(exc)
        if why is not None:
            return judge(spec.name, must, cfg, status="unsupported",
                         message=f"kernel refuses {cfg.device}/{cfg.dtype}: {why}")
        return judge(spec.name, must, cfg, status="error", message=first_line(exc))
    return judge(spec.name, must, cfg, measurement)


def run_points(
    points: list[tuple[KernelSpec, Config, Sweep]],
    on_result: Callable[[Result, int, int], None] | None = None,
) -> list[Result]:
    """Measure and judge each ``(kernel, config, its sweep)`` point, probing each kernel once
    per (device, dtype); ``on_result(result, done, total)`` reports progress."""
    refusals: dict[tuple[str, str, str], str | None] = {}
    results = []
    for i, (spec, cfg, sweep) in enumerate(points):
        key = (spec.name, cfg.device, cfg.dtype)
        if key not in refusals:
            refusals[key] = probe(spec, cfg.device, cfg.dtype)
        results.append(run_point(spec, cfg, sweep, refusals[key]))
        if on_result is not None:
            on_result(results[-1], i + 1, len(points))
    return results


def run(
    sweep: Sweep,
    kernels: list[KernelSpec] | None = None,
    on_result: Callable[[Result, int, int], None] | None = None,
) -> list[Result]:
    """Run every point of the sweep; ``on_result(result, done, total)`` reports progress."""
    specs = kernels if kernels is not None else resolve_kernels(sweep.kernels,
                                                                sweep.kernel_args)
    return run_points([(spec, cfg, sweep) for spec, cfg in grid(sweep, specs)], on_result)


def _specs_for(sweep: Sweep, specs: list[KernelSpec]) -> list[KernelSpec]:
    by_ref = dict(zip(_refs(specs), specs, strict=True))
    return list({id(s): s for s in (by_ref[normal_ref(k)] for k in sweep.kernels)}.values())


def _refs(specs: list[KernelSpec]) -> list[str]:
    return [s.source if s.source != "bundled" else s.name for s in specs]


def run_sweeps(
    sweeps: list[Sweep],
    specs: list[KernelSpec] | None = None,
    on_result: Callable[[Result, int, int], None] | None = None,
) -> list[Result]:
    """Run several sweeps as one: block order, each shared point once, one probe per target.

    ``specs`` are the kernels of every sweep, loaded up front (see
    :func:`~gradcheck_bi.sweep.resolve_kernels`); ``on_result(result, done, total)``
    reports progress over all of them.
    """
    if specs is None:
        specs = resolve_kernels([k for s in sweeps for k in s.kernels],
                                {k: v for s in sweeps for k, v in s.kernel_args.items()})
    points = []
    seen: set[tuple[str, Config]] = set()
    for s in sweeps:
        for spec, cfg in grid(s, _specs_for(s, specs)):
            if (spec.name, cfg) not in seen:
                seen.add((spec.name, cfg))
                points.append((spec, cfg, s))
    return run_points(points, on_result)
