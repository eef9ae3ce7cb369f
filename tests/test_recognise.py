"""Recognition from everything a kernel shows (kernels/adapting/recognise.py,
kernels/adapting/behaviour.py): its parameters, its own name and one forward call; the ops'
optional parts (an RMSNorm without a weight or with a bias, a LayerNorm without a bias,
γ = 1 + w, a gated norm without group_size / norm_before_gate) checked with every gradient
they have and nothing swept at an axis they lack; a named op whose output matches another
fails its forward naming it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from gradcheck_bi import cli
from gradcheck_bi.kernels import resolve
from gradcheck_bi.kernels.adapting.behaviour import MATCH, candidates, drawn_values, probe
from gradcheck_bi.runner import run
from gradcheck_bi.sweep import Sweep, checks_of, grid, not_run, sweep_of, takes
from gradcheck_bi.vocab import KernelLoadError

VARIANTS = str(Path(__file__).parent / "kernels" / "variants.py")
SMALL = {"targets": [("cpu", "fp64")], "shapes": [(3, 32)]}


def _run(spec: Any, **kw: Any) -> list[Any]:
    return run(sweep_of(kernels=[], **{**SMALL, **kw}), [spec])


def _failing(results: list[Any]) -> list[tuple[Any, ...]]:
    return [(r.check, r.weight, r.bias, r.status, r.message) for r in results
            if r.status != "pass"]


def test_candidate_variants_are_far_apart_at_the_probe_point() -> None:
    """Any two candidates differ by far more than MATCH at the probe's point, so one output
    matches at most one of them."""
    values = drawn_values(torch.float64)["fp64"]
    for roles in ({"x", "weight"}, {"x", "weight", "bias"}, {"x", "z", "weight", "bias"},
                  {"x"}, {"x", "residual", "weight"}):
        refs = [(v, v.reference(values, 8)) for v in candidates(frozenset(roles))]
        for i, (a, ra) in enumerate(refs):
            for b, rb in refs[i + 1:]:
                if ra.shape == rb.shape:
                    gap = float((ra - rb).abs().max() / ra.abs().max())
                    assert gap > 5 * MATCH, (a.words, b.words, gap)


def test_probe_tells_layer_norm_with_and_without_bias() -> None:
    def ln(values: dict[str, Any], bias: bool) -> torch.Tensor:
        return torch.nn.functional.layer_norm(values["x"], values["shape"], values["weight"],
                                              values["bias"] if bias else None, values["eps"])

    roles = frozenset({"x", "weight", "bias"})
    assert probe(lambda v: ln(v, True), roles).match().words == "layer_norm"
    assert probe(lambda v: ln(v, False), roles).match().words == "layer_norm without bias"
    none = probe(lambda v: 2 * v["x"] * v["weight"], frozenset({"x", "weight"}))
    assert none.match() is None and none.closest.startswith("closest: ")


def test_torch_functional_layer_norm_is_a_layer_norm_and_passes(
        capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["run", "--kernel", "torch.nn.functional:layer_norm", "--shape", "3,32",
                     "--no-progress"])
    err = capsys.readouterr()[1]
    assert code == 0, err
    assert ("recognised layer_norm from its name (layer_norm) and its output") in err


@pytest.mark.parametrize("ref, args", [
    ("transformers.models.cohere.modeling_cohere:CohereLayerNorm", []),
    ("torch.nn:LayerNorm", ["--kernel-arg", "bias=False"]),
])
def test_layer_norm_modules_without_bias_pass(ref: str, args: list[str],
                                              capsys: pytest.CaptureFixture[str]) -> None:
    if ref.startswith("transformers"):
        pytest.importorskip("transformers")
    code = cli.main(["run", "--kernel", ref, *args, "--shape", "3,32", "--no-progress",
                     "--format", "json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "recognised layer_norm without bias from its name" in err
    assert "bias absent — the kernel takes none: no dbias, run as bias=zeros" in err
    results = json.loads(out)["results"]
    assert {r["bias"] for r in results} == {"zeros"}
    assert "dbias" not in {r["check"] for r in results}


def test_a_weightless_norm_computing_in_fp32_is_judged_at_fp32(
        capsys: pytest.CaptureFixture[str]) -> None:
    # Its working precision is measured at the weight it has (none: γ ≡ 1), not at γ =
    # randn, which it cannot take; --precision exact keeps the fp64 judgement.
    ref = f"{VARIANTS}:rms_norm_unweighted_fp32_inside"
    code = cli.main(["run", "--kernel", ref, "--shape", "3,32", "--no-progress"])
    err = capsys.readouterr().err
    assert code == 0 and "computes in fp32 inside" in err, err
    assert cli.main(["run", "--kernel", ref, "--shape", "3,32", "--no-progress",
                     "--precision", "exact"]) == 1


def test_a_t5_style_layer_norm_is_checked_as_the_rms_norm_it_computes(
        capsys: pytest.CaptureFixture[str]) -> None:
    # "LayerNorm" names a family (T5LayerNorm and its copies: no mean, no bias): its output
    # decides, one note says so, and --op layer_norm still holds it to the name.
    ref = f"{VARIANTS}:T5StyleLayerNorm"
    code = cli.main(["run", "--kernel", ref, "--shape", "3,32", "--no-progress"])
    err = capsys.readouterr().err
    assert code == 0, err
    assert "recognised rms_norm from its name (T5StyleLayerNorm) taken as the wider family" in err
    assert cli.main(["run", "--kernel", ref, "--op", "layer_norm", "--check", "forward",
                     "--shape", "3,32", "--no-progress"]) == 1
    # A layer norm with a bias that forgets its mean is not excused: named, it fails.
    capsys.readouterr()
    code = cli.main(["run", "--kernel", f"{VARIANTS}:MeanlessLayerNorm", "--check", "forward",
                     "--shape", "3,32", "--no-progress"])
    assert code == 1, capsys.readouterr().err


def test_rmsnorm_whose_forward_subtracts_the_mean_fails_naming_layer_norm(
        capsys: pytest.CaptureFixture[str]) -> None:
    ref = f"{VARIANTS}:MeanSubtractingRMSNorm"
    code = cli.main(["run", "--kernel", ref, "--check", "forward", "--shape", "3,32",
                     "--no-progress", "--format", "json"])
    out, err = capsys.readouterr()
    assert code == 1, err
    failed = [r for r in json.loads(out)["results"] if r["status"] == "fail"]
    assert failed and all("its output matches layer_norm without bias, not rms_norm: check "
                          "it as that with --op layer_norm" in r["message"] for r in failed)
    # checked as that, it passes: the mismatch named the right op
    assert cli.main(["run", "--kernel", ref, "--op", "layer_norm", "--shape", "3,32",
                     "--no-progress"]) == 0


def test_output_matching_no_op_is_one_refusal_line() -> None:
    """Read as rms_norm by default alone (no name, no parameter says it), an output that
    matches no op is refused with one line, not checked against a guessed op; --op holds it
    to an op, and its failed forward then says what it matched."""
    with pytest.raises(KernelLoadError) as refused:
        resolve(f"{VARIANTS}:doubling_norm")
    line = str(refused.value)
    assert "\n" not in line and "doubling_norm(x, weight, eps)" in line
    assert "matches no op here (nearest: " in line and "max relative error" in line
    assert "--op NAME" in line and "--generic" in line
    spec = resolve(f"{VARIANTS}:doubling_norm", {"op": "rms_norm"})
    fails = [r for r in _run(spec, checks=["forward"], weights=["randn"], zcg=[False])
             if r.status == "fail"]
    assert fails


def test_videoprism_is_a_zero_centred_layer_norm() -> None:
    pytest.importorskip("transformers")
    spec = resolve("transformers.models.videoprism.modeling_videoprism:VideoPrismLayerNorm")
    assert spec.op == "layer_norm" and spec.zcg == {True}
    assert "recognised layer_norm γ = 1 + w" in spec.recognised
    results = _run(spec, zcg=[True])
    assert results and not _failing(results)


@pytest.mark.parametrize("cls", ["bailing_hybrid.modeling_bailing_hybrid:"
                                 "BailingHybridRMSNormGated",
                                 "glm5_next.modeling_glm5_next:Glm5NextTextRMSNormGated",
                                 "kimi_linear.modeling_kimi_linear:KimiLinearRMSNormGated"])
def test_gated_norms_whose_gate_defaults_to_none_get_their_gate(cls: str) -> None:
    """Read as gated from their names and given a gate (no call raises); their gate is a
    sigmoid, which the op's gate activation option holds: recognised with activation=sigmoid
    from their output, and their forward passes."""
    pytest.importorskip("transformers")
    spec = resolve(f"transformers.models.{cls}")
    assert spec.op == "rms_norm_gated", spec.recognised
    assert "activation=sigmoid" in spec.recognised and spec.mismatch == "", spec.recognised
    assert dict(spec.fixed)["group_size"] is None
    assert dict(spec.fixed)["activation"] == "sigmoid"
    results = _run(spec, checks=["forward"], weights=["randn"], zcg=[False])
    assert results and {r.status for r in results} == {"pass"}


def test_silu_gated_norm_with_gate_none_and_no_options_is_not_swept() -> None:
    spec = resolve(f"{VARIANTS}:SiluRMSNormGated")
    assert spec.op == "rms_norm_gated" and spec.mismatch == ""
    assert dict(spec.fixed) == {"bias": None, "group_size": None, "norm_before_gate": True,
                                "activation": "silu"}
    sweep = Sweep(kernels=[spec.name], **SMALL)
    assert {(c.group_size, c.norm_before_gate) for _, c in grid(sweep, [spec])} == {(32, True)}
    lines = not_run([sweep], [spec])
    assert sum("group_size not swept" in n for n in lines) == 1
    assert sum("norm_before_gate not swept" in n for n in lines) == 1
    results = _run(spec)
    assert {r.check for r in results} == {"forward", "dx", "dz", "dw", "batch_invariance"}
    assert not _failing(results)


@pytest.mark.parametrize("attr, args, checks, biases", [
    ("rms_norm_unweighted", {}, {"forward", "dx", "batch_invariance"}, {None}),
    ("rms_norm_unweighted", {"op": "rms_norm"}, {"forward", "dx", "batch_invariance"}, {None}),
    ("rms_norm_bias", {}, {"forward", "dx", "dw", "dbias", "batch_invariance"},
     {"randn", "zeros"}),
    ("affine_norm", {"op": "rms_norm"}, {"forward", "dx", "dw", "dbias", "batch_invariance"},
     {"randn", "zeros"}),
    ("affine_norm", {}, {"forward", "dx", "dw", "dbias", "batch_invariance"},
     {"randn", "zeros"}),
    ("RMSNormWithBias", {}, {"forward", "dx", "dw", "dbias", "batch_invariance"},
     {"randn", "zeros"}),
])
@pytest.mark.parametrize("dtype", ["fp64", "bf16"])
def test_rms_norm_variants_pass_with_every_gradient_they_have(
        attr: str, args: dict[str, str], checks: set[str], biases: set[str | None],
        dtype: str) -> None:
    spec = resolve(f"{VARIANTS}:{attr}", args or None)
    assert spec.op == "rms_norm"
    results = _run(spec, targets=[("cpu", dtype)])
    assert {r.check for r in results} == set(checks_of(spec)) == checks
    assert {r.bias for r in results} == biases
    if "dw" not in checks:  # no weight: one γ point (its identity), zcg off, one note
        assert {(r.weight, r.zero_centered_gamma) for r in results} == {("ones", False)}
        lines = not_run([Sweep(kernels=[spec.name], **SMALL)], [spec])
        assert [n for n in lines if "weight absent" in n] == [
            f"{spec.name}: weight absent — the kernel takes none: no dw, run as weight=ones"]
    assert not _failing(results)


def test_a_bias_variant_defect_is_caught_by_dbias() -> None:
    spec = resolve(f"{VARIANTS}:rms_norm_bias_dbias_times_gamma")
    results = _run(spec, weights=["randn", "ones"], zcg=[False])
    failed = {(r.check, r.weight) for r in results if r.status == "fail"}
    assert failed == {("dbias", "randn")}  # blind at γ = ones, where Σ g γ = Σ g


def test_plain_rmsnorm_is_recognised_without_a_mismatch_and_takes_no_bias() -> None:
    for ref in ("torch.nn.functional:rms_norm", "torch.nn:RMSNorm"):
        spec = resolve(ref)
        assert spec.op == "rms_norm" and not takes(spec, "bias") and spec.mismatch == ""
        assert spec.recognised == f"recognised rms_norm from its name ({ref.split(':')[1]})" \
                                  " and its output"
    # Megatron's own apply (a bundled kernel) has no β either: no bias point is swept
    after = resolve("after")
    assert not takes(after, "bias")
    assert {c.bias for _, c in grid(Sweep(kernels=["after"], **SMALL), [after])} == {None}


def test_a_gated_norm_with_a_bias_is_not_ambiguous() -> None:
    """(x, weight, bias, z, eps, group_size, norm_before_gate) used to "fit layer_norm and
    rms_norm_gated": a bias marks no second op where the gated norm has one."""
    spec = resolve(f"{VARIANTS}:rmsnorm_fn")
    assert spec.op == "rms_norm_gated" and spec.fixed == (("activation", "silu"),)
    assert "dbias" in checks_of(spec) and spec.mismatch == ""
    results = _run(spec, weights=["randn"], zcg=[False], group_sizes=[8, None])
    assert {r.group_size for r in results} == {8, 32} and not _failing(results)


@pytest.mark.parametrize("ref, op, binding", [
    ("tests/kernels/log_softmax.py:LogSoftmax", "log_softmax", "x←x"),
    ("tests/kernels/silu_and_mul.py:SiluAndMul", "silu_and_mul", "x←x"),
    # torch's own: its dim given -1 (no dim: dim 0 of a 3-D input), a module's in its
    # constructor
    ("torch.nn.functional:log_softmax", "log_softmax", "input←x, dim=dim"),
    ("torch.nn:LogSoftmax", "log_softmax", "constructor dim=dim; forward input←x"),
])
def test_ops_beyond_norms_are_recognised_from_their_forward(ref: str, op: str, binding: str
                                                            ) -> None:
    spec = resolve(ref)
    assert spec.op == op and spec.recognised.startswith(
        f"recognised {op} from its forward ({binding}; max relative error"), spec.recognised
    results = _run(spec)
    assert {r.check for r in results} == set(checks_of(spec)) and not _failing(results)


def test_a_function_calling_torch_log_softmax_is_recognised(tmp_path: Path) -> None:
    path = tmp_path / "k.py"
    path.write_text("import torch\n\n\ndef lsm(x):\n    return torch.log_softmax(x, -1)\n")
    spec = resolve(f"{path}:lsm")
    assert spec.op == "log_softmax" and "from its forward (x←x;" in spec.recognised
    assert not _failing(_run(spec, checks=["forward", "dx"]))
