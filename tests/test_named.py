"""Named adapters: torch and Liger, imported only when asked for, refusing what they cannot run.

Tests that need liger-kernel skip without it; the Liger-on-GPU ones also need a GPU.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from gradcheck_bi import cli
from gradcheck_bi.kernels import resolve
from gradcheck_bi.kernels.adapting.named import NAMED, _GuardedGrad
from gradcheck_bi.vocab import Unsupported

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["--shape", "2,3,16", "--format", "json", "--no-progress"]
HAS_LIGER = NAMED["liger"].installed()
needs_liger = pytest.mark.skipif(not HAS_LIGER, reason="liger-kernel is not installed")


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any]]:
    code = cli.main(list(args))
    out = capsys.readouterr().out
    return code, (json.loads(out) if out.strip() else {})


@pytest.mark.parametrize("name", ["torch", "torch:nn"])
def test_torch_adapters_pass_in_fp32(capsys: pytest.CaptureFixture[str], name: str) -> None:
    code, doc = run(capsys, "run", "--kernel", name, "--device", "cpu", "--dtype", "fp32",
                    *SMALL)
    assert code == 0 and {r["status"] for r in doc["results"]} == {"pass"}
    assert {r["zero_centered_gamma"] for r in doc["results"]} == {False}
    assert doc["not_run"] == [f"{name}: zcg=on results not run — zero_centered_gamma is "
                              "absent (γ = w)"]


def test_naming_an_adapter_imports_nothing_until_asked() -> None:
    code = ("import sys, gradcheck_bi.cli; from gradcheck_bi.kernels import resolve; "
            "resolve('torch'); resolve('after'); "
            "print(sorted(m for m in sys.modules if m.startswith('liger')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, check=True).stdout
    assert out.strip() == "[]", out


def test_liger_missing_is_unsupported_with_how_to_install(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    for loaded in [m for m in sys.modules if m.startswith("liger_kernel.")]:
        monkeypatch.delitem(sys.modules, loaded)
    monkeypatch.setitem(sys.modules, "liger_kernel", None)  # import fails as if not installed
    code, doc = run(capsys, "run", "--kernel", "liger", "--device", "cpu", "--dtype", "fp32",
                    "--check", "forward", *SMALL)
    assert code == 3
    messages = {r["message"] for r in doc["results"]}
    assert len(messages) == 1 and messages.pop().startswith(
        "kernel liger needs a CUDA GPU and liger-kernel: pip install 'gradcheck-bi[liger]': "
        "ModuleNotFoundError: "), doc["results"][0]


def test_a_keyerror_in_the_backward_becomes_a_refusal() -> None:
    class NoFp64Backward(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
            return x * 2

        @staticmethod
        def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
            raise KeyError(g.dtype)

    x = torch.randn(3, dtype=torch.float64, requires_grad=True)
    w = torch.randn(3, dtype=torch.float64, requires_grad=True)
    y = _GuardedGrad.apply(x, w, lambda xi, wi: NoFp64Backward.apply(xi) * wi)
    with pytest.raises(Unsupported, match=r"no torch.float64 kernel \(KeyError: "
                                          r"torch.float64 in its Triton dtype map\)"):
        y.sum().backward()


def test_the_guard_passes_gradients_through_unchanged() -> None:
    x = torch.randn(4, 8, dtype=torch.float64, requires_grad=True)
    w = torch.randn(8, dtype=torch.float64, requires_grad=True)
    g = torch.randn(4, 8, dtype=torch.float64)
    (_GuardedGrad.apply(x, w, lambda xi, wi: torch.tanh(xi) * wi) * g).sum().backward()
    assert x.grad is not None and w.grad is not None
    torch.testing.assert_close(x.grad, g * w.detach() / torch.cosh(x.detach()) ** 2)
    torch.testing.assert_close(w.grad, (g * torch.tanh(x.detach())).sum(0))


@needs_liger
@pytest.mark.parametrize("name", ["liger", "liger:gemma", "liger:none", "liger:module",
                                  "liger:megatron"])
def test_liger_on_cpu_is_unsupported_with_a_clear_line(
        capsys: pytest.CaptureFixture[str], name: str) -> None:
    code, doc = run(capsys, "run", "--kernel", name, "--device", "cpu", "--dtype", "fp32",
                    "--check", "forward", *SMALL)
    assert code == 3
    assert {r["message"] for r in doc["results"]} == {
        "Liger-Kernel's Triton kernels need a CUDA GPU; they do not run on CPU, nor in "
        "Triton's CPU interpreter"}
    assert {r["zero_centered_gamma"] for r in doc["results"]} == {False, True}


@needs_liger
def test_liger_maps_zcg_to_its_offset_and_casting_mode_to_its_argument() -> None:
    spec = resolve("liger:gemma")
    assert spec.zcg == {False, True}
    assert spec.zcg_how == "an offset (offset=1.0 under zcg, 0.0 without)"
    call = spec.fn.inner.call
    assert call.kernel_args == {"casting_mode": "gemma", "in_place": False}
    assert resolve("liger:megatron").zcg_how == "a keyword (zero_centered_gamma)"
    assert resolve("liger", {"casting_mode": "none"}).fn.inner.call.kernel_args[
        "casting_mode"] == "none"


@needs_liger
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_liger_on_gpu_passes_fp32_and_refuses_fp64_backward(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, doc = run(capsys, "run", "--kernel", "liger", "--device", "cuda", "--dtype",
                    "fp32", *SMALL)
    assert code == 0, [r for r in doc["results"] if r["status"] != "pass"]
    code, doc = run(capsys, "run", "--kernel", "liger", "--device", "cuda", "--dtype",
                    "fp64", "--check", "dx", *SMALL)
    assert code == 3
    assert {r["status"] for r in doc["results"]} == {"unsupported"}
    assert all("no torch.float64 kernel" in r["message"] for r in doc["results"])
