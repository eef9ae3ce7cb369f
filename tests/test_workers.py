"""Faults survived: a kernel that exits, dies or hangs at one shape costs those points only.

Each fault of ``tests/kernels/faults.py`` strikes at D = 1025 only. Before points ran in
worker processes, ``sys.exit(0)`` and ``os._exit(0)`` ended the run with exit 0 and no
report, a segfault or an abort with 139 / 134 and no report, and a hang never ended.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gradcheck_bi.kernels import resolve
from gradcheck_bi.runner import run
from gradcheck_bi.sweep import Sweep

ROOT = Path(__file__).resolve().parent.parent
FAULTS = "tests/kernels/faults.py"
SHAPES = [(3, 40), (2, 1025), (2, 24)]  # the faulty width between two healthy ones

# fault class → what its error message must say (the rest of the run must not be touched)
EXPECTED = {
    "SysExitInBackward": "SystemExit: 0",
    "OsExitInForward": "the kernel ended the process (exit code 0) in forward at shape "
                       "(2, 1025)",
    "SegfaultInForward": "the kernel killed the process with SIGSEGV in forward at shape "
                         "(2, 1025)",
    "AbortInForward": "the kernel killed the process with SIGABRT in forward at shape "
                      "(2, 1025)",
    "KilledInForward": "the kernel ran when the process was killed with SIGKILL (the "
                       "out-of-memory killer's signal: memory ran out) in forward at shape "
                       "(2, 1025)",
    "InterruptInForward": "KeyboardInterrupt: raised by the kernel",
    "GeneratorExitInForward": "GeneratorExit",
    "HangInBackward": "did not finish in 3 s: backward at shape (2, 1025)",
}


@pytest.mark.parametrize("fault", sorted(EXPECTED))
def test_a_fault_at_one_width_is_an_error_there_and_nothing_else(fault: str) -> None:
    spec = resolve(f"{FAULTS}:{fault}")
    sweep = Sweep(kernels=[spec.name], targets=[("cpu", "fp64")], shapes=SHAPES,
                  weights=["randn"], zcg=[False], layouts=["contiguous"],
                  checks=["forward", "dx", "dw", "batch_invariance"], timeout=3)
    results = run(sweep, [spec])
    assert len(results) == 12, f"{len(results)} results: a point was lost"
    healthy = [r for r in results if r.shape != [2, 1025]]
    assert all(r.status == "pass" for r in healthy), \
        [f"{r.check} {r.shape}: {r.status} {r.message}" for r in healthy if r.status != "pass"]
    struck = {r.check: r for r in results if r.shape == [2, 1025]}
    # The forward check never runs a backward: a backward's fault leaves it a pass.
    faulty = ["dx", "dw", "batch_invariance"] + (["forward"] if "Forward" in fault else [])
    for check in faulty:
        r = struck[check]
        assert r.status == "error" and not r.as_expected, f"{check}: {r.status} {r.message}"
        # A hang is waited out once at a shape; the rest there say where it hung.
        said = ("not run: the kernel hung at this shape in point dx" if fault.startswith("Hang")
                and check != "dx" else EXPECTED[fault])
        assert said in r.message, f"{check}: {r.message!r}"
    if "Forward" not in fault:
        assert struck["forward"].status == "pass", struck["forward"].message


def _cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gradcheck_bi", "run", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env={**_env(), "PYTHONPATH": str(ROOT)})


def _env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if k != "GRADCHECK_BI_ISOLATE"}


def _case(tmp_path: Path) -> Path:
    case = tmp_path / "gate.toml"
    case.write_text('targets = ["cpu/fp64"]\nweights = ["randn"]\nzcg = [false]\n'
                    'layouts = ["contiguous"]\nshapes = [[3, 40], [2, 1025]]\n')
    return case


@pytest.mark.parametrize("fault", ["SysExitInBackward", "SegfaultInForward"])
def test_the_gate_goes_red_and_writes_its_report(fault: str, tmp_path: Path) -> None:
    # sys.exit(0) in a backward gave exit 0 and no JUnit (CI read a pass); a segfault 139.
    junit = tmp_path / "gate.xml"
    done = _cli("--case", str(_case(tmp_path)), "--kernel", f"{FAULTS}:{fault}",
                "--format", "junit", "--output", str(junit))
    assert done.returncode == 1, (done.returncode, done.stderr[-2000:])
    text = junit.read_text()
    assert text.count("<testcase") == 8 and 'errors="' in text, text[:500]
    assert EXPECTED[fault] in text, text


def test_under_bisect_a_kernel_crash_is_a_bad_commit(tmp_path: Path) -> None:
    done = _cli("--case", str(_case(tmp_path)), "--kernel", f"{FAULTS}:OsExitInForward",
                "--bisect", "--format", "json")
    assert done.returncode == 1, (done.returncode, done.stderr[-2000:])
    report = json.loads(done.stdout)
    errors = [r for r in report["results"] if r["status"] == "error"]
    assert len(errors) == 4 and all(r["shape"] == [2, 1025] for r in errors), errors
    assert all(r["details"]["phase"] == "forward" for r in errors), errors


def test_timeout_ends_a_hang_from_the_command_line(tmp_path: Path) -> None:
    done = _cli("--case", str(_case(tmp_path)), "--kernel", f"{FAULTS}:HangInBackward",
                "--timeout", "2", "--format", "json", timeout=120)
    assert done.returncode == 1, (done.returncode, done.stderr[-2000:])
    results = json.loads(done.stdout)["results"]
    late = [r for r in results if r["status"] == "error"]
    assert {r["check"] for r in late} == {"dx", "dw", "batch_invariance"}, late
    waited = [r for r in late if "did not finish in 2 s: backward" in r["message"]]
    assert len(waited) == 1 and all("not run: the kernel hung at this shape" in r["message"]
                                    for r in late if r not in waited), late
    assert sum(r["status"] == "pass" for r in results) == 5


def test_a_case_file_sets_the_timeout_and_a_bad_one_is_refused(tmp_path: Path) -> None:
    from gradcheck_bi.cases import CaseError, parse_case
    from gradcheck_bi.sweep import CASE_TIMEOUT_S

    assert parse_case("", "c.toml").sweeps[0].timeout == CASE_TIMEOUT_S
    assert parse_case("timeout = 20", "c.toml").sweeps[0].timeout == 20
    assert Sweep().timeout is None, "a one-off run has no limit"
    with pytest.raises(CaseError, match="timeout"):
        parse_case("timeout = -1", "c.toml")
    done = _cli("--kernel", "after", "--timeout", "-3")
    assert done.returncode == 2 and "--timeout" in done.stderr, done.stderr


def test_a_hang_costs_one_timeout_per_shape_not_one_per_point() -> None:
    # Before: each of the 6 backward points at D = 1025 waited out its own timeout.
    import time

    spec = resolve(f"{FAULTS}:HangInBackward")
    sweep = Sweep(kernels=[spec.name], targets=[("cpu", "fp64")], shapes=SHAPES,
                  weights=["randn", "ones"], zcg=[False], layouts=["contiguous"],
                  checks=["dx", "forward", "dw", "batch_invariance"], timeout=1)
    t0 = time.perf_counter()
    results = run(sweep, [spec])
    took = time.perf_counter() - t0
    struck = [r for r in results if r.shape == [2, 1025]]
    late = [r for r in struck if "did not finish in 1 s" in r.message]
    skipped = [r for r in struck if r.message.startswith("not run: the kernel hung at this "
                                                         "shape in point dx γ=randn zcg=off")]
    assert len(late) == 1 and len(skipped) == 5, [(r.check, r.message) for r in struck]
    assert all(r.status == "error" and not r.as_expected for r in late + skipped)
    assert skipped[0].details["phase"] == "backward", skipped[0].details
    # The forward checks at that shape never run a backward: they ran, and pass.
    assert [r.status for r in struck if r.check == "forward"] == ["pass", "pass"]
    assert all(r.status == "pass" for r in results if r.shape != [2, 1025])
    assert took < 1 + 20, f"{took:.1f} s: more than one timeout waited"


def test_a_hang_in_forward_excuses_every_point_at_that_shape_only() -> None:
    from gradcheck_bi.vocab import Config
    from gradcheck_bi.workers import Hangs

    spec = resolve(f"{FAULTS}:HangInBackward")
    sweep = Sweep(timeout=2)
    hangs = Hangs()
    hangs.add((spec, Config(check="forward", shape=(2, 1025)), sweep), "forward (probe)")
    for check in ("forward", "dx", "batch_invariance"):
        excused = hangs.excuse((spec, Config(check=check, shape=(2, 1025)), sweep))
        assert excused is not None and excused.status == "error", check
        assert "(forward (probe) past 2 s)" in excused.message, excused.message
    for other in (Config(check="dx", shape=(2, 24)), Config(check="dx", shape=(2, 1025),
                                                             dtype="fp32")):
        assert hangs.excuse((spec, other, sweep)) is None, other


def test_a_worker_leaves_the_heap_it_inherits_out_of_its_collections(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A forked worker ran the full collection its parent had due (~170 k objects of torch
    and the kernel's library, 0.1 s of an (8, 1024) check) at every fork: what it inherits
    is frozen out of its collector's passes, and the caller's own collector is untouched.
    The recording child that probes the kernel at load is forked too and freezes the same
    (the kernel below raises in either child otherwise)."""
    import gc
    import os

    import torch

    import gradcheck_bi

    monkeypatch.delenv("GRADCHECK_BI_ISOLATE", raising=False)
    parent = os.getpid()

    def kernel(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        if os.getpid() != parent and gc.get_freeze_count() == 0:  # in the worker
            raise RuntimeError("the worker collects the heap it inherited")
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight

    frozen = gc.get_freeze_count()
    report = gradcheck_bi.check(kernel, checks="forward", weights="randn", zcg=False,
                                shapes=(2, 16), raise_on_failure=False)
    assert report.ok, str(report)
    assert gc.get_freeze_count() == frozen


def test_a_finished_cpu_worker_ends_itself_and_is_reaped_by_the_next_run(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The parent returns without waiting for its CPU worker's exit (20–35 ms of an
    (8, 1024) check): the worker, told to stop, ends with exit code 0 on its own and the
    next run reaps it."""
    from gradcheck_bi import workers

    monkeypatch.delenv("GRADCHECK_BI_ISOLATE", raising=False)
    sweep = Sweep(kernels=["after"], targets=[("cpu", "fp64")], shapes=[(2, 16)],
                  weights=["randn"], zcg=[False], layouts=["contiguous"], checks=["forward"])
    before = list(workers._ending)
    assert [r.status for r in run(sweep)] == ["pass"]
    ended = [p for p, _ in workers._ending if (p, _) not in before]
    assert len(ended) == 1, f"{len(ended)} workers left to reap, expected the run's one"
    ended[0].join(30)
    assert ended[0].exitcode == 0, f"the worker ended with {ended[0].exitcode}"
    run(sweep)
    assert all(p is not ended[0] for p, _ in workers._ending), "not reaped by the next run"


def test_a_stopped_worker_still_alive_past_its_time_is_killed() -> None:
    import multiprocessing
    import signal
    import time

    from gradcheck_bi import workers

    late = multiprocessing.get_context("fork").Process(target=time.sleep, args=(60,),
                                                       daemon=True)
    late.start()
    workers._ending.append((late, time.monotonic() - 1))
    workers.reap_ended()
    assert late.exitcode == -signal.SIGKILL, f"exit code {late.exitcode}"
    assert all(p is not late for p, _ in workers._ending)
