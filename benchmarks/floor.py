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
from gradcheck_bi.checks import check_dw, check_dx
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


def forward_floor(shape: tuple[int, int], dtype: str, device: str) -> tuple[Callable[[], None],
                                                                            int]:
    """A callable that runs every forward evaluation of the dx + dw check, and their count."""
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

    whole = 1 + stencil.points + 1  # dx's unperturbed y0; dw at each point and unperturbed

    chunk_elements = stencil.points * n_c * n_r * cols

    def run() -> None:
        # the threads the check's chunk loop gets (fd.threads), for the same batches
        with torch.no_grad(), fd.threads.cpu_threads(torch.device(device), chunk_elements):
            for b in bufs:
                After.apply(b, w, cfg.eps, False)
            for _ in range(whole):
                After.apply(x, w, cfg.eps, False)

    return run, len(bufs) + whole


def full_check(shape: tuple[int, int], dtype: str, device: str) -> Callable[[], tuple[bool, bool]]:
    """dx then dw of one configuration, as a run measures them: the inputs are drawn once
    (for dx; dw reuses the kept draw), never carried over from an earlier repetition."""
    cfg = {k: Config(check=k, shape=shape, dtype=dtype, device=device) for k in ("dx", "dw")}

    def run() -> tuple[bool, bool]:
        inputs.forget_draws()
        return check_dx(After, cfg["dx"]).passed, check_dw(After, cfg["dw"]).passed

    return run


def side_by_side(shape: tuple[int, int], dtype: str, device: str, reps: int) -> dict[str, Any]:
    """Medians of the full check and of its forward floor, alternated ``reps`` times after a
    warm-up; ``ratio`` = check / floor. CPU time is reported beside wall time (a shared
    machine makes wall time wait for a core)."""
    check = full_check(shape, dtype, device)
    floor, calls = forward_floor(shape, dtype, device)
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
            "check_all": checks, "floor_all": floors,
            "check_cpu_s": cc, "floor_cpu_s": fc, "ratio_cpu": cc / fc}
