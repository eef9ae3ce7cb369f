"""Real libraries' conventions, on stand-ins of their entry points
(tests/kernels/entry_points.py): the gated norm's bias before the gate (Mamba-2, fla) and its
gate activation (silu, sigmoid); Liger's swiglu multipliers; vLLM's SiluAndMul and GeluAndMul
modules; entry points no op is assumed for — each right with no flags, or one line."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from gradcheck_bi import cli
from gradcheck_bi.kernels import resolve
from gradcheck_bi.ops import ROWS
from gradcheck_bi.runner import run
from gradcheck_bi.sweep import sweep_of
from gradcheck_bi.vocab import KernelLoadError

EP = "tests/kernels/entry_points.py"
SMALL = {"targets": [("cpu", "fp64")], "shapes": [(3, 32)], "weights": ["randn"],
         "zcg": [False], "layouts": ["contiguous"]}


def _run(spec: Any, **kw: Any) -> list[Any]:
    return run(sweep_of(kernels=[], **{**SMALL, **kw}), [spec])


def _failing(results: list[Any]) -> list[tuple[Any, ...]]:
    return [(r.check, r.variant, r.norm_before_gate, r.message) for r in results
            if r.status != "pass"]


def _mamba_reference(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, z: torch.Tensor,
                     eps: float, before: bool) -> torch.Tensor:
    """Mamba-2's rms_norm_ref, written out: ``x·silu(z)`` first unless the norm comes
    first; ``x·rstd·w + b``; then ``·silu(z)`` if the norm came first."""
    if not before:
        x = x * z * torch.sigmoid(z)
    out = x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * w + b
    return out * z * torch.sigmoid(z) if before else out


@pytest.mark.parametrize("before", [True, False])
def test_gated_reference_adds_the_bias_before_the_gate(before: bool) -> None:
    gen = torch.Generator().manual_seed(3)
    x, z = (torch.randn(4, 16, generator=gen, dtype=torch.float64) for _ in range(2))
    w, b = (torch.randn(16, generator=gen, dtype=torch.float64) for _ in range(2))
    ours = ROWS["rms_norm_gated"].reference(
        {"x": x, "z": z}, {"weight": w, "bias": b},
        {"eps": 1e-6, "group_size": None, "norm_before_gate": before})["y"]
    assert torch.allclose(ours, _mamba_reference(x, w, b, z, 1e-6, before), rtol=0,
                          atol=1e-14)
    sig = ROWS["rms_norm_gated"].reference(
        {"x": x, "z": z}, {"weight": w, "bias": b},
        {"eps": 1e-6, "group_size": None, "norm_before_gate": True,
         "activation": "sigmoid"})["y"]
    n = x / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-6)
    assert torch.allclose(sig, (n * w + b) * torch.sigmoid(z), rtol=0, atol=1e-14)


def test_mamba_rmsnorm_fn_is_checked_with_no_flags() -> None:
    """``rmsnorm_fn(x, weight, bias, z=None, eps, group_size, norm_before_gate)``: the
    gated norm, its bias checked, both gate orders, activation silu (its only one)."""
    spec = resolve(f"{EP}:rmsnorm_fn")
    assert spec.op == "rms_norm_gated" and spec.mismatch == ""
    assert dict(spec.fixed) == {"activation": "silu"}
    results = _run(spec, group_sizes=[8, None])
    assert {r.check for r in results} >= {"forward", "dx", "dz", "dw", "dbias"}
    assert {r.norm_before_gate for r in results} == {True, False}
    assert not _failing(results)


def test_bias_after_the_gate_fails_its_forward() -> None:
    """``rms(x)·w·silu(z) + b`` is no library's convention: its forward fails where the
    bias is there and the norm comes first, passes where it is after the gate anyway."""
    spec = resolve(f"{EP}:rmsnorm_fn_bias_after_gate")
    assert dict(spec.fixed) == {"activation": "silu"}  # matching none: the default
    assert "matches no value of it" in " ".join(spec.fixed_how)
    results = _run(spec, checks=["forward"], biases=["randn"])
    fails = {r.norm_before_gate for r in results if r.status == "fail"}
    assert fails == {True}, _failing(results)
    assert all(r.status == "pass" for r in results if not r.norm_before_gate)


def test_fla_gate_activation_is_swept() -> None:
    """fla's ``rms_norm_gated(x, g, weight, bias, activation='swish', …)``: ``g`` is the
    gate, ``activation`` swept at silu and sigmoid; its module fixes it when built."""
    spec = resolve(f"{EP}:rms_norm_gated")
    assert spec.op == "rms_norm_gated" and "activation" not in dict(spec.fixed)
    results = _run(spec)
    assert {(r.variant or {}).get("activation") for r in results} == {"silu", "sigmoid"}
    assert not _failing(results)
    module = resolve(f"{EP}:FusedRMSNormGated")
    assert dict(module.fixed)["activation"] == "silu"
    built = resolve(f"{EP}:FusedRMSNormGated", {"activation": "sigmoid"})
    assert dict(built.fixed)["activation"] == "sigmoid"
    assert not _failing(_run(built, checks=["forward", "dz"]))


def test_gate_activation_mutant_is_caught_at_sigmoid_only() -> None:
    spec = resolve(f"{EP}:gated_sigmoid_mutant")
    results = _run(spec, checks=["dx", "dz", "dw"])
    fails = {(r.check, r.variant["activation"]) for r in results if r.status == "fail"}
    assert fails == {("dx", "sigmoid"), ("dz", "sigmoid"), ("dw", "sigmoid")}, fails


@pytest.mark.parametrize("attr", ["TritonSiluMul", "SiLUMul", "LigerSiLUMulFunction"])
def test_swiglu_is_recognised_from_its_output(attr: str) -> None:
    spec = resolve(f"{EP}:{attr}")
    assert spec.op == "swiglu" and "from its forward" in spec.recognised
    results = _run(spec)
    assert {r.check for r in results} == {"forward", "da", "db", "batch_invariance"}
    assert not _failing(results)


def test_liger_multipliers_are_swept_beyond_their_blind_value() -> None:
    spec = resolve(f"{EP}:LigerSiLUMulFunction")
    results = _run(spec, checks=["da"])
    seen = {(r.variant["gate_multiplier"], r.variant["down_multiplier"]) for r in results}
    assert seen == {(1.0, 1.0), (0.7, 1.0), (1.0, 1.3)}
    plain = resolve(f"{EP}:SiLUMul")  # a kernel without them: 1.0 alone, its forward's
    assert dict(plain.fixed) == {"gate_multiplier": 1.0, "down_multiplier": 1.0}
    assert {r.variant["gate_multiplier"] for r in _run(plain, checks=["da"])} == {1.0}
    assert all("the kernel takes no" in how for how in plain.fixed_how)


@pytest.mark.parametrize(("attr", "shows"), [
    ("LigerSiLUMulDropsGate", {("da", 0.7, 1.0)}),
    ("LigerSiLUMulDropsDown", {("da", 1.0, 1.3), ("db", 1.0, 1.3)})])
def test_a_backward_dropping_a_multiplier_is_caught_off_its_blind_value(
        attr: str, shows: set[tuple[str, float, float]]) -> None:
    results = _run(resolve(f"{EP}:{attr}"), checks=["da", "db"])
    fails = {(r.check, r.variant["gate_multiplier"], r.variant["down_multiplier"])
             for r in results if r.status == "fail"}
    assert fails == shows
    blind = [r for r in results if r.variant["gate_multiplier"] == 1.0
             and r.variant["down_multiplier"] == 1.0]
    assert blind and all(r.status == "pass" for r in blind)


@pytest.mark.parametrize("args", [None, {"op": "silu_and_mul"}])
def test_vllm_silu_and_mul_module(args: dict[str, str] | None) -> None:
    spec = resolve(f"{EP}:SiluAndMul", args)
    assert spec.op == "silu_and_mul"
    results = _run(spec)
    assert {r.check for r in results} == {"forward", "dx", "batch_invariance"}
    assert not _failing(results)


def test_vllm_gelu_and_mul_module_binds_its_constructor() -> None:
    spec = resolve(f"{EP}:GeluAndMul")
    assert spec.op == "gelu_and_mul_halves"
    assert "constructor approximate←approximate" in spec.recognised
    results = _run(spec, shapes=[(3, 64)])
    assert {r.variant["approximate"] for r in results} == {"none", "tanh"}
    assert all(r.status == "pass" for r in results), [
        (r.check, r.variant, r.message) for r in results if r.status != "pass"]
    mutant = _run(resolve(f"{EP}:GeluAndMulErfBackward"), shapes=[(3, 64)], checks=["dx"])
    fails = {r.variant["approximate"] for r in mutant if r.status == "fail"}
    assert fails == {"tanh"}


@pytest.mark.parametrize(("attr", "words"), [
    ("l2norm", ["l2norm(x, eps, output_dtype)", "matches no op here", "--op NAME",
                "--generic"]),
    ("fused_add_layer_norm", ["fused_add_layer_norm(x, residual, weight, bias, eps)",
                              "no backward to check", "matching no op here"])])
def test_no_op_is_a_default_refusals_are_one_line(attr: str, words: list[str],
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["run", "--kernel", f"{EP}:{attr}", "--no-progress"])
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert code == 2 and not out and len(lines) == 1
    assert all(w in lines[0] for w in words), lines[0]


def test_a_fused_add_layer_norm_with_a_backward_is_refused_with_its_closest() -> None:
    """Parameters marking two ops and an output matching neither: one line, the closest."""
    def fused_add_ln(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                     bias: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
        h = x + residual
        return torch.nn.functional.layer_norm(h, (h.shape[-1],), weight, bias, eps)

    from gradcheck_bi.kernels import adapt

    with pytest.raises(KernelLoadError, match=r"output matches neither \(closest: "):
        adapt(fused_add_ln, "fused_add_ln", "api")


def test_liger_style_cross_entropy_function() -> None:
    spec = resolve(f"{EP}:LigerStyleCE")
    assert spec.op == "cross_entropy"
