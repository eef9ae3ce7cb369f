"""Adapters: each shape of kernel, each zero_centered_gamma mapping, each refusal message."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from gradcheck_bi import check, cli
from gradcheck_bi.kernels import adapt, resolve
from gradcheck_bi.kernels.adapting.adapters import Adapted, gamma_at_zero
from gradcheck_bi.kernels.adapting.loader import normal_ref
from gradcheck_bi.sweep import DEFAULT_SHAPE
from gradcheck_bi.vocab import KernelLoadError, Unsupported

ROOT = Path(__file__).resolve().parents[1]
HF = f"{ROOT}/tests/kernels/hf_style.py"
HF_NAME = normal_ref(f"{HF}:F")[:-2]  # how results and messages name the file
FP32 = ["--device", "cpu", "--dtype", "fp32", "--shape", "2,3,16", "--layout", "contiguous",
        "--format", "json",
        "--no-progress"]


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any], str]:
    code = cli.main(list(args))
    out, err = capsys.readouterr()
    return code, (json.loads(out) if out.strip() else {}), err


def statuses(doc: dict[str, Any]) -> dict[tuple[str, bool], set[str]]:
    by: dict[tuple[str, bool], set[str]] = {}
    for r in doc["results"]:
        by.setdefault((r["check"], r["zero_centered_gamma"]), set()).add(r["status"])
    return by


@pytest.mark.parametrize("ref, zcg", [
    ("torch.nn:RMSNorm", False),                       # nn.Module class, torch's own
    ("torch.nn.functional:rms_norm", False),           # rms_norm(input, normalized_shape, ...)
    (f"{HF}:LlamaRMSNorm", False),                     # HF-style (hidden_size, eps) module
    (f"{HF}:GemmaRMSNorm", True),                      # (1 + w) built in
    (f"{HF}:make_llama", False),                       # a factory
    (f"{HF}:ScaleNorm", False),                        # weight named scale, size named dim
    (f"{HF}:plain_rms_norm", False),                   # f(x, weight, eps)
    (f"{HF}:SetupContextFn", None),                    # Function without ctx in forward
    (f"{HF}:plain_rms_norm_zcg", None),                # f(x, weight, eps, zero_centered_gamma)
    (f"{HF}:offset_rms_norm", None),                   # zcg as offset
    (f"{HF}:LigerShapedFn", None),                     # Liger's parameter names
])
def test_each_shape_of_kernel_passes_in_fp32_with_no_adapter_file(
        capsys: pytest.CaptureFixture[str], ref: str, zcg: bool | None) -> None:
    code, doc, err = run(capsys, "run", "--kernel", ref, *FP32)
    assert code == 0, (ref, err, [r for r in doc.get("results", []) if r["status"] != "pass"])
    by = statuses(doc)
    checks = {"forward", "dx", "dw", "batch_invariance"}
    settings = {False, True} if zcg is None else {zcg}
    assert set(by) == {(c, z) for c in checks for z in settings}, (ref, sorted(by))
    assert all(s == {"pass"} for s in by.values()), (ref, by)
    if zcg is None:
        assert "not_run" not in doc, doc.get("not_run")
    else:
        assert doc["not_run"] == [resolve(ref).not_run(not zcg)], doc["not_run"]


def test_module_around_double_weight_function_fails_dx_at_randn_only(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, doc, _ = run(capsys, "run", "--kernel", f"{HF}:DoubleWeightNorm", *FP32)
    assert code == 1
    failed = {(r["check"], r["weight"]) for r in doc["results"] if r["status"] != "pass"}
    assert failed == {("dx", "randn")}, failed


def test_an_nn_module_is_never_taken_for_an_autograd_function() -> None:
    # nn.Module has an apply(fn) of its own: the adapter must build the module instead.
    spec = resolve("torch.nn:RMSNorm")
    assert isinstance(spec.fn, Adapted), type(spec.fn)
    x, w = torch.randn(3, 16), torch.randn(16)
    y = spec.fn.apply(x, w, 1e-6, False)
    ref = torch.nn.functional.rms_norm(x, (16,), w, 1e-6)
    assert torch.equal(y, ref), (y - ref).abs().max()


def test_module_weight_is_bound_per_call_and_dw_is_its_gradient() -> None:
    spec = adapt(torch.nn.RMSNorm, "rms", "api")
    x = torch.randn(4, 8, dtype=torch.float64)
    w = torch.randn(8, dtype=torch.float64, requires_grad=True)
    g = torch.randn(4, 8, dtype=torch.float64)
    (spec.fn.apply(x, w, 1e-6, False) * g).sum().backward()
    r = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
    assert w.grad is not None
    torch.testing.assert_close(w.grad, (g * x * r).sum(0), msg="dw is not ∂/∂w of the module")


@pytest.mark.parametrize("obj, settings, how", [
    ("plain_rms_norm_zcg", {False, True}, "a keyword (zero_centered_gamma)"),
    ("offset_rms_norm", {False, True}, "an offset (offset=1.0 under zcg, 0.0 without)"),
    ("GemmaRMSNorm", {True}, "built in (γ = 1 + w; the stored weight is γ − 1)"),
    ("LlamaRMSNorm", {False}, "absent (γ = w)"),
])
def test_each_zcg_mapping_is_read_and_said(obj: str, settings: set[bool], how: str) -> None:
    spec = resolve(f"{HF}:{obj}")
    assert (set(spec.zcg), spec.zcg_how) == (settings, how)


def test_zcg_override_is_taken_and_a_wrong_one_fails_rather_than_hides(
        capsys: pytest.CaptureFixture[str]) -> None:
    # GemmaRMSNorm computes with 1 + w; told it has no zcg, its forward must fail.
    code, doc, _ = run(capsys, "run", "--kernel", f"{HF}:GemmaRMSNorm", "--kernel-arg",
                       "zcg=absent", "--check", "forward", *FP32)
    assert code == 1 and doc["not_run"] == [
        f"{HF_NAME}:GemmaRMSNorm: zcg=on results not run — zero_centered_gamma is absent "
        "(γ = w; --kernel-arg zcg=absent)"]
    assert {r["weight"]: r["status"] for r in doc["results"]} == {
        "randn": "fail", "ones": "fail", "zeros": "fail"}


def test_not_run_is_one_line_in_the_table_and_the_exit_stays_0(tmp_path: Path) -> None:
    report = tmp_path / "report.txt"
    code = cli.main(["run", "--kernel", "torch.nn:RMSNorm", "--device", "cpu", "--dtype",
                     "fp32", "--shape", "2,16", "--check", "forward", "--format", "table",
                     "--output", str(report), "--no-progress"])
    out = report.read_text()
    assert code == 0
    lines = [ln for ln in out.splitlines() if "not run" in ln]
    assert lines == ["note: torch.nn:RMSNorm: zcg=on results not run — zero_centered_gamma "
                     "is absent (γ = w)"], lines
    assert "unsupported" not in out


def test_adapted_kernel_refuses_a_zcg_setting_it_lacks() -> None:
    spec = resolve("torch")
    with pytest.raises(Unsupported, match="zero_centered_gamma is absent"):
        spec.fn.apply(torch.randn(2, 8), torch.randn(8), 1e-6, True)


def test_gamma_at_zero_tells_w_from_one_plus_w_and_says_when_it_cannot() -> None:
    def raises(*_: Any) -> Any:
        raise RuntimeError("requires CUDA tensors")

    assert gamma_at_zero(lambda x, w, eps, z: x * w)[0] == "w"
    assert gamma_at_zero(lambda x, w, eps, z: x * torch.rsqrt(
        x.pow(2).mean(-1, keepdim=True) + eps) * (1 + w))[0] == "1+w"
    assert gamma_at_zero(lambda x, w, eps, z: x + 1) == (
        None, "at w = 0 it returned neither 0 nor x·r")
    if not torch.cuda.is_available():
        assert gamma_at_zero(raises) == (
            None, "it did not run here to tell (RuntimeError: requires CUDA tensors)")
    # At the default run's shape: the probe feeds the kernel no shape of its own.
    seen: list[tuple[int, ...]] = []
    gamma_at_zero(lambda x, w, eps, z: seen.append(tuple(x.shape)) or x * w)
    assert seen == [DEFAULT_SHAPE]


def test_module_constructor_args_from_the_command_line_and_the_case_file(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = run(capsys, "run", "--kernel", f"{HF}:ConfigNorm", *FP32)
    assert code == 2
    assert err.strip() == (f"gradcheck-bi: error: kernel {HF_NAME}:ConfigNorm takes a config "
                           "object (config) and its config class cannot be told (no annotation, "
                           "no one *Config class in its module): give --kernel-arg "
                           "config=VALUE")
    code, doc, err = run(capsys, "run", "--kernel", f"{HF}:ConfigNorm", "--kernel-arg",
                         "config=llama", *FP32)
    assert code == 0 and doc["results"], err
    case = tmp_path / "c.toml"
    case.write_text(f'kernels = ["{HF}:ConfigNorm"]\nkernel_args = {{config = "llama"}}\n'
                    'targets = ["cpu/fp32"]\nshapes = [[2, 16]]\nchecks = ["dx"]\n')
    code, doc, err = run(capsys, "run", "--case", str(case), "--format", "json",
                         "--no-progress")
    assert code == 0 and len(doc["results"]) == 5, err  # 3 γ + 2 default layouts (randn)


@pytest.mark.parametrize("args, message", [
    ([f"{HF}:LlamaRMSNorm", "--kernel-arg", "casting_mode=gemma"],
     "kernel {HF}:LlamaRMSNorm takes no parameter 'casting_mode' (its parameters: "
     "hidden_size, eps)"),
    ([f"{HF}:LlamaRMSNorm", "--kernel-arg", "zcg=maybe"],
     "--kernel-arg zcg=maybe: expected one of builtin, absent"),
    ([f"{HF}:LlamaRMSNorm", "--kernel-arg", "casting_mode"],
     "--kernel-arg 'casting_mode': expected name=value, e.g. casting_mode=gemma"),
    ([f"{HF}:torch"], "kernel {HF}:torch is a module, not a kernel: expected an autograd "
     "Function, a function or an nn.Module class (`gradcheck-bi kernels` shows each)"),
    (["torch.nn:Bilinear"], "kernel Bilinear(in1_features, in2_features, out_features, "
     "bias, device, dtype) needs 'in2_features', 'out_features': give --kernel-arg "
     "in2_features=VALUE --kernel-arg out_features=VALUE (or kernel_args in the case file)"),
    ([f"{HF}:GemmaRMSNorm", "--kernel-arg", "eps_typo=1"],
     "kernel {HF}:GemmaRMSNorm takes no parameter 'eps_typo' (its parameters: dim, eps)"),
    (["tests/kernels/entry_points.py:GeluAndMul", "--kernel-arg", "approximate=tanh"],
     "kernel tests/kernels/entry_points.py:GeluAndMul(x): --kernel-arg approximate not used: "
     "it is read as gelu_and_mul_halves, an op whose parameters are bound from its forward "
     "and whose options are swept (`gradcheck-bi ops`); wrap the kernel to fix a value"),
    (["torch:batch_norm"], "kernel batch_norm: its signature cannot be read (a compiled builtin?); "
     "wrap it in a Python function that names its parameters (f(x, weight, eps), f(a, b), "
     "f(logits, target), …)"),
])
def test_refusals_are_one_line_and_exit_2(capsys: pytest.CaptureFixture[str],
                                          args: list[str], message: str) -> None:
    code, _, err = run(capsys, "run", "--kernel", *args, *FP32)
    assert code == 2
    assert err.strip() == "gradcheck-bi: error: " + message.replace("{HF}", HF_NAME), err


def test_a_module_instance_is_refused_with_what_to_give_instead() -> None:
    with pytest.raises(KernelLoadError, match="is a RMSNorm instance: give its class"):
        adapt(torch.nn.RMSNorm(8), "inst", "api")


def test_a_call_whose_parameters_say_nothing_is_refused_naming_them() -> None:
    """No op is the default: parameters that fill no role of any op are no norm's to ask
    for, and the line says what to do instead ('b' is a bias's name)."""
    def norm(a: Any, b: Any, c: Any, d: Any, e: Any) -> Any:
        return a

    with pytest.raises(KernelLoadError) as info:
        adapt(norm, "norm", "api")
    line = str(info.value)
    assert line.startswith(
        "kernel norm(a, b, c, d, e): no op here takes this signature (no role of a norm fills "
        "'c', 'd', 'e', and it is read as no other op here); if it is one of the tool's ops "
        "(rms_norm, "), line
    assert "\n" not in line and "x, weight, eps" not in line
    assert "`gradcheck-bi ops`), say which with --op NAME, else check it with --generic" in line


def test_three_or_four_unnamed_parameters_are_read_in_megatron_order() -> None:
    def norm(a: Any, b: Any, c: Any) -> Any:
        return a * torch.rsqrt(a.pow(2).mean(-1, keepdim=True) + c) * b

    spec = adapt(norm, "norm", "api")
    assert spec.zcg == {False} and check(spec, dtype="fp32", shapes=[(2, 16)]).ok


def test_api_takes_the_same_shapes_of_kernel() -> None:
    import importlib.util

    # By path, not `from tests.kernels...`: that import worked only when an earlier test had
    # left the checkout's root on sys.path.
    where = Path(__file__).parent / "kernels" / "hf_style.py"
    spec = importlib.util.spec_from_file_location("hf_style_for_api_test", where)
    assert spec is not None and spec.loader is not None
    hf_style = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hf_style)
    plain_rms_norm = hf_style.plain_rms_norm

    for kernel in (torch.nn.RMSNorm, plain_rms_norm, "torch", "torch:nn"):
        report = check(kernel, dtype="fp32", checks=["dx", "dw"], shapes=[(3, 16)],
                       layouts=["contiguous"])
        assert report.ok and len(report.results) == 6, (kernel, str(report))
        assert report.not_run and "zcg=on results not run" in report.not_run[0], report.not_run
    with pytest.raises(TypeError, match="is an int, not a kernel"):
        check(3)
