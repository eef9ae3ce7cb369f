"""Loading a user's kernel by path or module: unsupported, error and exit 2 where each belongs."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from gradcheck_bi import cli
from gradcheck_bi.kernels.adapting.loader import complete_ref, load, normal_ref
from gradcheck_bi.kernels.registry import resolve
from gradcheck_bi.vocab import KernelLoadError

ROOT = Path(__file__).resolve().parents[1]
KERNELS = ROOT / "tests" / "kernels"
SMALL = ["--shape", "2,3,16", "--format", "json", "--no-progress", "--layout", "contiguous"]


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, list[dict], str]:
    code = cli.main(list(args))
    out, err = capsys.readouterr()
    return code, (json.loads(out)["results"] if out.strip() else []), err


def test_megatron_shaped_file_loads_by_path_and_is_unsupported_on_cpu(
        capsys: pytest.CaptureFixture[str]) -> None:
    """Module-level `import triton` + @triton.jit at import, RuntimeError for CPU tensors."""
    ref = f"{KERNELS}/megatron_like.py:BatchInvariantRMSNormFn"
    code, results, err = run(capsys, "run", "--kernel", ref, "--device", "cpu",
                             "--dtype", "fp32", *SMALL)
    assert code == 3, err
    assert len(results) == 24 and {r["status"] for r in results} == {"unsupported"}
    assert all("requires CUDA tensors" in r["message"] for r in results), results[0]
    assert all(r["kernel"] == normal_ref(ref) for r in results)  # as typed, normalised


def test_kernel_that_refuses_fp64_is_unsupported_with_its_message(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    (tmp_path / "fp32_only.py").write_text(
        "from gradcheck_bi.kernels.bundled.rmsnorm import After\n"
        "class Fn(After):\n"
        "    @staticmethod\n"
        "    def forward(ctx, x, w, eps, zcg):\n"
        "        if x.dtype == __import__('torch').float64:\n"
        "            raise RuntimeError(f'Unsupported dtype for BI RMSNorm: {x.dtype}')\n"
        "        return After.forward(ctx, x, w, eps, zcg)\n")
    code, results, _ = run(capsys, "run", "--kernel", f"{tmp_path}/fp32_only.py:Fn",
                           "--device", "cpu", "--dtype", "fp64", *SMALL)
    assert code == 3
    assert all("Unsupported dtype" in r["message"] and "torch.float64" in r["message"]
               for r in results)
    code, results, _ = run(capsys, "run", "--kernel", f"{tmp_path}/fp32_only.py:Fn",
                           "--device", "cpu", "--dtype", "fp32", "--check", "forward", *SMALL)
    assert code == 0 and {r["status"] for r in results} == {"pass"}


def test_missing_dependency_is_unsupported_per_result(capsys: pytest.CaptureFixture[str]) -> None:
    code, results, _ = run(capsys, "run", "--kernel", f"{KERNELS}/needs_missing_module.py:Fn",
                           "--check", "forward", *SMALL)
    assert code == 3 and results
    for r in results:
        assert r["status"] == "unsupported"
        assert "No module named 'gradcheck_bi_no_such_dependency'" in r["message"]


def test_exception_at_import_is_exit_2_with_the_kernels_message(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, results, err = run(capsys, "run", "--kernel", f"{KERNELS}/broken_at_import.py:Fn",
                             *SMALL)
    assert code == 2 and results == []
    lines = err.strip().splitlines()
    assert len(lines) == 1
    assert "failed to import" in lines[0] and "BLOCK must divide 1024" in lines[0]
    assert "line 4" in lines[0]


def test_backward_that_raises_is_an_error_result(capsys: pytest.CaptureFixture[str]) -> None:
    code, results, _ = run(capsys, "run", "--kernel", f"{KERNELS}/user_rmsnorm.py:RaisesInBackward",
                           "--check", "forward", "--check", "dx", *SMALL)
    assert code == 1
    by_check = {r["check"]: r for r in results}
    assert by_check["forward"]["status"] == "pass"
    dx = [r for r in results if r["check"] == "dx"]
    assert dx and all(r["status"] == "error" for r in dx)
    assert "ValueError: user kernel: backward not implemented" in dx[0]["message"]


def test_module_ref_loads_and_declares_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    """A module ref to the buggy kernel is 'someone else's' kernel: expected to pass, so the
    double-weight defect is an unexpected failure at γ=randn and nowhere else."""
    code, results, _ = run(capsys, "run", "--kernel",
                           "gradcheck_bi.kernels.bundled.rmsnorm:FixedForward", "--check", "dx",
                           "--zcg", "off", *SMALL)
    assert code == 1
    assert {r["weight"]: r["status"] for r in results} == {
        "randn": "fail", "ones": "pass", "zeros": "pass"}


@pytest.mark.parametrize(("ref", "needle"), [
    ("gradcheck_bi.no_such_module:Fn", "kernel module gradcheck_bi.no_such_module not found"),
    (f"{KERNELS}/user_rmsnorm.py:Corect", "no attribute 'Corect'"),
    (f"{KERNELS}/user_rmsnorm.py:NOT_A_FUNCTION", "is an int, not a kernel: expected an "
     "autograd Function, a function or an nn.Module class (`gradcheck-bi kernels` shows each)"),
    (f"{KERNELS}/nope.py:Fn", "not found"),
    ("user_rmsnorm.py:", "expected PATH.py:ATTR"),
])
def test_unloadable_refs(ref: str, needle: str) -> None:
    with pytest.raises(KernelLoadError, match=re.escape(needle)):
        load(ref)


def test_attributes_of_one_file_share_one_module() -> None:
    a = load(f"{KERNELS}/user_rmsnorm.py:Correct").fn
    b = load(f"{KERNELS}/user_rmsnorm.py:DxDoubleWeight").fn
    assert a.__module__ == b.__module__ and a is not b
    assert load(f"{KERNELS}/user_rmsnorm.py:Correct").fn is a


def test_syntax_error_names_its_line_once(tmp_path: Path) -> None:
    (tmp_path / "broken.py").write_text("import torch\n\nclass Broken(:\n")
    with pytest.raises(KernelLoadError) as info:
        load(f"{tmp_path}/broken.py:Broken")
    message = str(info.value)
    assert message.count("line 3") == 1 and "SyntaxError" in message, message


def test_a_file_with_one_function_needs_no_attr(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "mynorm.py").write_text(
        "from torch.autograd import Function\n"
        "from gradcheck_bi.kernels.bundled.rmsnorm import After\n\n\n"
        "class MyNorm(After):\n    pass\n")
    assert complete_ref(f"{tmp_path}/mynorm.py") == f"{tmp_path}/mynorm.py:MyNorm"
    assert resolve(f"{tmp_path}/mynorm.py").fn.__name__ == "MyNorm"
    code, results, err = run(capsys, "run", "--kernel", f"{tmp_path}/mynorm.py",
                             "--check", "forward", "--zcg", "off", "--weight", "randn", *SMALL)
    assert code == 0, err
    assert [r["kernel"] for r in results] == [f"{tmp_path}/mynorm.py:MyNorm"]


def test_a_module_class_beside_the_function_is_not_counted(tmp_path: Path) -> None:
    # nn.Module has an apply(fn) method of its own: it is not a second Function.
    (tmp_path / "withmodule.py").write_text(
        "import torch\n"
        "from gradcheck_bi.kernels.bundled.rmsnorm import After\n\n\n"
        "class MyNorm(After):\n    pass\n\n\n"
        "class Wrapper(torch.nn.Module):\n    pass\n")
    assert complete_ref(f"{tmp_path}/withmodule.py") == f"{tmp_path}/withmodule.py:MyNorm"


def test_a_file_with_several_functions_lists_them() -> None:
    with pytest.raises(KernelLoadError) as info:
        complete_ref(f"{KERNELS}/user_rmsnorm.py")
    message = str(info.value)
    assert "Correct" in message and "DxDoubleWeight" in message and ":NAME" in message, message


def test_refs_are_normalised_relative_to_the_working_directory(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "k.py").write_text("from gradcheck_bi.kernels.bundled.rmsnorm import After as F\n")
    monkeypatch.chdir(tmp_path / "sub")
    for ref in ("../k.py:F", f"{tmp_path}/sub/../k.py:F", "./../k.py:F"):
        assert normal_ref(ref) == f"{tmp_path.resolve()}/k.py:F", ref  # outside: absolute
        assert load(ref).name == load(ref).source == f"{tmp_path.resolve()}/k.py:F"
    monkeypatch.chdir(tmp_path)
    assert {normal_ref(r) for r in ("k.py:F", "./k.py:F", f"{tmp_path}/k.py:F")} == {"k.py:F"}
    assert normal_ref("k.py:Outer.F") == "k.py:Outer.F"
    assert normal_ref("after") == "after" and normal_ref("pkg.mod:F") == "pkg.mod:F"
