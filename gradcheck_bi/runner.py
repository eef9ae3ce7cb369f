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
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch

from gradcheck_bi.checks import run_check
from gradcheck_bi.checks.probe import probe
from gradcheck_bi.fd import threads as fd_threads
from gradcheck_bi.fd.chunks import main_module_hidden
from gradcheck_bi.gate import expected, judge, judge_raised
from gradcheck_bi.kernels import resolve
from gradcheck_bi.kernels.call import declared_mutations
from gradcheck_bi.kernels.loader import normal_ref
from gradcheck_bi.kernels.trace import is_internal
from gradcheck_bi.sweep import Sweep, grid
from gradcheck_bi.upfront import preload_cpu_sums
from gradcheck_bi.vocab import (
    Config,
    KernelSpec,
    Result,
)


def resolve_kernels(refs: list[str], kernel_args: dict[str, Any] | None = None
                    ) -> list[KernelSpec]:
    """Load every kernel once, up front: a kernel that cannot load stops the run (exit 2).

    Two spellings of one file (``./k.py:F``, ``k.py:F``) are one kernel."""
    first = {normal_ref(ref): ref for ref in reversed(refs)}
    return [resolve(first[key], kernel_args)
            for key in dict.fromkeys(normal_ref(ref) for ref in refs)]


def run_point(spec: KernelSpec, cfg: Config, sweep: Sweep, refused: str | None) -> Result:
    """Measure one point; what the kernel raised is judged by
    :func:`~gradcheck_bi.gate.judge.judge_raised` (a refusal, a broken contract, a crash)."""
    must = expected(spec, cfg, sweep)
    if refused is not None:
        return judge(spec.name, must, cfg, status="unsupported", message=refused)
    try:
        allowed = spec.allow_mutation | frozenset(sweep.allow_mutation)
        with declared_mutations(allowed) as mutations:
            measurement = run_check(spec.fn, cfg)
    except (KeyboardInterrupt, MemoryError):
        raise
    except Exception as exc:  # the kernel's own failure, reported per result
        if is_internal(exc):
            raise  # gradcheck-bi's own bug: exit 4, never blamed on the kernel
        return judge_raised(spec.name, must, cfg, exc)
    result = judge(spec.name, must, cfg, measurement)
    if mutations:  # declared by the kernel: a note, never a pass in silence
        note = "declared mutation: " + "; ".join(mutations)
        result.message = f"{result.message}; {note}" if result.message else note
        result.details["declared_mutation"] = list(mutations)
    return result


def run_points(
    points: list[tuple[KernelSpec, Config, Sweep]],
    on_result: Callable[[Result, int, int], None] | None = None,
    devices: list[str] | None = None,
) -> list[Result]:
    """Measure and judge each ``(kernel, config, its sweep)`` point, probing each kernel once
    per (device, dtype); ``on_result(result, done, total)`` reports progress.

    ``devices``: one worker process per entry measures a share of the points there
    (:func:`spread`); ``None`` means every visible GPU when there are two or more and some
    point runs on CUDA. The results come back in the order of ``points`` whatever worker
    measured them, so the report is the one a single process writes.
    """
    if devices is None:
        devices = visible_gpus(points)
    if len(devices) >= 2 and len(points) >= 2 and _refs_or_none(points) is not None:
        return spread(points, devices, on_result)
    preload_cpu_sums(points)  # the points are measured here
    measure = _PointMeasurer()
    results = []
    for i, (spec, cfg, sweep) in enumerate(points):
        results.append(measure(spec, cfg, sweep))
        if on_result is not None:
            on_result(results[-1], i + 1, len(points))
    return results


class _PointMeasurer:
    """:func:`run_point` with each kernel probed once per (device, dtype)."""

    def __init__(self) -> None:
        self.refusals: dict[tuple[str, str, str], str | None] = {}

    def __call__(self, spec: KernelSpec, cfg: Config, sweep: Sweep) -> Result:
        key = (spec.name, cfg.device, cfg.dtype)
        if key not in self.refusals:
            self.refusals[key] = probe(spec, cfg.device, cfg.dtype, cfg)
        return run_point(spec, cfg, sweep, self.refusals[key])


def visible_gpus(points: list[tuple[KernelSpec, Config, Sweep]]) -> list[str]:
    """``cuda:0 … cuda:N-1`` when N ≥ 2 GPUs are visible and some point runs on CUDA."""
    if not any(cfg.device == "cuda" for _, cfg, _ in points) or not torch.cuda.is_available():
        return []
    n = torch.cuda.device_count()
    return [f"cuda:{i}" for i in range(n)] if n >= 2 else []


def _refs_or_none(points: list[tuple[KernelSpec, Config, Sweep]]) -> list[str] | None:
    """Each point's kernel as a reference a fresh process can load; ``None`` if one cannot
    be (a Function handed to the API directly)."""
    refs = _refs([spec for spec, _, _ in points])
    return None if any(spec.source == "api" for spec, _, _ in points) else refs


def spread(
    points: list[tuple[KernelSpec, Config, Sweep]],
    devices: list[str],
    on_result: Callable[[Result, int, int], None] | None = None,
) -> list[Result]:
    """Measure the points on every device at once; return the results in the order of
    ``points``.

    This process measures on ``devices[0]``; one spawned process per further device measures
    there (its device made the current one, so ``device="cuda"`` means that GPU, and the
    kernels loaded from their references). Each takes the next unclaimed point from a shared
    counter and measures it exactly as :func:`run_points` does in one process: a point's
    inputs come from its own seed, so its result does not depend on where it ran or what ran
    there before.
    """
    import torch.multiprocessing as mp

    refs = _refs_or_none(points)
    if refs is None:
        raise ValueError("spread needs kernels that a fresh process can load by reference")
    ctx = mp.get_context("spawn")
    tasks = [(ref, cfg, sweep) for ref, (_, cfg, sweep) in zip(refs, points, strict=True)]
    claim, done = _Claim(ctx), ctx.Queue()
    workers = [ctx.Process(target=_worker, daemon=True,
                           args=(k, dev, fd_threads.fixed_threads(), tasks, claim, done))
               for k, dev in enumerate(devices[1:])]
    with main_module_hidden():
        for w in workers:
            w.start()
    try:
        with _on_device(devices[0]):
            return _measure_and_collect(points, claim, done, workers, on_result)
    finally:
        claim.close()
        for w in workers:
            w.join(timeout=10)
            if w.is_alive():
                w.terminate()


class _Claim:
    """A counter shared by the processes of one spread: ``next()`` claims a point index."""

    def __init__(self, ctx: Any) -> None:
        self.value = ctx.Value("q", 0)

    def next(self) -> int:
        with self.value.get_lock():
            i = int(self.value.value)
            self.value.value = i + 1
        return i

    def close(self) -> None:  # no point is claimed after this
        with self.value.get_lock():
            self.value.value = 1 << 62


@contextlib.contextmanager
def _on_device(device: str) -> Iterator[None]:
    if not device.startswith("cuda"):
        yield
        return
    previous = torch.cuda.current_device()
    torch.cuda.set_device(device)
    try:
        yield
    finally:
        torch.cuda.set_device(previous)


def _measure_and_collect(points: list[tuple[KernelSpec, Config, Sweep]], claim: _Claim,
                         done: Any, workers: list[Any],
                         on_result: Callable[[Result, int, int], None] | None) -> list[Result]:
    """Measure claimed points here and gather the workers' results until every worker has
    signed off. A worker that fails (its message, or its death without one) is reported in
    a warning, and the points it left are measured here: the report is complete either way.
    """
    import queue

    total = len(points)
    results: list[Result | None] = [None] * total
    measure, n = _PointMeasurer(), 0
    signed: dict[int, str | None] = {}  # worker → None (clean) or why it stopped

    def record(i: int, result: Result) -> None:
        nonlocal n
        results[i], n = result, n + 1
        if on_result is not None:
            on_result(result, n, total)

    def take(item: tuple[int, int, Any]) -> None:
        k, i, payload = item
        if i >= 0:
            record(i, payload)
        else:
            signed[k] = payload

    while (i := claim.next()) < total:
        record(i, measure(*points[i]))
        while not done.empty():
            take(done.get())
    while len(signed) < len(workers):
        try:
            take(done.get(timeout=1.0))
        except queue.Empty:
            for k, w in enumerate(workers):
                if k not in signed and not w.is_alive() and done.empty():
                    signed[k] = f"worker {k + 1} exited with code {w.exitcode}"
    failures = [why for why in signed.values() if why is not None]
    if failures:
        warnings.warn(f"gradcheck-bi: {'; '.join(failures)}: its points ran in the main "
                      "process", RuntimeWarning, stacklevel=3)
    for i, r in enumerate(results):
        if r is None:
            record(i, measure(*points[i]))
    return [r for r in results if r is not None]


def _worker(number: int, device: str, threads: int | None,
            tasks: list[tuple[str, Config, Sweep]], claim: _Claim, done: Any) -> None:
    """One spawned worker: measure claimed points on ``device`` until none is left."""
    try:
        if device.startswith("cuda"):
            torch.cuda.set_device(device)
        fd_threads.apply_policy(threads)
        measure = _PointMeasurer()
        specs: dict[str, KernelSpec] = {}
        while (i := claim.next()) < len(tasks):
            ref, cfg, sweep = tasks[i]
            if ref not in specs:
                specs[ref] = resolve(ref, sweep.kernel_args)
            done.put((number, i, measure(specs[ref], cfg, sweep)))
        done.put((number, -1, None))
    except BaseException as exc:  # the parent must hear of it, or it waits forever
        done.put((number, -1, f"worker on {device} stopped: {type(exc).__name__}: {exc}"))


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
    return points
