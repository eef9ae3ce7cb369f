"""The kernel's working precision (gradcheck_bi/checks/precision.py): measured from its
forward, every check of an fp32-inside kernel judged at fp32 rounding, a defect above it
still caught, ``--precision exact`` as strict as before."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from gradcheck_bi import check, cli
from gradcheck_bi.checks.precision import working_precision
from gradcheck_bi.kernels import adapt, resolve
from gradcheck_bi.kernels.adapting.loader import normal_ref
from gradcheck_bi.vocab import Config

KERNELS = Path(__file__).resolve().parent / "kernels"
LLAMA = f"{KERNELS}/hf_style.py:LlamaRMSNorm"
GEMMA = f"{KERNELS}/hf_style.py:GemmaRMSNorm"
SCALED = f"{KERNELS}/hf_precision.py:LlamaRMSNormDxScaled"
QUICK = ["--format", "json", "--no-progress", "--layout", "contiguous"]


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, list[dict[str, Any]],
                                                                  str]:
    code = cli.main(list(args))
    out, err = capsys.readouterr()
    return code, json.loads(out)["results"], err


def test_llama_fp32_inside_passes_at_fp64_judged_at_fp32(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, results, err = run(capsys, "run", "--kernel", LLAMA, *QUICK)
    bad = [(r["check"], r["weight"], r["status"]) for r in results if not r["as_expected"]]
    assert code == 0, bad
    assert {r["working_precision"] for r in results} == {"fp32"}
    name = normal_ref(LLAMA)
    assert err.count(f"note: {name}: computes in fp32 inside at fp64 (cpu); judged at fp32 "
                     "rounding") == 1, err
    # γ = zeros included: the forward is exactly 0 there, the backward still rounds x̂.
    assert {r["weight"] for r in results if r["status"] == "pass"} == {"randn", "ones",
                                                                       "zeros"}


def test_a_dx_defect_above_fp32_rounding_still_fails(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, results, _ = run(capsys, "run", "--kernel", SCALED, *QUICK)
    assert code == 1
    failed = {(r["check"], r["weight"]) for r in results if r["status"] == "fail"}
    assert failed == {("dx", "randn"), ("dx", "ones")}, failed  # γ = zeros: dx ≡ 0
    assert all(r["working_precision"] == "fp32" for r in results)


def test_precision_exact_keeps_the_strict_judgement(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, results, err = run(capsys, "run", "--kernel", LLAMA, "--precision", "exact",
                             "--check", "forward", *QUICK)
    assert code == 1
    assert {r["status"] for r in results if r["weight"] != "zeros"} == {"fail"}
    assert all("working_precision" not in r for r in results)
    assert "judged at fp32" not in err


def test_the_api_and_a_case_file_take_precision(tmp_path: Path) -> None:
    report = check(LLAMA, checks="forward", weights="ones", precision="exact",
                   raise_on_failure=False)
    assert [r.status for r in report.results] == ["fail"]
    case = tmp_path / "exact.toml"
    case.write_text(f'kernels = ["{LLAMA}"]\nchecks = ["forward"]\nweights = ["ones"]\n'
                    'precision = "exact"\n', encoding="utf-8")
    assert cli.main(["run", "--case", str(case), "--format", "json", "--no-progress"]) == 1
    case.write_text(case.read_text(encoding="utf-8").replace('"exact"', '"measured"'),
                    encoding="utf-8")
    assert cli.main(["run", "--case", str(case), "--format", "json", "--no-progress"]) == 0


@pytest.mark.parametrize("kernel", ["after", "before", "fixed-dx", "torch"])
def test_full_precision_kernels_have_no_working_precision(kernel: str) -> None:
    spec = resolve(kernel)
    assert working_precision(spec, Config(check="forward")) is None


class _Scaled(torch.autograd.Function):
    """A forward off by a relative 2e-7 everywhere: within fp32's per-element bound,
    but systematic — a defect, not rounding."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor, eps: float,  # type: ignore[override]
                zcg: bool) -> torch.Tensor:
        r = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
        return x * r * (w + 1 if zcg else w) * (1 + 2e-7)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> Any:  # type: ignore[override]
        raise NotImplementedError


def _inside(low: torch.dtype) -> type:
    class Inside(torch.autograd.Function):
        """x, x̂ and γ rounded to ``low``, the statistic in fp32, y returned in x's dtype."""

        @staticmethod
        def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor,  # type: ignore[override]
                    eps: float, zcg: bool) -> torch.Tensor:
            h = x.to(low).float()
            y = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
            return (y.to(low) * (w + 1 if zcg else w).to(low)).to(x.dtype)

        @staticmethod
        def backward(ctx: Any, g: torch.Tensor) -> Any:  # type: ignore[override]
            raise NotImplementedError

    return Inside


def test_a_systematic_error_is_not_rounding() -> None:
    assert working_precision(adapt(_Scaled, "scaled", "api"), Config(check="forward")) is None


@pytest.mark.parametrize(("low", "name"), [(torch.bfloat16, "bf16"), (torch.float16, "fp16")])
def test_half_inside_is_measured_as_its_precision(low: torch.dtype, name: str) -> None:
    spec = adapt(_inside(low), f"{name}_inside", "api")
    assert working_precision(spec, Config(check="forward")) == name
    assert working_precision(spec, Config(check="forward", dtype="fp32")) == name
    assert working_precision(spec, Config(check="forward", precision="exact")) is None


def test_gemma_fp32_inside_is_found_at_the_default_shape(
        capsys: pytest.CaptureFixture[str]) -> None:
    """γ = 1 + w formed in fp32: where γ is near 0 (w near −1, a column of 256 drawn) the
    rounding of w moves y by ~100 u |y|, more than the product by γ; the per-element bound
    counts it, so fp32 is found and dw at γ = zeros is judged at fp32, not fp64."""
    assert working_precision(resolve(GEMMA), Config(check="forward", zero_centered_gamma=True)
                             ) == "fp32"
    code, results, err = run(capsys, "run", "--kernel", GEMMA, "--check", "forward,dw",
                             *QUICK)
    bad = [(r["check"], r["weight"], r.get("message")) for r in results
           if not r["as_expected"]]
    assert code == 0, bad
    assert {tuple(r["shape"]) for r in results} == {Config(check="dw").shape}
    assert {r["working_precision"] for r in results} == {"fp32"}
    assert "not found" not in err and "not differentiable" not in err, err


class ScaledInside(torch.nn.Module):
    """fp32 inside, and y off by a relative 3e-7: past fp64 rounding, not fp32 rounding."""

    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (h * self.weight.float() * (1 + 3e-7)).to(x.dtype)


def test_a_working_precision_not_found_says_so_in_one_line(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, results, err = run(capsys, "run", "--kernel", f"{__file__}:ScaledInside",
                             "--check", "forward", *QUICK)
    assert code == 1
    assert all("working_precision" not in r for r in results)
    lines = [line for line in err.splitlines() if "working precision was not found" in line]
    assert len(lines) == 1, err
    assert "not as rounding at fp32 (a systematic relative error" in lines[0], lines[0]
    assert "every check falls back to fp64 rounding" in lines[0], lines[0]
