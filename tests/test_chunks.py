"""The dx chunk loop: the same sums here or spread over spawned processes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from chunk_workers import Announcing, WaitsForWorker
from conftest import rand

from gradcheck_bi import fd
from gradcheck_bi.fd.chunks import ChunkLoop, loadable_elsewhere, run_chunks
from gradcheck_bi.kernels import resolve
from gradcheck_bi.kernels.call import forward_in_x
from gradcheck_bi.kernels.rmsnorm import After


def _loop(forward, sums: torch.Tensor, plain=None) -> ChunkLoop:  # type: ignore[no-untyped-def]
    """The loop of a (5, 96) dx check; ``plain`` (default ``forward``) computes its y0."""
    x2, g2 = rand(5, 96, seed=61), rand(5, 96, seed=62)
    with torch.no_grad():
        y0 = (plain or forward)(x2).double()
    h = fd.row_steps(x2, 1e-6, fd.step.input_step_rel(torch.float64, None))
    delta = fd.stencil.level_offsets()[:, None] * h[None, :]
    return ChunkLoop(forward, x2, g2, y0, delta, (7, 2), sums, native=False)


def _sums() -> torch.Tensor:
    return torch.full((6, 96, 5), float("nan"), dtype=torch.float64)


def _spread_with_a_worker(forward, tmp_path: Path) -> ChunkLoop:  # type: ignore[no-untyped-def]
    """The loop run by this process and one spawned worker, each computing some chunks."""
    marker = tmp_path / "worker-started"
    slow = WaitsForWorker(forward, marker, 0.05)
    spread = _loop(slow, _sums(), forward)
    run_chunks(spread, 2, Announcing(forward, marker))
    assert marker.exists(), "the worker computed no chunk: nothing tested"
    assert slow.calls < len(spread.tasks()), "this process computed every chunk"
    return spread


def test_one_row_block_buffer_is_held_at_a_time() -> None:
    forward = forward_in_x(After, rand(96, seed=63), 1e-6, False)
    loop = _loop(forward, _sums())  # 5 rows in blocks of 2: three row blocks
    held = []
    for r0, c0 in loop.tasks():
        loop.run(r0, c0)
        held.append(len(loop._blocks))
    assert max(held) == 1 and {r0 for r0, _ in loop.tasks()} == {0, 2, 4}


def test_processes_give_the_bits_of_one_process(tmp_path: Path) -> None:
    forward = forward_in_x(After, rand(96, seed=63), 1e-6, False)
    here = _loop(forward, _sums())
    run_chunks(here)
    assert not here.sums.isnan().any()
    assert loadable_elsewhere(forward)
    spread = _spread_with_a_worker(forward, tmp_path)
    assert torch.equal(spread.sums, here.sums)


def test_a_failing_worker_leaves_its_chunks_to_this_process(tmp_path: Path) -> None:
    forward = forward_in_x(After, rand(96, seed=63), 1e-6, False)
    here = _loop(forward, _sums())
    run_chunks(here)
    marker = tmp_path / "worker-started"
    spread = _loop(WaitsForWorker(forward, marker, 0.05), _sums(), forward)
    # The worker's forward raises on the first chunk it takes.
    with pytest.warns(RuntimeWarning, match="left 1 chunk"):
        run_chunks(spread, 2, Announcing(forward, marker, fail=True))
    assert torch.equal(spread.sums, here.sums)


def test_only_kernels_a_fresh_process_can_import_are_shipped() -> None:
    w = rand(8)
    assert loadable_elsewhere(forward_in_x(After, w, 1e-6, False))
    mutant = resolve("tests/mutants/m15_eps_outside_sqrt.py")  # loaded from a file
    assert not loadable_elsewhere(forward_in_x(mutant.fn, w, 1e-6, False))
    assert not loadable_elsewhere(lambda t: t)


def test_spread_only_for_cpu_in_auto_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fd.threads, "usable_cores", lambda: 4)
    big = fd.threads.PARALLEL_MIN_ELEMENTS
    assert fd.threads.spread_processes(torch.device("cpu"), big) == 4
    monkeypatch.setattr(fd.threads, "usable_cores", lambda: 64)  # a large host: capped
    assert fd.threads.spread_processes(torch.device("cpu"), big) == fd.threads.MAX_PROCESSES
    monkeypatch.setattr(fd.threads, "usable_cores", lambda: 4)
    assert fd.threads.spread_processes(torch.device("cpu"), big - 1) == 1
    assert fd.threads.spread_processes(torch.device("meta"), big) == 1
    try:
        fd.threads.fix_threads(2)  # --threads N: threads in this process, no workers
        assert fd.threads.spread_processes(torch.device("cpu"), big) == 1
    finally:
        fd.threads.fix_threads(None)


def test_workers_use_the_backend_forced_here(tmp_path: Path) -> None:
    # Under use_backend("triton") (the interpreter on CPU) the worker must reduce the same
    # way: its chunks' bits equal this process's.
    from gradcheck_bi.kernels.reduction import triton_available, use_backend

    if not triton_available():
        pytest.skip("triton is not installed")
    forward = forward_in_x(After, rand(96, seed=63), 1e-6, False)
    with use_backend("triton"):
        here = _loop(forward, _sums())
        run_chunks(here)
        spread = _spread_with_a_worker(forward, tmp_path)
    assert torch.equal(spread.sums, here.sums)


UNGUARDED = """
import sys, time, torch
with open(sys.argv[1], "a") as f:  # every run of this file's top level leaves a line
    f.write("ran\\n")
from gradcheck_bi import fd
from gradcheck_bi.fd.chunks import ChunkLoop, run_chunks
from gradcheck_bi.kernels.call import forward_in_x
from gradcheck_bi.kernels.rmsnorm import After

forward = forward_in_x(After, torch.ones(64, dtype=torch.float64), 1e-6, False)

def slow(x):
    time.sleep(0.3)
    return forward(x)

x2 = torch.randn(2, 64, dtype=torch.float64)
with torch.no_grad():
    y0 = forward(x2)
delta = fd.stencil.level_offsets()[:, None] * torch.full((2,), 1e-3, dtype=torch.float64)
sums = torch.zeros(6, 64, 2, dtype=torch.float64)
run_chunks(ChunkLoop(slow, x2, x2, y0, delta, (8, 2), sums, False), 2, forward)
print("sums finite:", bool(torch.isfinite(sums).all()))
"""


def test_a_script_without_a_main_guard_is_not_run_again_by_a_worker(tmp_path: Path) -> None:
    script, marker = tmp_path / "unguarded.py", tmp_path / "ran.txt"
    script.write_text(UNGUARDED)
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, str(script), str(marker)], capture_output=True,
                          text=True, timeout=120, cwd=root,
                          env={**os.environ, "PYTHONPATH": str(root)})
    assert done.returncode == 0, done.stderr[-2000:]
    assert "sums finite: True" in done.stdout
    assert marker.read_text().count("ran") == 1, "a worker ran the caller's script again"
