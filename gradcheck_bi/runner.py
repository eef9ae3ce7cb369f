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
from gradcheck_bi.ops import SHAPED
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
    order = execution_order(points)
    ordered = [points[i] for i in order]
    if isolated():
        start = "fork" if sys.platform.startswith("linux") else "spawn"
        done = workers.measure(ordered, on_result, devices or None, cpu_start=start)
    else:
        if (kept := sandbox.take_kept()) is not None:  # no worker to become
            kept.release()
        fd_threads.apply_policy(fd_threads.fixed_threads())
        measure = PointMeasurer()
        done = []
        for n, (spec, cfg, sweep) in enumerate(ordered):
            done.append(measure(spec, cfg, sweep))
            if on_result is not None:
                on_result(done[-1], n + 1, len(points))
    results: list[Result | None] = [None] * len(points)
    for i, result in zip(order, done, strict=True):
        results[i] = result
    return [r for r in results if r is not None]


# The order an op of any shape's checks of one draw run in: a gradient check derives the
# error model with its backward, which the forward check then reuses (checks.shaped.model).
_CHECK_RANK = {"forward": 1, "batch_invariance": 2}


def execution_order(points: list[tuple[KernelSpec, Config, Sweep]]) -> list[int]:
    """The order to measure ``points`` in (indices): the points of an op of any shape that
    share one draw (kernel, device, dtype, shape, seed, variant, input scale — any check,
    any layout) one after another, at the first one's place, gradient checks first, each
    group and every other point in the given order. They share the draw and its error
    model (:mod:`gradcheck_bi.checks.shaped_point`, :func:`gradcheck_bi.checks.shaped.model`)
    instead of each drawing and deriving its own; every point's result is what it was
    alone."""
    first: dict[Any, int] = {}
    keys = []
    for i, (spec, cfg, _) in enumerate(points):
        if cfg.op not in SHAPED:  # a norm's point: where it is
            keys.append((i, 0, i))
            continue
        group = (id(spec), cfg.device, cfg.dtype, cfg.shape, cfg.seed, cfg.variant,
                 cfg.input_scale)
        keys.append((first.setdefault(group, i), _CHECK_RANK.get(cfg.check, 0), i))
    return sorted(range(len(points)), key=keys.__getitem__)


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
