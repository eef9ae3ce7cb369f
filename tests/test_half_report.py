"""bf16/fp16 results as the reports show them: ulps with the unit, no 1e+40 figures where the
exact value is 0, the caption's "within a few per cent of ½ ulp" true of a correct kernel,
and the reference each gradient row was lifted to named on that row."""

from __future__ import annotations

import json
import re

import pytest
import torch

from gradcheck_bi import cli, lowp
from gradcheck_bi.checks import run_check
from gradcheck_bi.kernels.bundled.rmsnorm import After
from gradcheck_bi.vocab import Config

SMALL = ["--shape", "2,4,64", "--device", "cpu", "--no-progress", "--layout", "contiguous"]
# A number written with an exponent of ±10 or beyond: 3.675e+40, 4.592e-41.
HUGE_OR_TINY = re.compile(r"\d\.\d+e[+-](?:[1-9]\d)")


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert cli.main(["run", *args, *SMALL]) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize(("dtype", "low", "high"), [(torch.bfloat16, 128, 256),
                                                     (torch.float16, 1024, 2048)])
def test_an_error_where_the_exact_value_is_0_is_measured_at_y(dtype: torch.dtype, low: int,
                                                              high: int) -> None:
    exact = torch.zeros(4, 64, dtype=torch.float64)
    y = (torch.rand(4, 64, dtype=torch.float64) + 0.5).to(dtype)
    r = lowp.audit(y, exact)
    assert low <= r.max_ulp < high, r.max_ulp  # its own size in ulps, not 1e+40
    assert not r.ok and r.n_not_correctly_rounded == y.numel()
    zero = lowp.audit(torch.zeros_like(y), exact)  # right where the value is 0: 0 ulp
    assert zero.ok and zero.max_ulp == 0


def test_bf16_forward_cells_carry_the_unit_and_no_1e40(capsys: pytest.CaptureFixture[str]
                                                       ) -> None:
    out = _run(capsys, "--kernel", "before,after", "--dtype", "bf16", "--check", "forward",
               "--zcg", "on", "--format", "text")
    assert not HUGE_OR_TINY.findall(out), HUGE_OR_TINY.findall(out)
    grid = [ln for ln in out.splitlines() if re.match(r"(before|after) +cpu bf16", ln)]
    assert len(grid) == 2 and all(ln.count(" ulp ") == 3 for ln in grid), grid
    assert "0.55 ulp" in out
    caption = " ".join(out.split())
    assert "0 or subnormal: at |y|, at least the smallest normal's ulp" in caption
    assert "within a few per cent of ½ ulp" in caption


def test_bf16_gradient_rows_name_their_method_and_show_ulps(
        capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--kernel", "before,after", "--dtype", "bf16", "--check", "dx", "--zcg", "on"]
    text = _run(capsys, *args, "--format", "text")
    assert not HUGE_OR_TINY.findall(text), HUGE_OR_TINY.findall(text)  # tol at γ=zeros
    assert "method: lifted" not in text  # not one caption for every row
    methods = re.findall(r"^ +method +(.+)$", text, re.MULTILINE)
    assert methods == ["lifted to fp32", "lifted to fp64"], methods  # before's zcg forward
    assert re.search(r"^ +tol .* 0\.5 ulp$", text, re.MULTILINE), text  # γ=zeros: exactly 0
    markdown = _run(capsys, *args, "--format", "markdown")
    assert "| method |" in markdown and "| lifted to fp64 |" in markdown
    doc = json.loads(_run(capsys, *args, "--format", "json"))
    for r in doc["results"]:  # the JSON keeps the gradient's units; details.ulp converts
        assert r["details"]["ulp"] > 0 and "unit" not in r["details"], r["details"]


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("check", ["forward", "dx", "dw"])
def test_a_correct_kernel_sits_within_a_few_per_cent_of_half_an_ulp(dtype: str,
                                                                     check: str) -> None:
    """What the captions say (benchmarks/half_ulp_margin.py measures it over more points)."""
    m = run_check(After, Config(check, dtype=dtype, shape=(4, 1000)))
    ulp = float(m.details.get("ulp", 1.0))
    err, tol = m.max_abs_err / ulp, m.tolerance / ulp
    assert m.passed and 0.47 <= err <= 0.5005, (err, tol)
    assert check == "forward" or err / tol >= 0.95, (err, tol)
