"""The forward-evaluation floor of a full dx + dw check, and the check timed beside it.

A black-box per-element check cannot do less than run the kernel's forward on every batch
of rows it needs: for dx the unperturbed ``(R, D)`` once and ``stencil.points × D × R``
perturbed rows of length ``D``, in the very chunks :func:`gradcheck_bi.fd.input_grad`
uses; for dw ``stencil.points + 1`` calls on ``(R, D)``. :func:`forward_floor` runs exactly
those forward calls (on unperturbed copies of the rows: the same work) and nothing else.
:func:`side_by_side` alternates the full check and the floor ``reps`` times in one process,
so both see the same machine state, and returns their medians and the ratio the
performance target is judged by.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from gradcheck_bi import fd, inputs
from gradcheck_bi.checks import run_check
from gradcheck_bi.inputs import make_inputs
from gradcheck_bi.kernels.rmsnorm import After
from gradcheck_bi.vocab import DTYPES, Config


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _timed(fn: Callable[[], Any], device: str, cpu: list[float] | None = None) -> float:
    _sync(device)
    t, c = time.perf_counter(), time.process_time()
    fn()
    _sync(device)
    if cpu is not None:
        cpu.append(time.process_time() - c)
    return time.perf_counter() - t


def forward_floor(shape: tuple[int, int], dtype: str, device: str, part: int = 0,
                  parts: int = 1) -> tuple[Callable[[], None], int]:
    """A callable that runs every forward evaluation of the dx + dw check (or every
    ``parts``-th chunk from ``part`` on, and no whole-batch call unless ``part`` is 0), and
    their count."""
    cfg = Config(check="dx", shape=shape, dtype=dtype, device=device)
    x, w, _ = make_inputs(cfg)
    rows, cols = shape
    stencil = fd.CENTRAL4
    n_c, n_r = fd.chunk_shape(rows, cols, stencil, DTYPES[dtype], None, device)
    n_c, n_r = min(n_c, cols), min(n_r, rows)
    bufs = []  # one buffer per distinct chunk shape, as input_grad keeps one per row block
    for r0 in range(0, rows, n_r):
        block = x[r0 : r0 + n_r]
        buf = block.repeat(stencil.points * n_c, 1)
        for c0 in range(0, cols, n_c):
            k = min(n_c, cols - c0)
            bufs.append(buf[: stencil.points * k * block.shape[0]])
    bufs = bufs[part::parts]

    # dx's unperturbed y0; dw at each point and unperturbed
    whole = 1 + stencil.points + 1 if part == 0 else 0

    chunk_elements = stencil.points * n_c * n_r * cols

    def run() -> None:
        # the threads the check's chunk loop gets (fd.threads), for the same batches
        with torch.no_grad(), fd.threads.cpu_threads(torch.device(device), chunk_elements):
            for b in bufs:
                After.apply(b, w, cfg.eps, False)
            for _ in range(whole):
                After.apply(x, w, cfg.eps, False)

    return run, len(bufs) + whole


def _floor_part(shape: tuple[int, int], dtype: str, part: int, parts: int) -> None:
    """A spawned process's share of a spread floor: one torch thread, every ``parts``-th
    chunk."""
    fd.threads.fix_threads(1)
    fd.budget.keep_freed_memory()
    forward_floor(shape, dtype, "cpu", part, parts)[0]()


def spread_floor(shape: tuple[int, int], dtype: str, processes: int) -> Callable[[], None]:
    """The CPU floor as a large check spreads its chunks (fd.chunks): this process runs its
    share on one thread while ``processes - 1`` spawned processes, started at the same moment
    (so their start-up counts, as the check's workers' does), run theirs."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    mine = forward_floor(shape, dtype, "cpu", 0, processes)[0]

    def run() -> None:
        others = [ctx.Process(target=_floor_part, args=(shape, dtype, k, processes))
                  for k in range(1, processes)]
        for p in others:
            p.start()
        previous = fd.threads.fixed_threads()
        fd.threads.fix_threads(1)  # one thread here too, as the check's main process runs
        try:
            mine()
        finally:
            fd.threads.fix_threads(previous)
            for p in others:
                p.join()

    return run


def full_check(shape: tuple[int, int], dtype: str, device: str) -> Callable[[], tuple[bool, bool]]:
    """dx then dw of one configuration, as a run measures them: the inputs are drawn once
    (for dx; dw reuses the kept draw), never carried over from an earlier repetition."""
    cfg = {k: Config(check=k, shape=shape, dtype=dtype, device=device) for k in ("dx", "dw")}

    def run() -> tuple[bool, bool]:
        inputs.forget_draws()
        return run_check(After, cfg["dx"]).passed, run_check(After, cfg["dw"]).passed

    return run


def side_by_side(shape: tuple[int, int], dtype: str, device: str, reps: int,
                 floor_processes: int = 1) -> dict[str, Any]:
    """Medians of the full check and of its forward floor, alternated ``reps`` times after a
    warm-up; ``ratio`` = check / floor. CPU time is reported beside wall time (a shared
    machine makes wall time wait for a core)."""
    check = full_check(shape, dtype, device)
    floor, calls = forward_floor(shape, dtype, device)
    if floor_processes > 1:
        floor = spread_floor(shape, dtype, floor_processes)
    if device == "cuda":  # Triton compiles, the allocator grows: keep both out of the timing
        check()
        floor()
    else:  # the same code paths on a small shape, so the one-time imports are paid
        full_check((2, 64), dtype, device)()
        forward_floor((2, 64), dtype, device)[0]()
    checks, floors, check_cpu, floor_cpu = [], [], [], []  # type: ignore[var-annotated]
    for _ in range(reps):
        checks.append(_timed(check, device, check_cpu))
        floors.append(_timed(floor, device, floor_cpu))
    passed = check()
    c, f = statistics.median(checks), statistics.median(floors)
    cc, fc = statistics.median(check_cpu), statistics.median(floor_cpu)
    return {"shape": list(shape), "dtype": dtype, "device": device, "passed": list(passed),
            "check_s": c, "floor_s": f, "ratio": c / f, "forward_calls": calls,
            "floor_processes": floor_processes,
            "check_all": checks, "floor_all": floors,
            "check_cpu_s": cc, "floor_cpu_s": fc, "ratio_cpu": cc / fc}
