"""``gradcheck-bi run``'s execution: load the kernels, measure the points (or one shard of
them) with progress on stderr, and say what ran nothing; the environment for the JSON."""

from __future__ import annotations

import contextlib
import gc
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from rich.console import Console

from gradcheck_bi import gpu
from gradcheck_bi.fd import reduce
from gradcheck_bi.kernels.calling import watch
from gradcheck_bi.runner import resolve_kernels, run_points, sweep_points
from gradcheck_bi.shard import select
from gradcheck_bi.sums import reduction
from gradcheck_bi.sweep import Sweep, not_run, unchecked
from gradcheck_bi.upfront import check_memory
from gradcheck_bi.vocab import Result


def environment() -> dict[str, Any]:
    """What ran the checks (stable from run to run on one machine)."""
    import platform

    import torch

    env: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda_available": gpu.present(),
        "reduction": reduce.described(),
    }
    version = reduction.triton_version()
    if version is not None:
        env["triton"] = version
    if gpu.present():  # after the run: its workers are done
        env["gpu"] = torch.cuda.get_device_name(0)
    return env


@contextlib.contextmanager
def measuring() -> Iterator[None]:
    """Around a command's measurements: the cyclic collector (off while the CLI loads:
    :func:`gradcheck_bi.cli.main`) on again, with what is loaded by now — torch, the kernel's
    library, millions of objects — frozen out of its full passes, and handed back after."""
    gc.freeze()
    gc.enable()
    try:
        yield
    finally:
        gc.unfreeze()


def progress_bar(enabled: bool) -> tuple[Any, Any]:
    if not enabled:
        return None, None
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    progress = Progress(TextColumn("[progress.description]{task.description}"), BarColumn(),
                        MofNCompleteColumn(), console=Console(stderr=True), transient=True)
    task = progress.add_task("checking", total=None)

    def on_result(r: Result, done: int, total: int) -> None:
        progress.update(task, completed=done, total=total,
                        description=f"{r.kernel} {r.check} {r.device}/{r.dtype}")

    def on_slow_first_call(fn: Any, shape: tuple[int, ...]) -> None:
        name = getattr(fn, "__name__", None) or type(fn).__name__
        progress.update(task, description=f"compiling / autotuning {name} at "
                                          f"{'×'.join(str(d) for d in shape)}")

    watch.listen(on_slow_first_call)
    return progress, on_result


def print_tracebacks(results: list[Result]) -> None:
    """--debug: the whole traceback of each distinct kernel error, once, with its count."""
    errors: dict[tuple[str, str], list[Result]] = {}
    for r in results:
        if r.status == "error" and r.trace:
            errors.setdefault((r.kernel, r.message), []).append(r)
    for (kernel, message), same in errors.items():
        sys.stderr.write(f"--- {kernel}: {message} ({len(same)} result"
                         f"{'s' if len(same) != 1 else ''}) ---\n{same[0].trace}")


@dataclass
class Executed:
    """What a run measured: its results, one note per kernel and zcg setting not run,
    (kernel, why) for each kernel that ran nothing, and the shard it was (if any)."""

    results: list[Result]
    notes: list[str]
    idle: list[tuple[str, str]]
    shard: dict[str, Any] | None = None


def execute(sweeps: list[Sweep], progress: bool, shard: tuple[int, int] | None = None
            ) -> Executed:
    """Load the kernels and measure every point of ``sweeps`` — or, with ``shard=(K, N)``,
    the points of shard K of N (:mod:`gradcheck_bi.shard`); what ran nothing is decided on
    the whole grid, so that every shard says the same about it."""
    refs = list(dict.fromkeys(k for sweep in sweeps for k in sweep.kernels))
    limits = [s.timeout for s in sweeps if s.timeout]  # a hang at load: the same limit
    specs = resolve_kernels(refs, {k: v for s in sweeps for k, v in s.kernel_args.items()},
                            max(limits) if limits else None)
    points = sweep_points(sweeps, specs)
    check_memory(points)  # the whole grid, before any point runs: every shard refuses alike
    _directional_note(sweeps)  # after the refusal: bad input stays one line
    for spec in specs:  # which op each user kernel was read as, and from which names
        if spec.recognised:
            sys.stderr.write(f"gradcheck-bi: note: {spec.name}: {spec.recognised}\n")
    idle = unchecked(sweeps, specs, (spec.name for spec, _, _ in points))
    meta = None
    if shard is not None:
        picked = select([cfg for _, cfg, _ in points], *shard,
                        kernels=[spec.name for spec, _, _ in points])
        meta = {"index": shard[0], "count": shard[1], "points": len(points),
                "positions": picked}
        points = [points[i] for i in picked]
    bar, on_result = progress_bar(progress and sys.stderr.isatty())
    with measuring():
        if bar is None:
            results = run_points(points)
        else:
            try:
                with bar:
                    results = run_points(points, on_result)
            finally:
                watch.listen(None)
    working_notes(results)
    kink_notes(results)
    # A kernel that ran nothing is named by the verdict; the notes are for partial drops.
    partly = [spec for spec in specs if spec.name not in {kernel for kernel, _ in idle}]
    return Executed(results, not_run(sweeps, partly), idle, meta)


def working_notes(results: list[Result]) -> None:
    """One note per kernel and target judged at a measured working precision coarser than
    its dtype, or whose working precision was not found (:mod:`gradcheck_bi.checks.
    precision`: why, and that the checks fall back to the dtype's rounding)."""
    seen = dict.fromkeys((r.kernel, r.device, r.dtype, r.working_precision) for r in results
                         if r.working_precision is not None)
    for kernel, device, dtype, working in seen:
        sys.stderr.write(f"gradcheck-bi: note: {kernel}: computes in {working} inside at "
                         f"{dtype} ({device}); judged at {working} rounding "
                         "(--precision exact: at the dtype's)\n")
    fallbacks = dict.fromkeys((r.kernel, r.device, r.dtype,
                               r.details.get("working_precision_fallback")) for r in results)
    for kernel, device, dtype, why in fallbacks:
        if why:
            sys.stderr.write(f"gradcheck-bi: note: {kernel} ({dtype}, {device}): {why}\n")


def kink_notes(results: list[Result]) -> None:
    """One note per kernel and check whose finite differences met elements not
    differentiable within the stencil (:mod:`gradcheck_bi.checks.fd_judge`): how many
    results, elements and unjudged elements; the message of each result says more."""
    seen: dict[tuple[str, str], list[int]] = {}
    for r in results:
        n = r.details.get("not_differentiable")
        if n:
            tally = seen.setdefault((r.kernel, r.check), [0, 0, 0])
            tally[0] += 1
            tally[1] += n
            tally[2] += r.details.get("not_differentiable_unjudged", 0)
    unfound = {r.kernel for r in results if r.details.get("working_precision_fallback")}
    for (kernel, check), (points, elements, left) in seen.items():
        # at the dtype's rounding, rounding the model misses reads as kinks
        maybe = " (or rounding: its working precision was not found)" if kernel in unfound \
            else ""
        sys.stderr.write(f"gradcheck-bi: note: {kernel}: {check}: {elements} elements at "
                         f"{points} point(s) not differentiable within the FD stencil (±4h)"
                         f"{maybe}, judged at h/16; {left} left unjudged (see each result's "
                         "message)\n")


def _directional_note(sweeps: list[Sweep]) -> None:
    if any(sweep.mode == "directional" for sweep in sweeps):
        Console(stderr=True, highlight=False).print(
            "note: --mode directional checks dx only along random directions "
            f"({', '.join(sorted({str(sw.directions) for sw in sweeps}))} per row); "
            "individual dx elements are not checked. dw is checked in full.", markup=False)
