"""CUDA left to the children: the process that writes the report never starts CUDA, so its
workers and recording children are forked (inheriting every import and the recognition),
and a forked worker that cannot start CUDA hands its points to a spawned one.

No GPU here: a GPU is made visible to the parent the way NVML would report one
(:func:`gradcheck_bi.gpu.present`), every torch call that starts CUDA (or, through the CUDA
runtime, initialises the driver) is watched in this process, and a forked child is told
CUDA started in it (or is left to find that it cannot: torch here has no CUDA).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from gradcheck_bi import gpu
from gradcheck_bi.cli import main
from gradcheck_bi.kernels import resolve
from gradcheck_bi.kernels.adapting import sandbox, shaped_adapt
from gradcheck_bi.runner import run
from gradcheck_bi.sweep import Sweep
from gradcheck_bi.vocab import KernelLoadError

# What starts CUDA in a process (or poisons the driver for its forked children).
STARTERS = ("init", "_lazy_init", "current_device", "set_device", "synchronize",
            "get_device_properties", "get_device_name", "get_device_capability",
            "mem_get_info", "is_available")


@pytest.fixture
def cuda_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The CUDA-starting calls made in this process from now on (forked children inherit
    the watch, and write to their own copy of the list)."""
    calls: list[str] = []

    def watched(name: str, original: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            calls.append(name)
            return original(*args, **kwargs)
        return call

    for name in STARTERS:
        monkeypatch.setattr(torch.cuda, name, watched(name, getattr(torch.cuda, name)))
    if hasattr(torch._C, "_cuda_getDeviceCount"):
        monkeypatch.setattr(torch._C, "_cuda_getDeviceCount",
                            watched("cudaGetDeviceCount", torch._C._cuda_getDeviceCount))
    monkeypatch.setattr(gpu, "present", lambda: True)  # one GPU, as NVML would say
    monkeypatch.setattr(gpu, "count", lambda: 1)
    return calls


# The tests that read the CUDA points' "unsupported" (or a fork's failed start) as torch's
# refusal: they hold only where torch is built without CUDA (on a GPU machine those points
# run and pass).
TORCH_WITHOUT_CUDA = pytest.mark.skipif(
    torch.version.cuda is not None,
    reason="simulates a GPU beside a torch built without CUDA; this torch has CUDA")


def _cuda_too() -> Sweep:
    return Sweep(kernels=["after"], targets=[("cpu", "fp64"), ("cuda", "fp32")],
                 weights=["randn"], zcg=[False], layouts=["contiguous"], checks=["forward"])


@TORCH_WITHOUT_CUDA
def test_a_run_forks_one_worker_per_device_kind_and_never_starts_cuda_here(
        cuda_calls: list[str], started: list[tuple[str, str]],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpu, "start_in_child", lambda device=None: None)  # CUDA starts there
    results = run(_cuda_too())
    assert started == [("cpu", "fork"), ("cuda", "fork")], started
    on_cuda = [r for r in results if r.device == "cuda"]
    assert on_cuda and len(on_cuda) == len(results) // 2, [(r.device, r.check) for r in results]
    # measured in the forked worker, where torch (built without CUDA) refuses the device
    assert {r.status for r in on_cuda} == {"unsupported"}, [r.message for r in on_cuda]
    assert {r.status for r in results if r.device == "cpu"} == {"pass"}
    assert cuda_calls == [], f"CUDA started in the process that writes the report: {cuda_calls}"
    assert not torch.cuda.is_initialized()


@TORCH_WITHOUT_CUDA
def test_the_command_line_never_starts_cuda_before_its_report(
        cuda_calls: list[str], started: list[tuple[str, str]],
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # The whole command: load, the memory refusal, the points (the JSON report's
    # environment, after the run, names the GPU through torch: text here).
    monkeypatch.setattr(gpu, "start_in_child", lambda device=None: None)
    code = main(["run", "--kernel", "after", "--check", "forward", "--weight", "randn",
                 "--zcg", "off", "--layout", "contiguous", "--format", "text"])
    out = capsys.readouterr().out
    # exit 3: the CUDA result is unsupported (measured in the forked worker, no CUDA here)
    assert code == 3 and "1 of 2 results could not run here" in out, (code, out)
    assert started == [("cpu", "fork"), ("cuda", "fork")], started
    assert cuda_calls == [], f"CUDA started in the process that writes the report: {cuda_calls}"


@TORCH_WITHOUT_CUDA
def test_a_forked_worker_that_cannot_start_cuda_hands_its_points_to_a_spawned_one(
        cuda_calls: list[str], started: list[tuple[str, str]]) -> None:
    # torch here has no CUDA: the forked worker's start fails as a poisoned fork's would
    with pytest.warns(RuntimeWarning, match="CUDA did not start in a worker forked"):
        results = run(_cuda_too())
    assert started == [("cpu", "fork"), ("cuda", "fork"), ("cuda", "spawn")], started
    on_cuda = [r for r in results if r.device == "cuda"]
    assert on_cuda and {r.status for r in on_cuda} == {"unsupported"}, \
        [r.message for r in on_cuda]
    assert cuda_calls == [], f"CUDA started in the process that writes the report: {cuda_calls}"


@TORCH_WITHOUT_CUDA
def test_a_recording_child_that_started_cuda_becomes_the_cuda_worker(
        cuda_calls: list[str], started: list[tuple[str, str]],
        monkeypatch: pytest.MonkeyPatch) -> None:
    # A kernel whose recognition ran on CUDA: the child that recorded it started CUDA, is
    # kept, and measures the run's CUDA points; the CPU points still go to a forked worker.
    monkeypatch.setattr(gpu, "start_in_child", lambda device=None: None)  # CUDA starts there
    monkeypatch.setattr(gpu, "unusable", lambda: None)  # and its context still runs work
    sandbox.isolated(lambda: sandbox.call(lambda: resolve("after"), "its forward", "cuda"),
                     "after", "after", None)
    kept = sandbox._kept
    assert kept is not None and kept.kind == "cuda", kept
    results = run(_cuda_too())
    assert started == [("cpu", "fork"), ("cuda", "kept")], started
    on_cuda = [r for r in results if r.device == "cuda"]
    # measured there as in a forked worker: torch (built without CUDA) refuses the device
    assert on_cuda and {r.status for r in on_cuda} == {"unsupported"}, \
        [r.message for r in on_cuda]
    assert {r.status for r in results if r.device == "cpu"} == {"pass"}
    assert cuda_calls == [], f"CUDA started in the process that writes the report: {cuda_calls}"
    assert not kept.process.is_alive() and sandbox.take_kept() is None


def test_a_recording_child_whose_cuda_context_broke_is_not_kept(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpu, "start_in_child", lambda device=None: None)
    monkeypatch.setattr(gpu, "unusable", lambda: "an illegal memory access was encountered")
    sandbox.isolated(lambda: sandbox.call(lambda: 7, "its forward", "cuda"), "k", "k", None)
    assert sandbox.take_kept() is None


def test_a_parent_running_cuda_spawns_its_cuda_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    assert gpu.forkable() == hasattr(os, "fork")
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    assert not gpu.forkable()


CUDA_ONLY = '''
import torch


class CudaOnlyCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, target, ignore_index=-100, reduction="mean"):
        if not logits.is_cuda:
            raise RuntimeError("this kernel runs on CUDA only")
        return torch.nn.functional.cross_entropy(logits, target, ignore_index=ignore_index,
                                                 reduction=reduction)

    @staticmethod
    def backward(ctx, g):
        raise NotImplementedError
'''


def test_recognition_on_cuda_draws_nothing_there_in_this_process(
        cuda_calls: list[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # A kernel that refuses CPU is tried on CUDA at load: its inputs are drawn here on the
    # CPU and moved in the (forked) recording child, where its forward then runs.
    monkeypatch.setattr(gpu, "start_in_child", lambda device=None: None)
    starts: list[str] = []
    record = sandbox._record
    monkeypatch.setattr(sandbox, "_record",
                        lambda start, *a: starts.append(start) or record(start, *a))
    path = tmp_path / "cuda_only.py"
    path.write_text(CUDA_ONLY)

    probes: list[str] = []
    probe = shaped_adapt._probe
    monkeypatch.setattr(shaped_adapt, "_probe",
                        lambda op, *a: probes.append(op.name) or probe(op, *a))
    with contextlib.suppress(KernelLoadError):  # refused: its forward ran nowhere here
        resolve(f"{path}:CudaOnlyCrossEntropy")
    assert "cross_entropy" in probes, probes
    assert starts and set(starts) == {"fork"}, starts
    assert cuda_calls == [], f"CUDA started in the process that recognises: {cuda_calls}"


def _calls_on_cuda() -> None:
    assert sandbox.call(lambda: 7, "its forward on cuda", "cuda") == 7


@pytest.mark.parametrize("refused", [None, "CUDA driver initialization failed"])
def test_a_forked_recording_child_runs_cuda_calls_where_cuda_starts(
        refused: str | None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpu, "start_in_child", lambda device=None: refused)
    outcomes = sandbox._record("fork", _calls_on_cuda, "k", None)
    # None: the child asked for a spawned one (that loads the kernel by reference)
    assert outcomes == ([("ok", 7)] if refused is None else None), outcomes
