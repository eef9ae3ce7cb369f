"""The runner: probe each kernel, measure every point, judge it — for a sweep or a case.

Kernels are loaded once, up front (a kernel that cannot load stops the run: exit 2). Each
kernel is probed once per (device, dtype) with a forward at its first point's shape; a
refusal there makes that target's results ``unsupported``; a crash is no refusal (each
point then reports its own ``error``). Every point is then measured by its check
(:mod:`gradcheck_bi.checks`) and judged against what it must show (:mod:`gradcheck_bi.gate`).

>>> from gradcheck_bi.sweep import Sweep
>>> s = Sweep(kernels=["after"], targets=[("cpu", "fp64")], checks=["forward"])
>>> [r.status for r in run(s)][:3]
['pass', 'pass', 'pass']
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any

from gradcheck_bi import gpu, workers
from gradcheck_bi.fd import threads as fd_threads
from gradcheck_bi.kernels import resolve
from gradcheck_bi.kernels.adapting import sandbox
from gradcheck_bi.kernels.adapting.loader import Crashed, crashed, normal_ref
from gradcheck_bi.measure import PointMeasurer
from gradcheck_bi.sweep import Sweep, grid
from gradcheck_bi.upfront import preload_cpu_sums
from gradcheck_bi.vocab import (
    Config,
    KernelCrashed,
    KernelSpec,
    Result,
)


def resolve_kernels(refs: list[str], kernel_args: dict[str, Any] | None = None,
                    timeout: float | None = None) -> list[KernelSpec]:
    """Load every kernel once, up front: a kernel that cannot load stops the run (exit 2).

    Two spellings of one file (``./k.py:F``, ``k.py:F``) are one kernel.
    A kernel that crashes or hangs while it is recognised (in a child process:
    :mod:`gradcheck_bi.kernels.adapting.sandbox`, past ``timeout`` seconds) is one ``error`` result
    (:func:`~gradcheck_bi.kernels.adapting.loader.crashed`); the others still run."""
    first = {normal_ref(ref): ref for ref in reversed(refs)}
    with sandbox.limit(timeout):
        return [_resolved(first[key], kernel_args)
                for key in dict.fromkeys(normal_ref(ref) for ref in refs)]


def _resolved(ref: str, kernel_args: dict[str, Any] | None) -> KernelSpec:
    try:
        return resolve(ref, kernel_args)
    except KernelCrashed as exc:
        return crashed(ref, str(exc))


def run_points(
    points: list[tuple[KernelSpec, Config, Sweep]],
    on_result: Callable[[Result, int, int], None] | None = None,
    devices: list[str] | None = None,
) -> list[Result]:
    """Measure and judge each ``(kernel, config, its sweep)`` point, probing each kernel once
    per (device, dtype); ``on_result(result, done, total)`` reports progress. The results
    come back in the order of ``points``.

    The points run in worker processes (:mod:`gradcheck_bi.workers`: a kernel that crashes,
    exits or hangs costs its point, not the run), unless ``GRADCHECK_BI_ISOLATE=0`` keeps
    them in this process. ``devices``: the GPUs of the CUDA workers; ``None`` means every
    visible GPU when there are two or more and some point runs on CUDA.
    """
    if devices is None:
        devices = visible_gpus(points)
    preload_cpu_sums(points)  # here: a forked worker inherits what was loaded
    if isolated():
        start = "fork" if sys.platform.startswith("linux") else "spawn"
        return workers.measure(points, on_result, devices or None, cpu_start=start)
    fd_threads.apply_policy(fd_threads.fixed_threads())
    measure = PointMeasurer()
    results = []
    for i, (spec, cfg, sweep) in enumerate(points):
        results.append(measure(spec, cfg, sweep))
        if on_result is not None:
            on_result(results[-1], i + 1, len(points))
    return results


def isolated() -> bool:
    """Whether points run in worker processes (``GRADCHECK_BI_ISOLATE=0``, or inside
    :func:`measured_here`: in this process; a fault then ends the run)."""
    return os.environ.get("GRADCHECK_BI_ISOLATE", "1") != "0" and not _here


_here = False


@contextlib.contextmanager
def measured_here() -> Iterator[None]:
    """Within: every point measured in this process, as with ``GRADCHECK_BI_ISOLATE=0`` —
    for tools that watch a run from inside it (a profiler, a recorder of what the kernel
    receives), which would otherwise see none of the work."""
    global _here
    before, _here = _here, True
    try:
        yield
    finally:
        _here = before


def visible_gpus(points: list[tuple[KernelSpec, Config, Sweep]]) -> list[str]:
    """``cuda:0 … cuda:N-1`` when N ≥ 2 GPUs are visible and some point runs on CUDA."""
    if not any(cfg.device == "cuda" for _, cfg, _ in points) or not gpu.present():
        return []
    n = gpu.count()  # without starting CUDA here: its workers are forked (gradcheck_bi.gpu)
    return [f"cuda:{i}" for i in range(n)] if n >= 2 else []


def run(
    sweep: Sweep,
    kernels: list[KernelSpec] | None = None,
    on_result: Callable[[Result, int, int], None] | None = None,
) -> list[Result]:
    """Run every point of the sweep; ``on_result(result, done, total)`` reports progress."""
    specs = kernels if kernels is not None else resolve_kernels(sweep.kernels,
                                                                sweep.kernel_args)
    return run_points(once_if_crashed([(spec, cfg, sweep) for spec, cfg in grid(sweep, specs)]),
                      on_result)


def _specs_for(sweep: Sweep, specs: list[KernelSpec]) -> list[KernelSpec]:
    by_ref = {s.ref: s for s in specs}
    return list({id(s): s for s in (by_ref[normal_ref(k)] for k in sweep.kernels)}.values())


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
    return run_points(sweep_points(sweeps, specs), on_result)


def sweep_points(sweeps: list[Sweep], specs: list[KernelSpec]
                 ) -> list[tuple[KernelSpec, Config, Sweep]]:
    """Every point of several sweeps, in block order, each shared point once."""
    points = []
    seen: set[tuple[str, Config]] = set()
    for s in sweeps:
        for spec, cfg in grid(s, _specs_for(s, specs)):
            if (spec.name, cfg) not in seen:
                seen.add((spec.name, cfg))
                points.append((spec, cfg, s))
    return once_if_crashed(points)


def once_if_crashed(points: list[tuple[KernelSpec, Config, Sweep]]
                    ) -> list[tuple[KernelSpec, Config, Sweep]]:
    """The points, a kernel that crashed at load (:class:`~gradcheck_bi.kernels.adapting.loader.
    Crashed`) at its first only: one ``error`` result says it, not one per point."""
    first: set[str] = set()
    kept = []
    for point in points:
        if isinstance(point[0].fn, Crashed):
            if point[0].name in first:
                continue
            first.add(point[0].name)
        kept.append(point)
    return kept
