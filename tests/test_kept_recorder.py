"""The recording child kept as the run's worker: one process recognises a kernel and measures
its points (``sandbox.Kept``, ``workers._adopt``).

On a GPU a child is kept when it started CUDA; here ``GRADCHECK_BI_KEEP_RECORDER=cpu`` keeps
the CPU one, so that the same hand-over runs: every kernel call of the run — at load and at
every point — is logged with the pid of the process that made it.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import pytest

from gradcheck_bi.kernels.adapting import sandbox
from gradcheck_bi.kernels.adapting.loader import Crashed
from gradcheck_bi.runner import resolve_kernels, run
from gradcheck_bi.sweep import Sweep
from gradcheck_bi.vocab import Result

# A correct RMSNorm (user_rmsnorm.py's) whose forward appends its process's pid and the
# input's shape to a file.
PID_LOGGING = '''
import os

from tests.kernels.user_rmsnorm import Correct

import torch


class PidLogging(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps, zero_centered_gamma):
        with open({log!r}, "a") as log:
            log.write(f"{{os.getpid()}} {{tuple(x.shape)}}\\n")
        return Correct.forward(ctx, x, weight, eps, zero_centered_gamma)

    @staticmethod
    def backward(ctx, g):
        return Correct.backward(ctx, g)
'''
FAULTS = "tests/kernels/faults.py"
LOAD_FAULTS = "tests/kernels/load_faults.py"


def _logging_kernel(tmp_path: Path) -> tuple[str, Path]:
    log = tmp_path / "pids.txt"
    path = tmp_path / "pid_logging.py"
    path.write_text(PID_LOGGING.format(log=str(log)))
    return f"{path}:PidLogging", log


def _fields(results: list[Result]) -> list[dict[str, Any]]:
    return [dataclasses.asdict(r) for r in results]


def _small(kernels: list[str], **kw: Any) -> Sweep:
    chosen: dict[str, Any] = {"shapes": [(2, 24)], "checks": ["forward", "dx"],
                              "weights": ["randn"], **kw}
    return Sweep(kernels=kernels, targets=[("cpu", "fp64")], zcg=[False],
                 layouts=["contiguous"], **chosen)


@pytest.mark.parametrize("keep", ["cpu", ""])
def test_the_recording_child_measures_the_points_of_its_kernel(
        keep: str, tmp_path: Path, started: list[tuple[str, str]],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRADCHECK_BI_KEEP_RECORDER", keep)
    ref, log = _logging_kernel(tmp_path)
    specs = resolve_kernels([ref, "after"])
    at_load = [line.split(" ", 1) for line in log.read_text().splitlines()]
    results = run(_small([s.name for s in specs]), specs)
    at_points = [line.split(" ", 1) for line in log.read_text().splitlines()[len(at_load):]]
    assert {r.status for r in results} == {"pass"}, [(r.kernel, r.message) for r in results]
    recorder = {pid for pid, _ in at_load}
    measurer = {pid for pid, _ in at_points}
    assert len(recorder) == len(measurer) == 1 and str(os.getpid()) not in recorder | measurer, \
        (recorder, measurer, os.getpid())
    if keep:  # one process: recognition and every point (the bundled kernel's too)
        assert started == [("cpu", "kept")] and measurer == recorder, (started, recorder, measurer)
    else:
        assert started == [("cpu", "fork")] and measurer != recorder, (started, recorder, measurer)
    # the worker measured the kernel the child had recognised: it did not recognise it again
    assert not {shape for _, shape in at_load} & {shape for _, shape in at_points}, at_points
    assert sandbox.take_kept() is None, "a recording child was left waiting"


def test_the_kept_child_reports_what_a_forked_worker_does(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ref, _ = _logging_kernel(tmp_path)
    sweep = _small([ref], shapes=[(3, 40), (2, 24)], weights=["randn", "ones"],
                   checks=["forward", "dx", "dw", "batch_invariance"])
    reports = {}
    for keep in ("cpu", ""):
        monkeypatch.setenv("GRADCHECK_BI_KEEP_RECORDER", keep)
        reports[keep] = _fields(run(sweep, resolve_kernels([ref])))
    assert reports["cpu"] == reports[""], [
        (a["check"], a["shape"], a["status"], b["status"])
        for a, b in zip(reports["cpu"], reports[""], strict=True) if a != b]


@pytest.mark.parametrize("fault,said", [
    ("SegfaultInForward", "the kernel killed the process with SIGSEGV in forward at shape "
                          "(2, 1025)"),
    ("HangInBackward", "did not finish in 3 s: backward at shape (2, 1025)")])
def test_a_kept_child_the_kernel_kills_is_replaced(
        fault: str, said: str, started: list[tuple[str, str]],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRADCHECK_BI_KEEP_RECORDER", "cpu")
    specs = resolve_kernels([f"{FAULTS}:{fault}"])
    sweep = _small([specs[0].name], shapes=[(3, 40), (2, 1025), (2, 24)], timeout=3)
    results = run(sweep, specs)
    struck = [r for r in results if r.shape == [2, 1025] and r.check == "dx"]
    assert len(struck) == 1 and struck[0].status == "error" and said in struck[0].message, \
        [(r.check, r.status, r.message) for r in struck]
    # each point that ended its worker (the shape (2, 24) comes after): a fresh one, forked
    ended = [r for r in results if r.status == "error" and not r.message.startswith("not run")]
    assert started == [("cpu", "kept")] + [("cpu", "fork")] * len(ended), (started, ended)
    healthy = [r.status for r in results if r.shape != [2, 1025]]
    assert len(healthy) == 4 and set(healthy) == {"pass"}, healthy


def test_a_crash_while_recognised_is_one_error_and_the_run_goes_on(
        tmp_path: Path, started: list[tuple[str, str]],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRADCHECK_BI_KEEP_RECORDER", "cpu")
    ref, _ = _logging_kernel(tmp_path)
    specs = resolve_kernels([f"{LOAD_FAULTS}:segfault_when_small", ref])
    assert isinstance(specs[0].fn, Crashed), specs[0]
    kept = sandbox._kept
    assert kept is not None and kept.ref == specs[1].ref, "the healthy kernel's child waits"
    results = run(_small([s.name for s in specs]), specs)
    crashed = [r for r in results if r.kernel == specs[0].name]
    assert len(crashed) == 1 and "SIGSEGV while it was recognised" in crashed[0].message, \
        crashed
    assert {r.status for r in results if r.kernel == specs[1].name} == {"pass"}
    # The crashed kernel's point cannot be sent by reference: the lane's worker is forked,
    # and the waiting child is told to end.
    assert started == [("cpu", "fork")], started
    assert not kept.process.is_alive() and sandbox.take_kept() is None
