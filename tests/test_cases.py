"""Case files: the shipped cases parse and cover what they promise; bad ones are exit 2;
`--case cases/ci.toml --kernel FILE:ATTR` gates a user's kernel end to end."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from gradcheck_bi import cli
from gradcheck_bi.cases import CaseError, load_case, parse_case
from gradcheck_bi.runner import run_sweeps
from gradcheck_bi.vocab import CHECKS, CONTROLS

ROOT = Path(__file__).resolve().parents[1]
CI = ROOT / "cases" / "ci.toml"
PR = ROOT / "cases" / "pr-tables.toml"
USER = ROOT / "tests" / "kernels" / "user_rmsnorm.py"
BLOCK = 1024  # Megatron's mean_dim BLOCK_SIZE


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = cli.main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_ci_case_covers_every_regime_it_promises() -> None:
    case = load_case(CI)
    cols = {s[-1] for sw in case.sweeps for s in sw.shapes}
    ranks = {len(s) for sw in case.sweeps for s in sw.shapes}
    rows = {math.prod(s[:-1]) for sw in case.sweeps for s in sw.shapes}
    assert 1 in cols, "D=1"
    assert any(d > BLOCK and d % BLOCK for d in cols), f"D above the block, ragged: {cols}"
    assert any((d % 2 and d > 1) or (d & (d - 1)) for d in cols), f"non-power-of-two D: {cols}"
    assert {2, 3, 4} <= ranks and 1 in rows
    eps_min = min(e for sw in case.sweeps for e in sw.eps)
    assert any(s * s < eps_min for sw in case.sweeps for s in sw.input_scales), \
        "no input scale puts the mean square below eps"
    # randn γ × scale reaches |γ| ≈ 300 over a few hundred columns (3σ).
    assert any(3 * w >= 300 for sw in case.sweeps for w in sw.weight_scales)
    for sw in case.sweeps:
        assert set(sw.checks or []) == set(CHECKS)
        assert set(sw.weights) == set(CONTROLS) and set(sw.zcg) == {False, True}
        # fp64 on CPU, and one bf16 block (CUDA too when a GPU is present).
        assert sw.targets in ([("cpu", "fp64")], [("cpu", "bf16")],
                              [("cpu", "bf16"), ("cuda", "bf16")]), sw.targets
        assert sw.kernels == ["after"]
    assert sum(sw.targets[0] == ("cpu", "bf16") for sw in case.sweeps) == 1, "one bf16 block"


def test_pr_tables_case_has_both_tables() -> None:
    case = load_case(PR)
    by_name = dict(zip(case.names, case.sweeps, strict=True))
    fwd, dx = by_name["forward with zcg"], by_name["input gradient with the γ controls"]
    assert fwd.checks == ["forward"] and fwd.zcg == [True]
    assert dx.checks == ["dx"] and set(dx.weights) == set(CONTROLS)
    assert all(sw.kernels == ["before", "after"] for sw in case.sweeps)
    assert ("cpu", "fp64") in dx.targets


@pytest.mark.parametrize(("text", "needles"), [
    ("kernels = ['after']\n[[sweep]]\nshape = [[2, 8]]\n",
     ("demo.toml", "'shape'", "[[sweep]] #1", "did you mean 'shapes'")),
    ("[[sweep]]\nname = 'fast'\n[[sweep]]\nname = 'slow'\nseeds = [1.5]\n",
     ("demo.toml", "'seeds'", "[[sweep]] #2 (slow)", "integers >= 0", "1.5")),
    ("targets = ['gpu/fp64']\n", ("'targets'", "device/dtype")),
    ("checks = ['dx', 'hessian']\n", ("'checks'", "batch_invariance", "'hessian'")),
    ("zcg = true\n", ("'zcg'", "list of booleans")),
    ("max_memory = '2 lots'\n", ("'max_memory'",)),
    ("[[expectation]]\ncheck = 'dx'\n", ("[[expectation]] #1", "missing key 'status'")),
    ("[[expectation]]\nstatus = 'pass'\nweigth = 'ones'\n", ("'weigth'", "did you mean 'weight'")),
    ("sweep = 3\n", ("[[sweep]] blocks",)),
    ("description = 'x'\nexpect = 'maybe'\n", ("'expect'", "'pass', 'fail'")),
    ("kernel_args = 'gemma'\n", ("'kernel_args'", "a table of name = value")),
    ("[[sweep]]\nkernel_args = {casting_mode = 'gemma'}\n",
     ("unknown key 'kernel_args' in [[sweep]] #1",)),
])
def test_bad_case_names_file_and_key(text: str, needles: tuple[str, ...]) -> None:
    with pytest.raises(CaseError) as info:
        parse_case(text, "demo.toml")
    msg = str(info.value)
    assert "\n" not in msg
    for n in needles:
        assert n in msg, f"{n!r} not in {msg!r}"


def test_kernel_args_reach_every_block() -> None:
    case = parse_case("kernel_args = {casting_mode = 'gemma', row_mode = true}\n"
                      "[[sweep]]\n[[sweep]]\nseeds = [4]\n", "demo.toml")
    assert [s.kernel_args for s in case.sweeps] == [
        {"casting_mode": "gemma", "row_mode": True}] * 2


def test_blocks_inherit_and_override_top_level() -> None:
    case = parse_case("seeds = [3]\nshapes = [[2, 5]]\nmax_memory = '2M'\n"
                      "[[sweep]]\n[[sweep]]\nseeds = [4, 5]\n", "demo.toml")
    assert [s.seeds for s in case.sweeps] == [[3], [4, 5]]
    assert all(s.shapes == [(2, 5)] and s.max_memory == 2 << 20 for s in case.sweeps)


def test_shared_points_run_once_and_rules_decide_expectations() -> None:
    case = parse_case(
        "kernels = ['before']\ntargets = ['cpu/fp64']\nchecks = ['dx']\nzcg = [false]\n"
        "shapes = [[3, 12]]\nlayouts = ['contiguous']\n[[sweep]]\n[[sweep]]\n"
        "weights = ['randn', 'ones']\n"
        "[[expectation]]\nkernel = 'before'\nweight = 'randn'\nstatus = 'pass'\n"
        "reason = 'pretend the defect was fixed'\n", "demo.toml")
    results = run_sweeps(case.sweeps)
    assert [r.weight for r in results] == ["randn", "ones", "zeros"], "randn/ones ran twice"
    randn = results[0]
    # before's declared defect shows at γ=randn; the case's rule says pass, so it is flagged.
    assert randn.status == "fail" and randn.expected == "pass" and not randn.as_expected
    assert all(r.as_expected for r in results[1:])


def test_a_rule_names_a_kernel_file_however_it_is_spelled(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The rule says ``./tests/…``, the sweep ``tests/…``: one kernel, and the rule decides."""
    monkeypatch.chdir(ROOT)
    case = parse_case(
        "kernels = ['tests/kernels/user_rmsnorm.py:DxDoubleWeight']\ntargets = ['cpu/fp64']\n"
        "checks = ['dx']\nzcg = [false]\nweights = ['randn']\nshapes = [[3, 12]]\n"
        "layouts = ['contiguous']\n"
        "[[expectation]]\nkernel = './tests/kernels/user_rmsnorm.py:DxDoubleWeight'\n"
        "status = 'fail'\n", "demo.toml")
    [result] = run_sweeps(case.sweeps)
    assert result.kernel == "tests/kernels/user_rmsnorm.py:DxDoubleWeight"
    assert (result.status, result.expected, result.as_expected) == ("fail", "fail", True)


def test_cli_options_override_the_case(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "run", "--case", str(CI), "--kernel",
                         "gradcheck_bi.kernels.bundled.rmsnorm:After", "--check", "forward",
                         "--shape", "3,17", "--weight", "ones", "--format", "json")
    assert code == 0, err
    results = json.loads(out)["results"]
    assert {r["check"] for r in results} == {"forward"}
    assert {tuple(r["shape"]) for r in results} == {(3, 17)}
    assert {r["kernel"] for r in results} == {"gradcheck_bi.kernels.bundled.rmsnorm:After"}
    # every block still contributes its own other axes (scales, weight scales, seeds)
    assert {r["input_scale"] for r in results} >= {1e-4, 1.0, 1e3}
    assert {r["weight_scale"] for r in results} >= {100.0}


def _ci(capsys: pytest.CaptureFixture[str], attr: str, *extra: str) -> tuple[int, str, str]:
    exact = ("--precision", "exact") if attr in EXACT else ()
    return run(capsys, "run", "--case", str(CI), "--kernel", f"{USER}:{attr}", *exact, *extra)


def test_ci_gate_passes_a_correct_user_kernel(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _ci(capsys, "Correct", "--format", "json")
    doc = json.loads(out)
    bad = [r for r in doc["results"] if not r["as_expected"]]
    assert code == 0, f"{len(bad)} results not as expected, e.g. {bad[:2]}; {err}"
    assert len(doc["results"]) > 250 and doc["ok"] is True
    assert {r["check"] for r in doc["results"]} == set(CHECKS)


# Computing in fp32 inside an fp64 call is a defect only under --precision exact (by
# default the kernel's measured working precision judges it: tests/test_precision.py).
EXACT = {"Fp32Compute"}
SINGLE_DEFECTS = {
    # attr → (check, γ control) that must fail, and a (check, γ) that must still pass
    "DxDoubleWeight": (("dx", "randn"), ("dx", "ones")),
    "ForwardIgnoresZcg": (("forward", "ones"), ("dw", "randn")),
    "DwTimesGamma": (("dw", "randn"), ("dw", "ones")),
    "Fp32Compute": (("forward", "randn"), ("batch_invariance", "randn")),
    "NoEpsInBackward": (("dx", "randn"), ("forward", "randn")),
    "NotBatchInvariant": (("batch_invariance", "randn"), ("dx", "randn")),
}


def _assert_defect_found(capsys: pytest.CaptureFixture[str], attr: str) -> None:
    # --verbose: every result not as expected, not only the worst per kernel and check (a
    # defect that also shows at another γ may have its worst there: γ = zeros at D = 1)
    code, out, err = _ci(capsys, attr, "--no-progress", "--verbose")
    (bad_check, bad_w), (good_check, good_w) = SINGLE_DEFECTS[attr]
    assert code == 1, f"{attr}: exit {code}, expected 1\n{out[-2000:]}{err}"
    text = " ".join(out.split())  # undo the terminal's line wrapping
    assert "VERDICT: NOT AS EXPECTED" in text
    failures = [chunk.split(" ✗")[0] for chunk in text.split("✗ ")[1:]]
    assert any(f"{attr} {bad_check} cpu/fp64" in f and f"γ={bad_w} " in f
               and "fail (expected pass)" in f for f in failures), \
        f"{attr}: no failure line for {bad_check} γ={bad_w}: {failures[:3]}"
    assert not any(f"{attr} {good_check} cpu/fp64" in f and f"γ={good_w} " in f
                   for f in failures), f"{attr}: {good_check} γ={good_w} should pass"
    # the table cell shows it too: a failing cell next to the kernel's row
    assert "fail" in out.split("VERDICT")[0]


def test_ci_gate_fails_dx_double_weight(capsys: pytest.CaptureFixture[str]) -> None:
    _assert_defect_found(capsys, "DxDoubleWeight")


@pytest.mark.slow
@pytest.mark.parametrize("attr", sorted(set(SINGLE_DEFECTS) - {"DxDoubleWeight"}))
def test_ci_gate_fails_every_single_defect(capsys: pytest.CaptureFixture[str],
                                           attr: str) -> None:
    _assert_defect_found(capsys, attr)


def test_single_defects_fail_only_where_they_show() -> None:
    """Each defect fails at its sensitive point and passes its blind one (small sweep)."""
    from gradcheck_bi.kernels.adapting.loader import load
    from gradcheck_bi.runner import run as run_sweep
    from gradcheck_bi.sweep import Sweep

    for attr, ((bad_check, bad_w), (good_check, good_w)) in SINGLE_DEFECTS.items():
        spec = load(f"{USER}:{attr}")
        sweep = Sweep(kernels=[spec.name], targets=[("cpu", "fp64")], shapes=[(3, 2, 40)],
                      checks=[bad_check, good_check], weights=[bad_w, good_w], zcg=[True],
                      precision="exact" if attr in EXACT else "measured")
        got = {(r.check, r.weight): r.status for r in run_sweep(sweep, [spec])}
        assert got[(bad_check, bad_w)] == "fail", f"{attr}: {got}"
        assert got[(good_check, good_w)] == "pass", f"{attr}: {got}"


DROPPING = """
skip_missing_devices = true
kernels = ["after"]
shapes = [[2, 16]]
checks = ["forward"]
weights = ["randn"]
zcg = [false]
[[sweep]]
name = "both"
targets = ["cpu/fp64", "cuda/fp32", "cuda/bf16"]
[[sweep]]
name = "cpu only"
targets = ["cpu/fp32"]
"""


def test_dropped_targets_are_reported(capsys: pytest.CaptureFixture[str],
                                      monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """skip_missing_devices drops targets with a line each on stderr and a JSON entry each,
    the same from run to run; targets the command line replaces are not reported."""
    import gradcheck_bi.cases as cases

    monkeypatch.setattr(cases, "_missing_devices", lambda: {"cuda"})  # as on a CPU machine
    path = tmp_path / "drop.toml"
    path.write_text(DROPPING)
    want = [{"target": "cuda/fp32", "reason": "no CUDA GPU is visible here", "sweep": "both"},
            {"target": "cuda/bf16", "reason": "no CUDA GPU is visible here", "sweep": "both"}]
    assert load_case(path).dropped == want
    docs = []
    for _ in range(2):
        code, out, err = run(capsys, "run", "--case", str(path), "--format", "json",
                             "--no-progress")
        assert code == 0, err
        doc = json.loads(out)
        assert doc["dropped"] == want
        assert {(r["device"], r["dtype"]) for r in doc["results"]} == {("cpu", "fp64"),
                                                                       ("cpu", "fp32")}
        notes = [ln for ln in err.splitlines() if "dropped" in ln]
        assert notes == [
            "gradcheck-bi: note: cuda/fp32 dropped from sweep 'both' (skip_missing_devices): "
            "no CUDA GPU is visible here",
            "gradcheck-bi: note: cuda/bf16 dropped from sweep 'both' (skip_missing_devices): "
            "no CUDA GPU is visible here"], err
        doc.pop("timing")
        docs.append(doc)
    assert docs[0] == docs[1]
    code, out, err = run(capsys, "run", "--case", str(path), "--device", "cpu", "--format",
                         "json", "--no-progress")
    assert code == 0 and "dropped" not in json.loads(out) and "dropped" not in err
