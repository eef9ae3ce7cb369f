"""Building what real modules need (kernels/adapting/build.py): weightless norms, norms that fix
their eps, a required group size or a number of groups, a config object; and the one-line
refusals (channels-first, not a norm over the last axis). Each shape is tested on a module of
tests/kernels/built.py (CI) and, where transformers is installed, on the real class."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from gradcheck_bi import check, cli
from gradcheck_bi.checks.rows import run_op_check
from gradcheck_bi.kernels import resolve
from gradcheck_bi.kernels.adapting.build import Builder, own_eps
from gradcheck_bi.kernels.adapting.loader import normal_ref
from gradcheck_bi.sweep import Sweep, grid
from gradcheck_bi.vocab import KernelLoadError

ROOT = Path(__file__).resolve().parents[1]
BUILT = f"{ROOT}/tests/kernels/built.py"
NAME = normal_ref(f"{BUILT}:F")[:-2]
HF = "transformers.models.{0}.modeling_{0}:{1}"


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any], str]:
    code = cli.main(["run", *args, "--device", "cpu", "--shape", "3,16", "--layout",
                     "contiguous", "--format", "json", "--no-progress"])
    out, err = capsys.readouterr()
    return code, (json.loads(out) if out.strip() else {}), err


def weightless_results(ref: str, dtype: str) -> list[tuple[str, str, float, float]]:
    """Every point of a weightless module run by the row ops' engine (what H2's routing
    of an rms_norm without weight does): (check, status-like verdict, error, tolerance)."""
    spec = resolve(ref)
    sweep = Sweep(kernels=[ref], targets=[("cpu", dtype)], shapes=[(3, 16)],
                  layouts=["contiguous"])
    out = []
    for _, cfg in grid(sweep, [spec]):
        m = run_op_check(spec.fn, replace(cfg, op="rms_norm"))
        out.append((cfg.check, cfg.control, m.max_abs_err, m.tolerance))
    return out


@pytest.mark.parametrize("attr, eps", [("L2Norm", 1e-6), ("PlainL2Norm", 1e-5),
                                       ("BufferL2Norm", 1e-6)])
def test_a_weightless_norm_is_built_and_run_without_weight(attr: str, eps: float) -> None:
    spec = resolve(f"{BUILT}:{attr}")
    assert spec.op == "rms_norm" and dict(spec.fixed)["weight"] is None
    assert spec.zcg == {False}
    assert any("weight absent" in how for how in spec.fixed_how), spec.fixed_how
    x = torch.randn(3, 16, dtype=torch.float64)
    y = spec.fn.call({"x": x}, {}, {"eps": 1e-6}, False)
    want = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    assert torch.allclose(y, want, rtol=0, atol=1e-15), (y - want).abs().max()
    results = weightless_results(f"{BUILT}:{attr}", "fp64")
    assert {c for c, *_ in results} == {"forward", "dx", "batch_invariance"}
    assert {w for _, w, *_ in results} == {"ones"}  # no γ to sweep
    bad = [r for r in results if not r[2] <= r[3]]
    assert not bad, bad


def test_a_weightless_norm_with_a_wrong_backward_fails() -> None:
    """The same path catches a defect: a wrong dx in a weightless module fails dx."""
    spec = resolve(f"{BUILT}:L2Norm")
    module_call = spec.fn._call
    real = module_call.builder.build

    def broken(values: dict[str, Any]) -> torch.nn.Module:
        module = real(values)
        module.register_full_backward_hook(lambda m, gi, go: (gi[0] * 1.01,))
        return module

    module_call.builder.build = broken
    spec.fn._call._forward.clear()
    sweep = Sweep(targets=[("cpu", "fp64")], shapes=[(3, 16)], layouts=["contiguous"],
                  checks=["dx"])
    (_, cfg), = list(grid(sweep, [spec]))
    m = run_op_check(spec.fn, cfg)
    assert m.max_abs_err > 10 * m.tolerance, (m.max_abs_err, m.tolerance)


@pytest.mark.parametrize("attr, how", [
    ("FixedEpsRMSNorm", "its attribute variance_epsilon"),
])
def test_a_norm_that_fixes_its_eps_is_checked_at_it(attr: str, how: str) -> None:
    spec = resolve(f"{BUILT}:{attr}")
    assert dict(spec.fixed)["eps"] == 1e-5
    assert spec.fixed_how == (f"eps not swept — {attr} takes no eps: checked at its own "
                              f"eps=1e-05 (read from {how})",)
    report = check(spec, shapes=[(3, 16)], eps=[1e-6, 1e-3], layouts=["contiguous"],
                   zcg="off")
    assert {r.eps for r in report.results} == {1e-5}  # once, at its own eps
    assert report.ok


def test_a_fixed_eps_is_read_from_the_forward_and_said_in_one_note(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, doc, err = run(capsys, "--kernel", f"{BUILT}:FixedEpsLayerNorm", "--op",
                         "layer_norm", "--dtype", "fp64")
    assert code == 0, err
    assert {r["eps"] for r in doc["results"]} == {1e-5}
    notes = [line for line in err.splitlines() if "eps not swept" in line]
    assert notes == [f"note: {NAME}:FixedEpsLayerNorm: eps not swept — FixedEpsLayerNorm "
                     "takes no eps: checked at its own eps=1e-05 (read from its forward's "
                     "constant)"], err


@pytest.mark.parametrize("attr", ["GroupGated", "CountGated"])
def test_a_gated_norm_is_built_at_each_swept_group(capsys: pytest.CaptureFixture[str],
                                                   attr: str) -> None:
    code, doc, err = run(capsys, "--kernel", f"{BUILT}:{attr}", "--dtype", "fp64")
    assert code == 0, err
    assert {r["group_size"] for r in doc["results"] if r["check"] == "dx"} == {4, 16}


def test_a_count_gated_norm_built_at_one_group_fails_at_group_four() -> None:
    """n_groups really follows the swept group: held at 1, the group-4 points fail."""
    spec = resolve(f"{BUILT}:CountGated")
    spec.fn._call.builder.slots = [s if s.name != "n_groups" else replace(s, role="default")
                                   for s in spec.fn._call.builder.slots]
    report = check(spec, shapes=[(3, 16)], group_sizes=[4], checks=["forward"],
                   layouts=["contiguous"], zcg="off", raise_on_failure=False)
    moved = [r.status for r in report.results if r.weight != "zeros"]  # γ = 0: y ≡ 0
    assert moved and set(moved) == {"fail"}, moved


def test_a_config_object_is_written_from_the_config_class() -> None:
    spec = resolve(f"{BUILT}:ConfigRMSNorm")
    report = check(spec, shapes=[(3, 16)], eps=[1e-3], layouts=["contiguous"], zcg="off")
    assert report.ok and {r.eps for r in report.results} == {1e-3}


def test_a_config_that_carries_eps_lets_a_layer_norm_be_read_as_one() -> None:
    spec = resolve(f"{BUILT}:ConfigLayerNorm")
    assert spec.op == "layer_norm", spec.recognised
    report = check(spec, shapes=[(3, 16)], eps=[1e-3], layouts=["contiguous"], zcg="off")
    assert report.ok and {r.eps for r in report.results} == {1e-3}


# What the refusal of a channels-first norm says, true of each kind (BatchNorm: statistics over N
# and the positions; GroupNorm: over a group of channels and the positions).
CHANNELS_FIRST = ("axis 1 of (N, C, ...) holds its channels and its statistics do not run "
                  "over the last axis alone; gradcheck-bi checks norms over the last axis")


@pytest.mark.parametrize("ref, message", [
    (f"{BUILT}:MyBatchNorm2d", "kernel {B}:MyBatchNorm2d is a channels-first norm (named "
     f"'BatchNorm'): {CHANNELS_FIRST}"),
    ("torch.nn:BatchNorm2d", "kernel torch.nn:BatchNorm2d is a channels-first norm (a torch "
     f"BatchNorm2d): {CHANNELS_FIRST}"),
    ("torch.nn:GroupNorm", "kernel torch.nn:GroupNorm is a channels-first norm (a torch "
     f"GroupNorm): {CHANNELS_FIRST}"),
    (f"{BUILT}:ChannelGroups", "kernel {B}:ChannelGroups is a channels-first norm (a torch "
     f"GroupNorm): {CHANNELS_FIRST}"),
    (f"{BUILT}:AdaNorm", "kernel {B}:AdaNorm is not a norm over the last axis: built at D = "
     "8, it has parameters that are no (D,) weight or bias (shift.weight (8, 8))"),
    (f"{BUILT}:RsqrtOnly", "kernel {B}:RsqrtOnly is not a norm over the last axis: for x of "
     "(2, 8) its forward returns (2, 1)"),
    (f"{BUILT}:CondRMSNorm", "kernel {B}:CondRMSNorm: its forward needs 'cond' besides the "
     "input, which no norm here takes (--op NAME if it is one of `gradcheck-bi ops`)"),
    (f"{BUILT}:HeadsNorm", "kernel {B}:HeadsNorm could not be built from the HeadsConfig "
     "written here (hidden size 8, the class's other defaults): ValueError: hidden_size must "
     "be divisible by num_heads"),
])
def test_what_cannot_be_built_is_refused_in_one_line_exit_2(
        capsys: pytest.CaptureFixture[str], ref: str, message: str) -> None:
    code, doc, err = run(capsys, "--kernel", ref, "--dtype", "fp64")
    assert (code, doc) == (2, {})
    assert err.strip() == "gradcheck-bi: error: " + message.replace("{B}", NAME), err


def test_a_module_computing_no_op_is_refused_as_that_not_for_its_eps(
        capsys: pytest.CaptureFixture[str]) -> None:
    """torch.nn.GELU builds, and takes no eps: what it lacks is being an op, not a norm's
    eps. Its output says so first."""
    code, doc, err = run(capsys, "--kernel", "torch.nn:GELU", "--dtype", "fp64")
    assert (code, doc) == (2, {})
    line = err.strip()
    assert "\n" not in line and line.startswith(
        "gradcheck-bi: error: kernel torch.nn:GELU(input): its output at a small random point "
        "matches no op here (nearest: "), line
    assert "say which with --op NAME, else check it with --generic" in line, line


def test_own_eps_reads_attribute_forward_and_parts() -> None:
    assert own_eps(torch.nn.RMSNorm(4, eps=1e-3)) == (1e-3, "its attribute eps")
    wrapped = torch.nn.Sequential(torch.nn.LayerNorm(4, eps=1e-4))
    assert own_eps(wrapped) == (1e-4, "its 0.eps")
    assert own_eps(torch.nn.GELU()) is None
    with pytest.raises(KernelLoadError, match="takes a config object"):
        Builder(lambda config: torch.nn.Identity(), "f", {})


# The real classes, where transformers is installed (not in CI).
@pytest.mark.parametrize("module, cls", [
    ("llama4", "Llama4TextL2Norm"), ("deepseek_v4", "DeepseekV4UnweightedRMSNorm"),
    ("falcon_mamba", "FalconMambaWeightlessRMSNorm"),
])
def test_real_weightless_norms_build_and_pass_at_fp32(module: str, cls: str) -> None:
    pytest.importorskip("transformers")
    results = weightless_results(HF.format(module, cls), "fp32")
    assert {c for c, *_ in results} == {"forward", "dx", "batch_invariance"}
    assert not [r for r in results if not r[2] <= r[3]], results


@pytest.mark.parametrize("module, cls, extra, groups", [
    ("bamba", "BambaRMSNormGated", (), {4, 16}),
    ("mamba2", "MambaRMSNormGated", (), {4, 16}),
    ("falcon_h1", "FalconH1RMSNormGated", (), {4, 16}),
    # Named a LayerNorm, computes an RMS norm: read by its name it fails, its message naming
    # rms_norm (tests/test_recognise.py); built from its config and checked as rms_norm here.
    ("cpmant", "CpmAntLayerNorm", ("--op", "rms_norm"), {None}),
    ("olmo", "OlmoLayerNorm", ("--op", "layer_norm"), {None}),
])
def test_real_modules_the_tool_builds_pass(capsys: pytest.CaptureFixture[str], module: str,
                                           cls: str, extra: tuple[str, ...],
                                           groups: set[int | None]) -> None:
    pytest.importorskip("transformers")
    code, doc, err = run(capsys, "--kernel", HF.format(module, cls), *extra, "--dtype", "fp32")
    assert code == 0, err
    assert {r.get("group_size") for r in doc["results"] if r["check"] == "forward"} == groups


@pytest.mark.parametrize("module, cls, words", [
    ("esmfold2", "EsmFold2AdaptiveLayerNorm", "is not a norm over the last axis"),
    ("qwen2_5_omni", "Qwen2_5_OmniAdaLayerNormZero", "is not a norm over the last axis"),
    ("detr", "DetrFrozenBatchNorm2d", "is a channels-first norm"),
    ("poolformer", "PoolFormerGroupNorm", "is a channels-first norm"),
    ("hy_v4", "HYV4UnweightedRMSNorm", "is not a norm over the last axis"),
    ("axk2", "AXK2GatedRMSNorm", "is not a norm over the last axis"),
])
def test_real_modules_that_are_no_norm_over_the_last_axis_exit_2(
        capsys: pytest.CaptureFixture[str], module: str, cls: str, words: str) -> None:
    pytest.importorskip("transformers")
    code, _, err = run(capsys, "--kernel", HF.format(module, cls), "--dtype", "fp32")
    assert code == 2 and words in err and len(err.strip().splitlines()) == 1, err
