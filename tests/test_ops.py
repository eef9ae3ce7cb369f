"""The norm family (gradcheck_bi.ops, gradcheck_bi.checks.rows): references, engine,
recognition, the sweep and the JSON, each checked against something written independently.

The references are compared with formulas written here (and torch's own layer_norm); the
correct kernels (tests/kernels/) with torch.autograd through the reference on fresh random
inputs; the finite-difference engine with autograd through the reference.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from gradcheck_bi import cli
from gradcheck_bi.checks import run_check
from gradcheck_bi.checks.rows import exact_grads, make_point, reference
from gradcheck_bi.checks.rows import point as rows_point
from gradcheck_bi.checks.rows.gradients import reach
from gradcheck_bi.fd.coloured import input_grad_outputs
from gradcheck_bi.fd.step import pow2
from gradcheck_bi.kernels import resolve
from gradcheck_bi.kernels.calling.opcall import op_grads
from gradcheck_bi.ops import ROWS, SHAPED
from gradcheck_bi.runner import run
from gradcheck_bi.sweep import Sweep, checks_of, grid, not_run
from gradcheck_bi.vocab import Config, KernelLoadError, Unsupported

ROOT = Path(__file__).resolve().parents[1]
KERNELS = {"fused_add_rms_norm": "tests/kernels/fused_add_rms_norm.py",
           "layer_norm": "tests/kernels/layer_norm.py",
           "rms_norm_gated": "tests/kernels/rms_norm_gated.py"}
SHAPES = "tests/kernels/norm_shapes.py"


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _points(op: str) -> list[Config]:
    """Configs of ``op`` at every option value the default sweep has, γ randn, zcg off."""
    base = Config(check="forward", op=op, shape=(3, 2, 32), seed=7)
    return [cfg for _, cfg in grid(Sweep(kernels=[], targets=[("cpu", "fp64")],
                                         shapes=[(3, 2, 32)], seeds=[7], checks=["forward"],
                                         weights=["randn"], zcg=[False]),
                                   [resolve(KERNELS[op])])] or [base]


def test_references_match_formulas_written_here() -> None:
    g = _gen(1)
    x, r, z = (torch.randn(4, 24, generator=g, dtype=torch.float64) for _ in range(3))
    w, b = (torch.randn(24, generator=g, dtype=torch.float64) for _ in range(2))
    eps = 1e-5
    ref = ROWS["layer_norm"].reference({"x": x}, {"weight": w, "bias": b}, {"eps": eps})
    assert torch.allclose(ref["y"], F.layer_norm(x, (24,), w, b, eps), rtol=0, atol=1e-13)
    fused = ROWS["fused_add_rms_norm"].reference({"x": x, "residual": r}, {"weight": w},
                                               {"eps": eps})
    s = x + r
    by_hand = s / torch.sqrt((s * s).sum(-1, keepdim=True) / 24 + eps) * w
    assert torch.equal(fused["residual_out"], s)
    assert torch.allclose(fused["y"], by_hand, rtol=0, atol=1e-13)
    for before in (True, False):
        out = ROWS["rms_norm_gated"].reference({"x": x, "z": z}, {"weight": w},
                                             {"eps": eps, "group_size": 8,
                                              "norm_before_gate": before})["y"]
        gate = z / (1 + torch.exp(-z))
        v = x if before else x * gate
        expect = torch.empty_like(v)
        for k in range(0, 24, 8):  # one group at a time, by hand
            block = v[:, k:k + 8]
            expect[:, k:k + 8] = block / torch.sqrt((block * block).mean(-1, keepdim=True) + eps)
        expect = expect * w * (gate if before else 1.0)
        assert torch.allclose(out, expect, rtol=0, atol=1e-13), before


@pytest.mark.parametrize("op", list(KERNELS))
def test_correct_kernels_match_autograd_through_the_reference(op: str) -> None:
    spec = resolve(KERNELS[op])
    for cfg in _points(op):
        for control, zcg in (("randn", False), ("randn", True), ("ones", False)):
            if zcg not in spec.zcg:
                continue
            p = make_point(Config(**{**cfg.__dict__, "control": control,
                                     "zero_centered_gamma": zcg}))
            outs, grads = op_grads(spec.fn, p.inputs, p.params, p.cotangents, p.options, p.zcg)
            exact, ref = exact_grads(p), reference(p)
            for name, y in outs.items():
                assert torch.allclose(y, ref[name], rtol=0, atol=1e-12), (op, name)
            for name, g in grads.items():
                err = float((g - exact[name]).abs().max())
                assert err < 1e-11, (op, cfg.group_size, cfg.norm_before_gate, name, err)


def test_exact_grads_are_computed_when_first_read(monkeypatch: pytest.MonkeyPatch) -> None:
    p = make_point(Config(check="dx", op="fused_add_rms_norm", shape=(3, 16)))
    passes: list[int] = []
    eager = rows_point.exact_grads
    monkeypatch.setattr(rows_point, "exact_grads",
                        lambda point: passes.append(1) or eager(point))  # type: ignore[func-returns-value]
    lazy = rows_point.ExactGrads(p)
    assert passes == [], "nothing read, no autograd pass"
    want = eager(p)
    assert list(lazy) == list(want) and len(lazy) == len(want)
    assert all(torch.equal(lazy[n], want[n]) for n in want)
    assert passes == [1], "one pass for every read"


@pytest.mark.parametrize("op", list(KERNELS))
def test_finite_differences_of_the_reference_match_autograd(op: str) -> None:
    """The engine differencing the fp64 reference itself: every input's estimate within its
    noise floor of the exact gradient."""
    for cfg in _points(op):
        p = make_point(cfg)
        exact = exact_grads(p)
        for name in p.op.inputs:
            others = {n: t.reshape(-1, 32) for n, t in p.inputs.items() if n != name}

            def forward(t2: torch.Tensor, name: str = name, others: Any = others,
                        p: Any = p) -> list[torch.Tensor]:
                rows = t2.reshape(-1, 32)  # t's own shape, or perturbed rows + padding
                k, m = -(-rows.shape[0] // 6), rows.shape[0]
                ins = {name: rows, **{n: o.repeat(k, 1)[:m] for n, o in others.items()}}
                out = p.op.reference(ins, p.effective, p.options)
                return [out[o].reshape(t2.shape) for o in p.op.outputs]

            h = pow2(2.0**-11 * p.op.step_scale(p, name))
            est = input_grad_outputs(forward, p.inputs[name], [p.cotangents[o] for o in
                                                               p.op.outputs], h,
                                     reach=reach(p, name, list(p.op.outputs)))
            ratio = float(((est.grad - exact[name]).abs() / est.noise_floor).max())
            assert ratio <= 1.0, (op, cfg.group_size, cfg.norm_before_gate, name, ratio)


@pytest.mark.parametrize("op", list(KERNELS))
@pytest.mark.parametrize("dtype", ["fp64", "fp32", "bf16"])
def test_correct_kernels_named_by_path_pass_every_check(op: str, dtype: str) -> None:
    spec = resolve(KERNELS[op])
    assert spec.op == op and spec.recognised.startswith(f"recognised {op}")
    sweep = Sweep(kernels=[], targets=[("cpu", dtype)], shapes=[(2, 3, 32)])
    results = run(sweep, [spec])
    assert {r.check for r in results} == set(checks_of(spec))  # the gated norm: no dbias
    bad = [(r.check, r.weight, r.bias, r.group_size, r.norm_before_gate, r.message,
            r.max_abs_err, r.tolerance) for r in results if r.status != "pass"]
    assert not bad


def test_fused_add_normalising_residual_out_as_stored_passes_in_bf16() -> None:
    """Liger and vLLM normalise (and save) x + residual rounded to bf16: a second correct
    reference, which the kernel that rounds nothing before the norm does not need."""
    stored = resolve("tests/kernels/fused_add_stored.py")
    sweep = Sweep(kernels=[], targets=[("cpu", "bf16")], shapes=[(2, 3, 32)],
                  weights=["randn"], zcg=[False])
    results = run(sweep, [stored])
    assert results and all(r.status == "pass" for r in results), [
        (r.check, r.message) for r in results if r.status != "pass"]
    grads = [r for r in results if r.check in ("dx", "dresidual", "dw")]
    assert all(r.details["s"].startswith("residual_out as stored") for r in grads)
    plain = run(sweep, [resolve(KERNELS["fused_add_rms_norm"])])
    assert all(r.details["s"] == "x + residual as computed" for r in plain
               if r.check in ("dx", "dresidual", "dw"))


def test_gated_default_sweep_covers_group_sizes_and_both_modes() -> None:
    spec = resolve(KERNELS["rms_norm_gated"])
    cfgs = [c for _, c in grid(Sweep(kernels=[], targets=[("cpu", "fp64")],
                                     shapes=[(2, 64)], checks=["dz"]), [spec])]
    assert {(c.group_size, c.norm_before_gate) for c in cfgs} == {
        (16, True), (16, False), (64, True), (64, False)}
    layer = [c for _, c in grid(Sweep(kernels=[], targets=[("cpu", "fp64")], checks=["dbias"],
                                      weights=["ones"]), [resolve(KERNELS["layer_norm"])])]
    assert [c.bias for c in layer] == ["randn", "zeros"]


def test_half_precision_points_and_layouts_are_scheduled_for_other_ops() -> None:
    spec = resolve(KERNELS["layer_norm"])
    sweep = Sweep(kernels=[spec.name], targets=[("cpu", "bf16"), ("cpu", "fp32")])
    cfgs = [c for _, c in grid(sweep, [spec])]
    assert {c.dtype for c in cfgs} == {"bf16", "fp32"}
    assert {c.check for c in cfgs if c.dtype == "bf16"} == set(ROWS["layer_norm"].checks)
    assert {c.layout for c in cfgs} == {"contiguous", "x-strided", "grad-strided"}
    assert {c.control for c in cfgs if c.layout != "contiguous"} == {"randn"}
    assert not any("layout" in n for n in not_run([sweep], [spec]))


def test_json_keys_of_an_op_result_and_none_for_rmsnorm(capsys: pytest.CaptureFixture[str]
                                                       ) -> None:
    code = cli.main(["run", "--kernel", KERNELS["layer_norm"], "--check", "dbias",
                     "--weight", "ones", "--shape", "2,16", "--format", "json",
                     "--no-progress"])
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert code == 0, doc
    keys = list(doc["results"][0])
    assert keys[:3] == ["kernel", "op", "check"]
    assert keys[keys.index("weight") + 1] == "bias"
    assert [r["bias"] for r in doc["results"]] == ["randn", "zeros"]
    assert "recognised layer_norm from its parameters (x, weight, bias, eps)" in err
    cli.main(["run", "--kernel", "after", "--check", "forward", "--weight", "ones",
              "--zcg", "off", "--shape", "2,16", "--format", "json", "--no-progress"])
    plain = json.loads(capsys.readouterr()[0])["results"][0]
    assert not {"op", "bias", "group_size", "norm_before_gate"} & set(plain)


@pytest.mark.parametrize("attr, op", [
    ("fused_add", "fused_add_rms_norm"),          # hidden_states, residual: positional
    ("fused_add_y_only", "fused_add_rms_norm"),   # X, R, W; returns y alone
    ("gated", "rms_norm_gated"),                  # z before x, keyword-only options
    ("layer_norm", "layer_norm"),                 # input, variance_epsilon
    ("rms_with_optional", "rms_norm"),            # bias=None, residual=None, prenorm=False
    ("FusedAddNorm", "fused_add_rms_norm"),       # an nn.Module: forward(hidden, residual)
    ("GatedNorm", "rms_norm_gated"),              # ctor group_size, norm_before_gate
    ("BiasNorm", "layer_norm"),                   # (D,) parameters gamma and beta
])
def test_recognised_from_parameter_names(attr: str, op: str) -> None:
    spec = resolve(f"{SHAPES}:{attr}")
    assert spec.op == op, spec.recognised
    # A marked op says so from its parameters; an RMSNorm from its own name and output
    # (this one adds its bias=None when given one: checked with its bias).
    assert spec.recognised.startswith(f"recognised {op} from its parameters") if op != \
        "rms_norm" else spec.recognised == ("recognised rms_norm with a bias from its name "
                                            "(rms_with_optional) and its output")
    results = run(Sweep(kernels=[], targets=[("cpu", "fp64")], shapes=[(2, 16)],
                        weights=["randn"], zcg=[False]), [spec])
    assert results and all(r.status == "pass" for r in results), [
        (r.check, r.status, r.message) for r in results if r.status != "pass"]


def test_ambiguous_signature_is_one_line_and_op_decides(capsys: pytest.CaptureFixture[str]
                                                       ) -> None:
    with pytest.raises(KernelLoadError, match="fit fused_add_rms_norm and layer_norm"):
        resolve(f"{SHAPES}:fused_and_bias")
    code = cli.main(["run", "--kernel", f"{SHAPES}:fused_and_bias", "--no-progress"])
    err = capsys.readouterr()[1]
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    spec = resolve(f"{SHAPES}:fused_and_bias", {"op": "fused_add_rms_norm"})
    assert spec.op == "fused_add_rms_norm" and "given by --op" in spec.recognised
    with pytest.raises(KernelLoadError, match="--op 'norm'"):
        resolve(f"{SHAPES}:fused_add", {"op": "norm"})


def test_torch_layer_norm_adapters_pass_on_cpu() -> None:
    for name in ("torch:layer_norm", "torch:nn.LayerNorm"):
        spec = resolve(name)
        assert spec.op == "layer_norm"
        results = run(Sweep(kernels=[], targets=[("cpu", "fp32")], shapes=[(3, 40)]), [spec])
        assert results and all(r.status == "pass" for r in results), name


def test_ops_command_lists_every_op_and_the_names(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["ops"]) == 0
    out = capsys.readouterr()[0]
    for op in ROWS.values():
        assert op.name in out and f"checks {', '.join(op.checks)}" in out
    for shaped in SHAPED.values():  # the ops of any shape too, with their blind controls
        if not shaped.independent:  # a generic check's op, registered by an earlier test
            assert f"\n{shaped.name}\n" not in out
            continue
        assert f"\n{shaped.name}\n" in out and f"checks {', '.join(shaped.checks)}" in out
    assert "cotangent (random/ones, ones blind, a control)" in out
    assert "hidden_states" in out and "variance_epsilon" in out
    assert max(len(line) for line in out.splitlines()) <= 80


def test_cli_picks_the_other_ops_axes(capsys: pytest.CaptureFixture[str]) -> None:
    """--bias, --group-size and --norm-before-gate set the other row ops' own axes, as the case
    keys biases, group_sizes and norm_before_gate do; a bad value is one line, exit 2."""
    def results(*args: str) -> list[dict]:
        code = cli.main(["run", "--check", "forward", "--weight", "randn", "--shape", "3,40",
                         "--layout", "contiguous", "--format", "json", "--no-progress", *args])
        assert code == 0
        return json.loads(capsys.readouterr()[0])["results"]

    gated = results("--kernel", KERNELS["rms_norm_gated"], "--group-size", "8,D",
                    "--norm-before-gate", "off")
    assert sorted((r["group_size"], r["norm_before_gate"]) for r in gated) == [
        (8, False), (40, False)]
    assert [r["bias"] for r in results("--kernel", KERNELS["layer_norm"],
                                       "--bias", "zeros")] == ["zeros"]
    for bad in (["--group-size", "0"], ["--bias", "ones"], ["--norm-before-gate", "maybe"]):
        assert cli.main(["run", *bad]) == 2
        err = capsys.readouterr()[1]
        assert err.count("\n") == 1 and bad[0] in err


@pytest.mark.parametrize("attr, layout", [("ResidualAssumedContiguous", "x-strided"),
                                          ("ResidualGradAssumedContiguous", "grad-strided")])
def test_layouts_reach_every_input_and_cotangent_of_the_other_ops(
        capsys: pytest.CaptureFixture[str], attr: str, layout: str) -> None:
    """A fused add that reads residual (or residual_out's cotangent) as if it were
    contiguous passes on contiguous tensors and fails in its layout: x-… lays out every
    input shaped like x, grad-… the cotangent of every output."""
    code = cli.main(["run", "--kernel", f"{ROOT}/tests/kernels/norm_layouts.py:{attr}",
                     "--shape", "2,3,24", "--weight", "randn", "--zcg", "off",
                     "--check", "dx,dresidual", "--layout", f"contiguous,{layout}",
                     "--format", "json", "--no-progress"])
    results = json.loads(capsys.readouterr()[0])["results"]
    assert code == 1
    status = {(r["check"], r["layout"]): r["status"] for r in results}
    assert status == {("dx", "contiguous"): "pass", ("dresidual", "contiguous"): "pass",
                      ("dx", layout): "fail", ("dresidual", layout): "fail"}, status


def test_correct_kernels_of_the_other_ops_pass_every_layout(capsys: pytest.CaptureFixture[str]
                                                            ) -> None:
    from gradcheck_bi.kernels.calling.layout import LAYOUTS

    for op in ("fused_add_rms_norm", "layer_norm", "rms_norm_gated"):
        code = cli.main(["run", "--kernel", KERNELS[op], "--shape", "2,3,16",
                         "--weight", "randn", "--zcg", "off", "--layout", ",".join(LAYOUTS),
                         "--format", "json", "--no-progress"])
        results = json.loads(capsys.readouterr()[0])["results"]
        assert code == 0, [r for r in results if r["status"] != "pass"]
        assert {r["layout"] for r in results} == set(LAYOUTS)


def test_fp32_inside_double_rounding_is_diagnosed_a_precision_choice() -> None:
    """A kernel that computes in fp32 at every dtype and rounds twice in bf16 (Liger's llama
    mode) fails the bf16 forward, and the diagnosis reruns it in fp64, where it is accurate
    to fp32 only: that is still "right" within the margin below the bf16 ulp, so the message
    blames precision, not the formula. A formula error (ln04) is told apart."""
    spec = resolve("tests/kernels/fused_add_fp32_inside.py:fused_add_rms_norm")
    assert spec.op == "fused_add_rms_norm"
    sweep = Sweep(kernels=[], targets=[("cpu", "bf16")], shapes=[(4, 2, 256)],
                  checks=["forward"], weights=["randn"], zcg=[False], layouts=["contiguous"])
    [r] = run(sweep, [spec])
    assert r.status == "fail" and "double rounding" in r.message, r.message
    assert "in fp64 the same forward is right: a precision choice" in r.message, r.message
    formula = resolve("tests/mutants/ops/ln04_variance_not_centred.py")
    results = run(sweep, [formula])
    assert results and all(r.status == "fail" and "its fp64 forward is wrong too" in r.message
                           for r in results), [r.message for r in results]


def test_layer_norm_two_features_half_precision_ties_are_not_a_false_alarm() -> None:
    """D = 2: the normalised row is ±(1 − δ) with δ far below fp32's resolution, so with
    γ = ones y = β ± 1 sits on fp16 ties its correct fp32 arithmetic cannot resolve (found on
    an H200 by benchmarks/op_false_alarms.py: 9 of 54 elements "not correctly rounded")."""
    spec = resolve(KERNELS["layer_norm"])
    cfg = Config(check="forward", op="layer_norm", dtype="fp16", shape=(27, 2),
                 eps=3.6005629526953605e-08, seed=1694895108, control="ones",
                 input_scale=11.502644930603148, weight_scale=0.6120794460167553, bias="randn")
    m = run_check(spec.fn, cfg)
    assert m.passed, m.message
    assert m.details["ties_within_fp32_y"] >= 5


def test_row_op_differences_keep_to_the_memory_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """--max-memory reaches the row ops' finite differences: a small budget splits the
    columns into more calls with the same bits, and one that cannot hold a call of one
    column is refused with the estimate (the check is then unsupported, not an error)."""
    from gradcheck_bi.fd import MemoryBudgetError
    from gradcheck_bi.fd import coloured as fd_coloured
    from gradcheck_bi.fd.coloured import BYTES_PER_ELEMENT
    from gradcheck_bi.fd.stencil import LEVELS

    x = torch.randn(8, 64, dtype=torch.float64, generator=_gen(3))
    g = torch.randn(8, 64, dtype=torch.float64, generator=_gen(4))
    h = torch.full((8,), 2.0**-12, dtype=torch.float64)

    def forward(t: torch.Tensor) -> list[torch.Tensor]:
        return [t * t.sum(-1, keepdim=True)]

    whole = input_grad_outputs(forward, x, [g], h)
    points = 2 * len(LEVELS)  # ±o·h for every level
    held = 2 * points * 64 * 8 * 8  # the sums and the steps taken, fp64
    column = points * 8 * 64 * BYTES_PER_ELEMENT  # one perturbed column of every row
    assert fd_coloured.least_bytes((8, 64)) == held + column
    split = input_grad_outputs(forward, x, [g], h, max_memory=held + 5 * column)
    assert split.forward_calls > whole.forward_calls
    assert torch.equal(split.grad, whole.grad)
    with pytest.raises(MemoryBudgetError, match="over the memory budget"):
        input_grad_outputs(forward, x, [g], h, max_memory=held + column // 2)
    # A budget that holds one column but not its power of two, and a column over the
    # preferred call size: one column a call, the same bits (and never "raise --max-memory").
    exact = input_grad_outputs(forward, x, [g], h, max_memory=fd_coloured.least_bytes((8, 64)))
    assert torch.equal(exact.grad, whole.grad) and exact.forward_calls == 64 + 1
    monkeypatch.setattr(fd_coloured, "MAX_ELEMENTS", 64)
    capped = input_grad_outputs(forward, x, [g], h)
    assert torch.equal(capped.grad, whole.grad) and capped.forward_calls == 64 + 1
    cfg = Config(check="dx", op="layer_norm", shape=(8, 64), bias="randn",
                 max_memory=held + column // 2)
    with pytest.raises(Unsupported, match="raise --max-memory"):
        run_check(resolve(KERNELS["layer_norm"]).fn, cfg)


@pytest.mark.parametrize(("attr", "before"), [("before", True), ("after", False)])
def test_gated_kernel_without_group_size_or_order_runs_no_point_at_an_absent_axis(
        attr: str, before: bool) -> None:
    """``(x, z, weight, eps)``: the group is the row, the gate order and activation the
    ones its forward matches; every gradient it has is checked, each absent axis dropped
    with one note."""
    spec = resolve(f"tests/kernels/gated_fixed.py:{attr}", {"op": "rms_norm_gated"})
    assert dict(spec.fixed) == {"bias": None, "group_size": None, "norm_before_gate": before,
                                "activation": "silu"}
    sweep = Sweep(kernels=[spec.name], targets=[("cpu", "fp64")], shapes=[(2, 3, 32)])
    results = run(sweep, [spec])
    assert {r.check for r in results} == set(checks_of(spec))
    assert {(r.group_size, r.norm_before_gate) for r in results} == {(32, before)}
    assert all(r.status == "pass" for r in results), [
        (r.check, r.message) for r in results if r.status != "pass"]
    notes = [n for n in not_run([sweep], [spec]) if "not swept" in n]
    assert len(notes) == 3 and "group_size" in notes[0] and "norm_before_gate" in notes[1]
    assert "activation" in notes[2]


@pytest.mark.parametrize(("attr", "op", "absent"), [
    ("layer_norm_plain", "layer_norm", {"weight", "bias"}),
    ("layer_norm_weight", "layer_norm", {"bias"}),
    ("gated_plain", "rms_norm_gated", {"weight"})])
def test_kernel_without_a_parameter_is_run_at_its_identity_and_not_swept(
        attr: str, op: str, absent: set[str]) -> None:
    """A weight or bias the kernel does not take is absent: run at γ = 1 / β = 0, its
    gradient and its controls not asked, one note each (zcg goes with the weight)."""
    spec = resolve(f"tests/kernels/no_affine.py:{attr}", {"op": op})
    assert absent <= {n for n, _ in spec.fixed}  # and the gated norm's optional bias
    sweep = Sweep(kernels=[spec.name], targets=[("cpu", "fp64")], shapes=[(2, 3, 32)],
                  layouts=["contiguous", "weight-strided"])
    results = run(sweep, [spec])
    gone = {ROWS[op].param(n).check for n in absent}
    assert {r.check for r in results} == set(checks_of(spec)) and not gone & set(checks_of(spec))
    assert all(r.status == "pass" for r in results), [
        (r.check, r.message) for r in results if r.status != "pass"]
    if "weight" in absent:
        assert {(r.weight, r.zero_centered_gamma, r.layout) for r in results} == {
            ("ones", False, "contiguous")}
    if "bias" in absent:
        assert {r.bias for r in results} == {"zeros"}
    notes = not_run([sweep], [spec])
    assert sorted(n.split(": ")[1].split(" ")[0] for n in notes if "absent —" in n) == sorted(
        absent), notes
    assert ("weight" in absent) == (not any("zcg" in n for n in notes)), notes


def test_gated_norm_with_a_bias_has_its_optional_part_checked() -> None:
    """The gated norm's bias is optional: absent (no dbias, no β axis, no note) for a kernel
    without one, swept and checked for a kernel with one."""
    spec = resolve("tests/kernels/no_affine.py:gated_bias", {"op": "rms_norm_gated"})
    sweep = Sweep(kernels=[spec.name], targets=[("cpu", "fp64"), ("cpu", "bf16")],
                  shapes=[(2, 3, 32)], weights=["randn"], layouts=["contiguous"])
    results = run(sweep, [spec])
    assert {r.check for r in results} == set(ROWS["rms_norm_gated"].checks)
    assert {r.bias for r in results} == {"randn", "zeros"}
    assert all(r.status == "pass" for r in results), [
        (r.check, r.dtype, r.message) for r in results if r.status != "pass"]
    plain = resolve(KERNELS["rms_norm_gated"])
    assert dict(plain.fixed) == {"bias": None, "activation": "silu"}
    assert [h.split(" —")[0] for h in plain.fixed_how] == ["activation not swept"]
    cfgs = [c for _, c in grid(sweep, [plain])]
    assert {c.bias for c in cfgs} == {None} and "dbias" not in {c.check for c in cfgs}
