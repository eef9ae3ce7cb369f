"""log_softmax and silu_and_mul (gradcheck_bi/ops/log_softmax.py, silu_and_mul.py), ops of any
shape: their references against formulas written here, their rounding derived from the
reference (no aten op without a rule), their correct kernels (tests/kernels/) passing in
every dtype, layout, awkward shape and input scale; their mutants are in
tests/test_op_mutants.py. swiglu: tests/test_swiglu.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from gradcheck_bi.errors import derived
from gradcheck_bi.kernels import resolve
from gradcheck_bi.ops import ROWS, SHAPED
from gradcheck_bi.runner import run
from gradcheck_bi.sweep import Sweep, grid, not_run, op_layouts

KERNELS = {"log_softmax": "tests/kernels/log_softmax.py",
           "silu_and_mul": "tests/kernels/silu_and_mul.py"}
# Logits and gates of 1e3: at a ≈ -560 silu's outputs are ~1e-240 (their rounding, derived
# from the reference, stays above 0).
SCALES = {op: [1e-4, 1.0, 1e3] for op in ("log_softmax", "silu_and_mul")}


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_references_match_formulas_written_here() -> None:
    x = torch.randn(3, 7, generator=_gen(1), dtype=torch.float64)
    b = torch.randn(3, 7, generator=_gen(2), dtype=torch.float64)
    lse = torch.log(torch.exp(x).sum(-1, keepdim=True))
    assert torch.allclose(SHAPED["log_softmax"].reference({"x": x}, {})["y"], x - lse)
    silu = x / (1 + torch.exp(-x))
    both = SHAPED["silu_and_mul"].canonical({"x": torch.cat([x, b], dim=-1)}, {})
    assert torch.allclose(SHAPED["silu_and_mul"].reference(both, {})["y"], silu * b)


@pytest.mark.parametrize("op", list(KERNELS))
def test_is_an_op_of_any_shape_only(op: str) -> None:
    assert op not in ROWS
    assert SHAPED[op].checks == ("forward", "dx", "batch_invariance")
    assert [(a.name, a.values, a.blind) for a in SHAPED[op].axes] == [
        ("cotangent", ("random", "ones"), "ones")]


@pytest.mark.parametrize("op", list(KERNELS))
def test_every_rounding_is_derived_from_a_rule(op: str) -> None:
    """Every aten op the reference and its backward run has a rule (none estimated), and
    the derived rounding of y and dx is above 0 where they are."""
    o = SHAPED[op]
    drawn = o.draw(o.sizes((3, 16)), o.variants()[0], torch.float64, "cpu", _gen(3))
    g = {k: v.to(torch.float64) for k, v in drawn.cotangents.items()}
    m = derived(lambda t: o.reference(t, drawn.options), o.canonical(drawn.tensors, {}), g,
                ["x"])
    assert m.unknown == set()
    assert bool((m.output_sigma["y"] > 0).all()) and bool((m.grad_sigma["x"] > 0).all())


def test_log_softmax_rounds_its_sum_in_any_order() -> None:
    """The row's sum of exponentials, its log and the subtraction round into y: at logits of
    1e3 the maximum's y (≈ 0) is held to the log-sum-exp's rounding, not to u·|y|."""
    x = torch.tensor([[1000.0, 990.0, 0.0, -1000.0]], dtype=torch.float64)
    m = derived(lambda t: SHAPED["log_softmax"].reference(t, {}), {"x": x}, {}, [])
    y = m.outputs["y"]
    assert float(m.output_sigma["y"][0, 0]) > 10 * float(y[0, 0].abs())


@pytest.mark.parametrize("op", list(KERNELS))
@pytest.mark.parametrize("dtype", ["fp64", "fp32", "bf16", "fp16"])
def test_correct_kernel_passes_every_check(op: str, dtype: str) -> None:
    spec = resolve(KERNELS[op], {"op": op})
    assert spec.op == op
    sweep = Sweep(kernels=[], targets=[("cpu", dtype)], shapes=[(2, 3, 32)])
    results = run(sweep, [spec])
    assert {r.check for r in results} == set(SHAPED[op].checks)
    assert {r.layout for r in results} == set(op_layouts(SHAPED[op])) == {
        "contiguous", "x-strided", "grad-strided", "grad-transposed", "grad-expanded"}
    bad = [(r.check, r.layout, r.message, r.max_abs_err, r.tolerance) for r in results
           if r.status != "pass"]
    assert not bad


@pytest.mark.parametrize("op", list(KERNELS))
def test_correct_kernel_passes_awkward_shapes_and_scales(op: str) -> None:
    spec = resolve(KERNELS[op], {"op": op})
    sweep = Sweep(kernels=[], targets=[("cpu", "fp64"), ("cpu", "fp32")],
                  shapes=[(3, 40), (2, 2, 3, 24), (1, 512), (2, 1032)], layouts=["contiguous"],
                  input_scales=SCALES[op], seeds=[0, 1])
    results = run(sweep, [spec])
    assert {r.input_scale for r in results} == set(SCALES[op])
    bad = [(r.check, r.dtype, r.shape, r.input_scale, r.message, r.max_abs_err, r.tolerance)
           for r in results if r.status != "pass"]
    assert results and not bad


@pytest.mark.parametrize("op", list(KERNELS))
def test_no_weight_no_control_and_no_zcg(op: str) -> None:
    """An op without a weight is one point per check and variant whatever γ controls and
    zcg settings a sweep names: its controls are its cotangent's."""
    spec = resolve(KERNELS[op], {"op": op})
    sweep = Sweep(kernels=[spec.name], targets=[("cpu", "fp64")], layouts=["contiguous"],
                  weights=["randn", "ones", "zeros"], zcg=[False, True])
    cfgs = [c for _, c in grid(sweep, [spec])]
    assert len(cfgs) == len(SHAPED[op].checks) * len(SHAPED[op].variants())
    assert {dict(c.variant)["cotangent"] for c in cfgs} == {"random", "ones"}
    assert not_run([sweep], [spec]) == []


def test_plot_takes_the_op(tmp_path: Path) -> None:
    from gradcheck_bi.cli import main

    out = tmp_path / "p.json"
    code = main(["plot", "--kernel", "tests/kernels/layer_norm.py:LayerNorm", "--op",
                 "layer_norm", "--check", "dbias", "--shape", "2,16", "--steps", "-12:-8",
                 "--output", str(out)])
    assert code == 0 and out.exists()


@pytest.mark.parametrize("kernel,op,check", [("tests/kernels/swiglu.py", "swiglu", "db"),
                                             (KERNELS["silu_and_mul"], "silu_and_mul", "dx"),
                                             (KERNELS["log_softmax"], "log_softmax", "dx")])
def test_plot_refuses_an_op_of_any_shape_in_one_line(kernel: str, op: str, check: str,
                                                    capsys: pytest.CaptureFixture[str]
                                                    ) -> None:
    from gradcheck_bi.cli import main

    code = main(["plot", "--kernel", kernel, "--op", op, "--check", check, "--shape", "2,16"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "op of any shape" in err, err


def test_a_failure_line_names_no_axis_the_op_lacks(tmp_path: Path) -> None:
    """A swiglu failure (no weight, no eps) is named without γ, zcg, a γ scale or eps — in
    the failure line, the JUnit testcase and a baseline's key — while an RMSNorm failure
    keeps them."""
    from gradcheck_bi.gate.baseline import describe_key, key_of
    from gradcheck_bi.report.junit import case_name
    from gradcheck_bi.report.tables import describe

    mutant = "tests/mutants/ops/sw01_silu_derivative_missing_its_product_term.py:Mutant"
    spec = resolve(mutant, {"op": "swiglu"})
    sweep = Sweep(kernels=[], targets=[("cpu", "fp64")], shapes=[(4, 64)], checks=["da"],
                  layouts=["contiguous"])
    [r] = run(sweep, [spec])
    assert r.status == "fail"
    lines = [describe(r, scales=True), case_name(r), describe_key(key_of(r))]
    for line in lines:
        assert not any(w in line for w in ("γ", "zcg", "eps")), line
    [before] = run(Sweep(kernels=[], targets=[("cpu", "fp64")], shapes=[(4, 64)],
                         checks=["dx"], weights=["randn"], zcg=[True],
                         layouts=["contiguous"]), [resolve("before")])
    assert before.status == "fail"
    for line in (describe(before, scales=True), case_name(before),
                 describe_key(key_of(before))):
        assert "γ=randn" in line and "zcg=on" in line and "eps" in line, line


@pytest.mark.parametrize("kernel,op", [
    ("tests/kernels/swiglu.py", "swiglu"),
    (KERNELS["log_softmax"], "log_softmax"),
    (KERNELS["silu_and_mul"], "silu_and_mul"),
    ("tests/kernels/gemm.py:GemmFn", "gemm"),
])
def test_run_takes_op_of_any_shape(kernel: str, op: str, tmp_path: Path) -> None:
    """``run --op`` names every op ``gradcheck-bi ops`` lists, the ops of any shape too (it
    listed the norm family's alone, and refused ``--op swiglu`` before reading the kernel)."""
    from gradcheck_bi.cli import main

    out = tmp_path / "r.json"
    code = main(["run", "--kernel", kernel, "--op", op, "--check", "forward", "--format",
                 "json", "--output", str(out), "--no-progress"])
    assert code == 0 and json.loads(out.read_text())["results"][0]["op"] == op


@pytest.mark.parametrize("kernel,layout,op", [
    ("tests/kernels/gemm.py:GemmFn", "x-strided", "gemm"),
    ("after", "A-strided", "rms_norm"),
])
def test_a_layout_the_op_lacks_is_said_not_run(kernel: str, layout: str, op: str,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """A layout that names no tensor of the kernel's op is left out and said — never run
    contiguous under its name (an op of any shape ran x-offset so; x-strided was an internal
    error), and a run of nothing else checks nothing (exit 3)."""
    from gradcheck_bi.cli import main

    code = main(["run", "--kernel", kernel, "--layout", layout, "--check", "forward",
                 "--no-progress"])
    out = capsys.readouterr()
    assert code == 3, out
    assert f"layout {layout} not run: {op} has no such layout" in out.out + out.err
