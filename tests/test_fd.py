"""Finite differences: chunking never changes bits, the memory budget is honoured, the
directional mode projects the analytic gradient correctly."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from conftest import rand, where_differs

from gradcheck_bi import fd
from gradcheck_bi.fd.chunks import perturbed
from gradcheck_bi.fd.stencil import stencil_estimate, stencil_sum
from gradcheck_bi.fd.weight import weight_shape
from gradcheck_bi.kernels.bundled.rmsnorm import After
from gradcheck_bi.tolerance import noise


def _forward(w: torch.Tensor):  # type: ignore[no-untyped-def]
    return lambda t: After.apply(t, w, 1e-6, False)


def test_chunk_shape_respects_the_budget() -> None:
    bpe = fd.BYTES_PER_ELEMENT[torch.float64]
    fixed = fd.FIXED_BYTES_PER_ELEMENT * 16 * 8192
    cols, rows = fd.chunk_shape(16, 8192, fd.CENTRAL4, torch.float64, fixed + 8 * 6 * 8192 * bpe)
    assert (cols, rows) == (1, 8)  # room for 48 rows: 6 points × 8 rows
    # With a GPU's room: 2 calls of 512 rows (a batch size of the batch invariance check)
    # rather than one of 4096 holding 768 rows.
    cols, rows = fd.chunk_shape(2, 64, fd.CENTRAL4, torch.float64, 1 << 40, "cuda")
    assert (cols, rows) == (32, 2)


def test_a_shape_over_budget_is_refused_with_the_estimate() -> None:
    with pytest.raises(fd.MemoryBudgetError, match=r"needs at least .*GiB.*budget of 1\.0 GiB"):
        fd.check_budget((1 << 20, 4096), fd.CENTRAL4, torch.float64, 1 << 30)
    fd.check_budget((16, 8192), fd.CENTRAL4, torch.float64, 1 << 30)


def test_default_budget_is_derived_from_the_machine_when_asked() -> None:
    from gradcheck_bi.fd import budget

    assert budget.default_max_memory() >= 256 << 20
    assert budget.budget(None) == budget.default_max_memory()
    assert budget.budget(12345) == 12345


def test_freed_memory_is_kept_without_running_ldconfig(monkeypatch: pytest.MonkeyPatch) -> None:
    """glibc's mallopt by its soname: ``find_library`` starts ``ldconfig`` in a subprocess,
    which every forked worker paid again."""
    import ctypes.util
    import platform

    from gradcheck_bi.fd import budget

    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        pytest.skip("glibc only")

    def no_subprocess(name: str) -> str:
        raise AssertionError(f"find_library({name!r}) was asked")

    monkeypatch.setattr(ctypes.util, "find_library", no_subprocess)
    monkeypatch.setattr(budget, "_kept_up_to", 0)
    assert budget.keep_freed_memory()


@pytest.mark.parametrize(("text", "expected"), [
    ("512M", 512 << 20), ("2G", 2 << 30), ("1.5GiB", 3 << 29), ("4096", 4096), ("64kb", 64 << 10),
])
def test_sizes_are_parsed_in_one_place(text: str, expected: int) -> None:
    assert fd.parse_bytes(text) == expected


@pytest.mark.parametrize("text", ["", "lots", "-1G", "0", "2X"])
def test_bad_sizes_are_refused(text: str) -> None:
    with pytest.raises(ValueError):
        fd.parse_bytes(text)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_directional_projections_match_the_analytic_gradient(dtype: torch.dtype) -> None:
    x, g = rand(2, 3, 512, dtype=dtype, seed=10), rand(2, 3, 512, dtype=dtype, seed=11)
    w = rand(512, dtype=dtype, seed=12)
    xr = x.clone().requires_grad_(True)
    After.apply(xr, w, 1e-6, False).backward(g)
    assert xr.grad is not None
    est = fd.directional_input_grad(_forward(w), x, g, 1e-6, directions=5, seed=3)
    assert est.projection.shape == (5, 2, 3) and est.directions.shape == (5, 2, 3, 512)
    analytic = (xr.grad.double()[None] * est.directions).sum(-1)
    err = (analytic - est.projection).abs()
    assert bool((err <= est.noise_floor).all()), f"max err {float(err.max()):.3e}"
    # A wrong gradient (one element off by 1e-3) moves the projections far past the floor.
    bad = xr.grad.double().clone()
    bad[1, 2, 100] += 1e-3 if dtype == torch.float64 else 1e-1
    err_bad = ((bad[None] * est.directions).sum(-1) - est.projection).abs()
    assert float(err_bad.max()) > float(est.noise_floor.max())


def test_directional_chunking_never_changes_a_bit() -> None:
    x, g, w = rand(3, 64, seed=13), rand(3, 64, seed=14), rand(64, seed=15)
    a = fd.directional_input_grad(_forward(w), x, g, 1e-6, directions=4)
    floor = fd.memory_estimate(12, 64, fd.CENTRAL4, torch.float64)
    b = fd.directional_input_grad(_forward(w), x, g, 1e-6, directions=4, max_memory=floor)
    assert b.forward_calls > a.forward_calls
    assert torch.equal(a.projection, b.projection) and torch.equal(a.noise_floor, b.noise_floor)


def test_cli_refuses_a_shape_over_budget_up_front(capsys: pytest.CaptureFixture[str]) -> None:
    from gradcheck_bi.cli import main

    code = main(["run", "--device", "cpu", "--dtype", "fp64", "--shape", "100000,8192",
                 "--check", "dx", "--max-memory", "1G", "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "needs at least" in err and "GiB" in err and len(err.strip().splitlines()) == 1, err


def test_stencil_remainder_cancels_every_smooth_term_below_h6() -> None:
    # Even sums A_o of a smooth function: a·o² h² + b·o⁴ h⁴ + ... (h = 1 here).
    levels = torch.tensor(fd.LEVELS, dtype=torch.float64)
    for a, b in [(1.0, 0.0), (0.0, 1.0), (3.5, -2.25)]:
        even = (a * levels**2 + b * levels**4)[:, None]
        assert float(noise.stencil_remainder(even).abs().max()) == 0.0, (a, b)
    # What is left of an h⁶ term: 64·1 - 20·2⁶ + 4⁶ = 2880 (= 8 h⁶ f⁽⁶⁾ for A_o's 2 o⁶/6!).
    assert float(noise.stencil_remainder((levels**6)[:, None])[0]) == 2880.0


def test_richardson_estimates_the_truncation_it_claims() -> None:
    # f(x) = sin(x) at x = 0.3 with a coarse step: T must sit within 2x of the true error.
    x0, h = 0.3, torch.tensor(0.2, dtype=torch.float64)
    levels = torch.tensor(fd.LEVELS, dtype=torch.float64)
    odd = (torch.sin(x0 + levels * h) - torch.sin(x0 - levels * h))[:, None]
    for st in (fd.CENTRAL2, fd.CENTRAL4):
        est = float(stencil_sum(odd, st)[0] / h)
        true = abs(est - torch.cos(torch.tensor(x0, dtype=torch.float64)).item())
        t = float(stencil_estimate(odd, st, h)[1][0])
        assert 0.5 * true < t < 2 * true, (st.name, t, true)


def test_weight_grad_floor_is_per_column_and_measured() -> None:
    x, g, w = rand(8, 128, seed=19), rand(8, 128, seed=20), rand(128, seed=21)
    wr = w.clone().requires_grad_(True)
    After.apply(x, wr, 1e-6, False).backward(g)
    assert wr.grad is not None
    est = fd.weight_grad(lambda v: After.apply(x, v, 1e-6, False), w, x, g)
    assert est.noise_floor.shape == (128,) and est.forward_calls == 7
    assert 0.1 < est.noise_scale < 1.5, est.noise_scale
    err = (est.grad - wr.grad).abs()
    assert bool((err <= est.noise_floor).all()), where_differs(est.grad, wr.grad)
    # The floor sits near the error, not orders of magnitude above it.
    assert float(est.noise_floor.max()) < 100 * float(err.max()) + 1e-15


def test_thread_count_never_changes_a_bit() -> None:
    from gradcheck_bi.fd.coloured import input_grad_outputs

    x, g, w = rand(5, 160, seed=21), rand(5, 160, seed=22), rand(160, seed=23)
    h = fd.row_steps(x, 1e-6, fd.step.input_step_rel(torch.float64, None))
    runs = []
    try:
        for n in (1, 2):
            fd.threads.fix_threads(n)
            runs.append(input_grad_outputs(lambda t: [_forward(w)(t)], x, [g], h))
    finally:
        fd.threads.fix_threads(None)
    one, two = runs
    assert torch.equal(one.grad, two.grad), where_differs(one.grad, two.grad)
    assert torch.equal(one.noise_floor, two.noise_floor), "noise floor differs by threads"


def test_meanwhile_runs_once_every_call_is_issued_and_changes_nothing() -> None:
    # A check's analytic backward runs while the finite differences' calls do (on a GPU):
    # after the last call is issued, before any result is read, and the estimate is the same.
    from gradcheck_bi.fd.coloured import input_grad_outputs

    x, g, w = rand(5, 160, seed=31), rand(5, 160, seed=32), rand(160, seed=33)
    h = fd.row_steps(x, 1e-6, fd.step.input_step_rel(torch.float64, None))
    calls, seen = [], []

    def forward(t: torch.Tensor) -> list[torch.Tensor]:
        calls.append(t.shape[0])
        return [_forward(w)(t)]

    with_hook = input_grad_outputs(forward, x, [g], h, meanwhile=lambda: seen.append(len(calls)))
    issued = len(calls)
    without = input_grad_outputs(forward, x, [g], h)
    assert seen == [issued] and issued > 2, (seen, issued)
    assert torch.equal(with_hook.grad, without.grad), where_differs(with_hook.grad, without.grad)
    assert torch.equal(with_hook.noise_floor, without.noise_floor)


def test_threads_by_chunk_size_and_restored_after(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fd.threads, "usable_cores", lambda: 3)
    small, large = fd.threads.PARALLEL_MIN_ELEMENTS - 1, fd.threads.PARALLEL_MIN_ELEMENTS
    assert (fd.threads.threads_for(small), fd.threads.threads_for(large)) == (1, 3)
    try:
        fd.threads.fix_threads(2)
        assert fd.threads.threads_for(small) == fd.threads.threads_for(large) == 2
    finally:
        fd.threads.fix_threads(None)
    before = torch.get_num_threads()
    with fd.threads.cpu_threads(torch.device("cpu"), large) as inside:
        assert (inside, torch.get_num_threads()) == (3, 3)
    assert torch.get_num_threads() == before, "torch's thread count was not restored"
    with pytest.raises(ValueError, match=">= 1"):
        fd.threads.fix_threads(0)


def _threads_per_step(monkeypatch: pytest.MonkeyPatch, cost: Callable[[int, int], float],
                      steps: int = 60) -> list[int]:
    """The thread count each of ``steps`` steps of :func:`fd.threads.run_steps` ran on, a
    step taking ``cost(step, threads)`` seconds of a fake clock; torch starts on 2 threads."""
    clock = [0.0]
    monkeypatch.setattr(fd.threads.time, "perf_counter", lambda: clock[0])
    seen: list[int] = []

    def step() -> None:
        seen.append(torch.get_num_threads())
        clock[0] += cost(len(seen) - 1, seen[-1])

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        fd.threads.run_steps([step] * steps, torch.device("cpu"))
        assert torch.get_num_threads() == 2, "the loop's thread count was not restored"
    finally:
        torch.set_num_threads(before)
    return seen


def test_a_loop_runs_on_one_thread_while_one_is_faster(monkeypatch: pytest.MonkeyPatch) -> None:
    """The cores the load average called idle can be busy: a loop measures one thread
    against all and keeps the faster; the guard drops to one at once when all get slow."""
    busy = _threads_per_step(monkeypatch, lambda i, n: 10.0 if n > 1 else 1.0)
    assert busy[:3] == [2, 1, 2] and busy[3:17] == [1] * 14, busy
    assert busy.count(2) <= 4, f"probes on busy cores should thin out: {busy}"
    idle = _threads_per_step(monkeypatch, lambda i, n: 1.0 if n > 1 else 2.0)
    assert idle.count(1) == len(range(1, 60, fd.threads.PROBE_EVERY)), idle
    tie = _threads_per_step(monkeypatch, lambda i, n: 1.2 if n > 1 else 1.0)  # within margin
    assert tie == idle, f"a probe within PROBE_MARGIN keeps all threads: {tie}"
    late = _threads_per_step(monkeypatch, lambda i, n: 1.0 if n == 1 else 0.5 if i < 8 else 5.0)
    assert late[3:8] == [2] * 5 and late[8:10] == [2, 1], late  # busy from step 8: one at 9
    try:
        fd.threads.fix_threads(2)  # --threads: what was asked, every step
        assert _threads_per_step(monkeypatch, lambda i, n: 10.0 if n > 1 else 1.0) == [2] * 60
    finally:
        fd.threads.fix_threads(None)


def test_usable_cores_leave_room_for_the_load(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fd.threads.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    monkeypatch.setattr(fd.threads, "_own", (0.0, 1))  # no parallel loop of ours lately
    for load, cores in ((0.5, 4), (1.0, 4), (2.4, 3), (3.6, 1), (40.0, 1)):
        monkeypatch.setattr(fd.threads.os, "getloadavg", lambda load=load: (load, 0.0, 0.0))
        assert fd.threads.usable_cores() == cores, f"load {load}"


def _reference_level_sums(ys: torch.Tensor, y0: torch.Tensor, g: torch.Tensor,
                          n: int) -> torch.Tensor:
    y = ys.double()
    odd = [((y[o] - y[o + n]) * g).sum(-1) for o in range(n)]
    even = [((y[o] + y[o + n] - 2 * y0) * g).sum(-1) for o in range(n)]
    return torch.stack(odd + even)


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("levels", [1, 2, 3])
def test_level_sums_are_the_sums_asked_for_in_a_fixed_order(
        backend: str, dtype: torch.dtype, levels: int) -> None:
    from gradcheck_bi.sums.reduction import triton_available, use_backend

    if backend == "triton" and not triton_available():
        pytest.skip("triton is not installed")
    ys = rand(2 * levels, 3, 5, 300, dtype=dtype, seed=31 + levels)
    y0, g = rand(5, 300, dtype=dtype, seed=33).double(), rand(5, 300, seed=32)
    with use_backend(backend):
        got = fd.reduce.level_sums(ys, y0, g)
        # A sub-batch (2 of the 3 columns, rows 1..3) gives the same bits for its rows.
        part = fd.reduce.level_sums(ys[:, 1:, 1:4], y0[1:4], g[1:4])
        odd = fd.reduce.level_sums(ys, y0, g, fd.reduce.Sums(levels, even=False))
        even = fd.reduce.level_sums(ys, y0, g, fd.reduce.Sums(levels, odd=False))
        # Into a slice of a larger sums tensor (what fd.coloured hands it): the same bits,
        # written there, nothing around it touched.
        whole = torch.full((2 * levels, 7, 5), float("nan"), dtype=torch.float64)
        into = fd.reduce.level_sums(ys, y0, g, out=whole[:, 2:5])
    assert got.shape == (2 * levels, 3, 5)
    assert into.data_ptr() == whole[:, 2:5].data_ptr()
    assert torch.equal(whole[:, 2:5], got), where_differs(whole[:, 2:5], got)
    assert whole[:, :2].isnan().all() and whole[:, 5:].isnan().all()
    ref = _reference_level_sums(ys, y0, g, levels)
    scale = _reference_level_sums(ys.abs(), -y0.abs(), g.abs(), levels)  # Σ of |terms|
    rel = ((got - ref).abs() / scale).max()
    assert rel < 1e-13, f"{backend}: max error / Σ|terms| = {float(rel):.2e}"
    assert torch.equal(part, got[:, 1:, 1:4]), where_differs(part, got[:, 1:, 1:4])
    assert torch.equal(torch.cat([odd, even]), got), "odd / even alone differ from both"


def test_level_sums_refuse_what_they_cannot_compute() -> None:
    with pytest.raises(ValueError, match="odd or even"):
        fd.reduce.Sums(2, odd=False, even=False)
    with pytest.raises(ValueError, match="stencil points"):
        fd.reduce.level_sums(rand(5, 2, 8), rand(2, 8), rand(2, 8), fd.reduce.Sums(3))
    with pytest.raises(ValueError, match="rows, D"):
        fd.reduce.level_sums(rand(6, 2, 8), rand(3, 8), rand(2, 8))


def test_cuda_chunk_ignores_what_the_allocator_caches(monkeypatch: pytest.MonkeyPatch) -> None:
    # Two processes (or two moments of one) with the same memory to take must get the same
    # chunk, however much torch's allocator keeps cached: the report records the call count.
    state = {"free": 60 << 30, "reserved": 0, "allocated": 0}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda dev: (state["free"], 80 << 30))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda dev: state["reserved"])
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda dev: state["allocated"])
    clock = {"now": 0.0}
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(fd.budget.time, "monotonic", lambda: clock["now"])
    monkeypatch.setattr(fd.budget, "_driver_reads", {})

    def chunk() -> tuple[int, int]:
        clock["now"] += 2 * fd.budget.DRIVER_READ_S  # the driver asked again every time
        return fd.chunk_shape(64, 8192, fd.CENTRAL4, torch.float32, 1 << 40, "cuda")

    fresh = chunk()
    state.update(free=50 << 30, reserved=11 << 30, allocated=1 << 30)  # 10 GiB cached
    assert chunk() == fresh, "cached allocator memory changed the chunk"
    state.update(free=58 << 30, reserved=0, allocated=0)  # a little less free
    assert chunk() == fresh, "a small change in free memory changed the chunk"
    cols, rows = fresh
    room = (60 << 30) // 4 // fd.BYTES_PER_ELEMENT[torch.float32]
    assert rows == 64 and room // 2 < cols * rows * 6 * 8192 <= room, (cols, rows)


def test_cuda_free_memory_is_read_from_the_driver_at_most_every_few_seconds(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The driver's figure costs ~1 ms; between readings the allocator's own growth is
    # accounted for (it moves memory from the driver's free to torch's reserved).
    reads = []
    state = {"free": 60 << 30, "reserved": 0, "allocated": 0}
    clock = {"now": 100.0}

    def mem_get_info(dev: object) -> tuple[int, int]:
        reads.append(clock["now"])
        return state["free"], 80 << 30

    monkeypatch.setattr(torch.cuda, "mem_get_info", mem_get_info)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda dev: state["reserved"])
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda dev: state["allocated"])
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(fd.budget.time, "monotonic", lambda: clock["now"])
    monkeypatch.setattr(fd.budget, "_driver_reads", {})
    dev = torch.device("cuda")
    assert fd.budget.cuda_free(dev) == 60 << 30
    # this process takes 8 GiB and uses 6 of them: the driver would say 52 free
    state.update(free=52 << 30, reserved=8 << 30, allocated=6 << 30)
    clock["now"] += fd.budget.DRIVER_READ_S / 2
    assert fd.budget.cuda_free(dev) == 54 << 30 and len(reads) == 1
    state.update(free=40 << 30)  # another process took 12 GiB: seen at the next reading
    clock["now"] += fd.budget.DRIVER_READ_S
    assert fd.budget.cuda_free(dev) == 42 << 30 and len(reads) == 2
    # another device's figure is read for it ("cuda" is the current one, here 0)
    assert fd.budget.cuda_free(torch.device("cuda", 1)) == 42 << 30 and len(reads) == 3
    assert fd.budget.cuda_free(torch.device("cuda", 0)) == 42 << 30 and len(reads) == 3


def test_usable_cores_count_our_own_recent_threads_as_ours(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Right after a 2-thread loop the load average reads ~2 on an otherwise idle machine:
    # both units are ours, so the next check may use both cores again.
    monkeypatch.setattr(fd.threads.os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr(fd.threads.os, "getloadavg", lambda: (2.0, 0.0, 0.0))
    monkeypatch.setattr(fd.threads, "_own", (0.0, 1))
    assert fd.threads.usable_cores() == 1, "a load of 2 with nothing of ours: one core is busy"
    with fd.threads.cpu_threads(torch.device("cpu"), fd.threads.PARALLEL_MIN_ELEMENTS) as used:
        assert used == 1
    monkeypatch.setattr(fd.threads, "_own", (0.0, 1))
    monkeypatch.setattr(fd.threads.os, "getloadavg", lambda: (0.2, 0.0, 0.0))
    with fd.threads.cpu_threads(torch.device("cpu"), fd.threads.PARALLEL_MIN_ELEMENTS) as used:
        assert used == 2
    monkeypatch.setattr(fd.threads.os, "getloadavg", lambda: (2.0, 0.0, 0.0))
    assert fd.threads.usable_cores() == 2, "our own 2 threads were taken for someone else's"
    monkeypatch.setattr(fd.threads.time, "monotonic",
                        lambda: fd.threads._own[0] + 1.0)  # a minute later: forgotten
    assert fd.threads.usable_cores() == 1


@pytest.mark.parametrize("centre", [False, True])
def test_noise_scales_pools_as_noise_scale_and_the_robust_one_leaves_a_kink_out(
        centre: bool) -> None:
    gen = torch.Generator().manual_seed(7)
    resid = 3.0 * torch.randn(6, 500, generator=gen, dtype=torch.float64)  # λ ≈ 3
    var = torch.ones(1, 500, dtype=torch.float64)
    var[0, 11] = 0.0  # an output exactly 0: its row does not count
    lam, robust = noise.noise_scales(resid, var, centre)
    assert lam == noise.noise_scale(resid, var, centre), (lam, robust)
    assert 2.7 < lam < 3.3 and 2.7 < robust < 3.3, (lam, robust)
    resid[2, 7] += 1e12  # one stencil straddles a kink
    lam, robust = noise.noise_scales(resid, var, centre)
    assert lam > 1e9 and 2.7 < robust < 3.3, (lam, robust)


@pytest.mark.parametrize("stencil", [fd.CENTRAL2, fd.CENTRAL4])
def test_stencil_estimate_is_the_stencil_sum_and_its_truncation_bit_for_bit(
        stencil: fd.Stencil) -> None:
    odd = rand(len(fd.LEVELS), 7, 33, seed=23)
    for h in (0.125, torch.full((7, 1), 0.25, dtype=torch.float64)):
        est, trunc = stencil_estimate(odd, stencil, h)
        want = stencil_sum(odd, stencil) / h
        twice = stencil_sum(odd, stencil, 2) / (2 * h)
        assert torch.equal(est, want), where_differs(est, want)
        assert torch.equal(trunc, noise.truncation(want, twice, stencil.order)), (
            where_differs(trunc, noise.truncation(want, twice, stencil.order)))


def test_weighted_levels_are_each_coefficient_times_its_level() -> None:
    t = rand(3, 5, 9, seed=24)
    terms = noise.weighted_levels(t, noise.REMAINDER)
    for i, c in enumerate(noise.REMAINDER):
        assert torch.equal(terms[i], c * t[i]), (i, where_differs(terms[i], c * t[i]))
    assert torch.equal(noise.level_total(terms, (2, 0)), terms[2] + terms[0])


@pytest.mark.parametrize("n", [33, 128])
def test_perturbed_weights_are_aligned_rows_of_w_plus_each_delta(n: int) -> None:
    w, deltas = rand(n, seed=25, dtype=torch.float32), rand(6, n, seed=26, dtype=torch.float32)
    rows = perturbed(w, deltas)
    for i in range(6):
        assert torch.equal(rows[i], w + deltas[i]), (i, where_differs(rows[i], w + deltas[i]))
        assert rows[i].is_contiguous() and rows[i].data_ptr() % 64 == 0, (i, rows[i].data_ptr())


def test_weight_shape_answers_the_same_from_the_estimates_own_points() -> None:
    x, g, w = rand(4, 10, seed=27), rand(4, 10, seed=28), rand(10, seed=29)
    for forward in (lambda v: x * v, lambda v: x * v * v,
                    lambda v: torch.nn.functional.normalize(x * v, dim=-1)):
        est = fd.weight_grad(forward, w, x, g)
        assert est.points is not None
        step = float(est.step) * max(fd.LEVELS)
        known = (est.points[-1], est.points[fd.LEVELS.index(max(fd.LEVELS))])
        u = 2.0**-53
        assert weight_shape(forward, w, step, u, known) == weight_shape(forward, w, step, u)


def test_the_heap_freed_by_the_caller_goes_back_before_the_next_fork() -> None:
    """A fork copies the page tables of every mapped page, free or not: a heap holding
    freed memory is given back (glibc), one below the threshold left as it is."""
    import ctypes
    import os

    from gradcheck_bi.fd import budget

    if budget._libc() is None or not hasattr(budget._libc(), "mallinfo2"):
        pytest.skip("not glibc >= 2.33")

    def rss() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    assert not budget.release_freed_memory(least=1 << 62)
    blocks = [ctypes.create_string_buffer(1 << 16) for _ in range(4096)]  # 256 MiB, heap
    held = rss()
    del blocks[:-1]  # the last keeps the heap top: only a trim gives the rest back
    assert budget.release_freed_memory(least=64 << 20)
    assert rss() < held - (128 << 20), f"RSS {held >> 20} → {rss() >> 20} MiB"
