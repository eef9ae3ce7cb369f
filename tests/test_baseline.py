"""Baselines: record, rerun → 0; perturb one recorded number → 1 with a line naming it."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from gradcheck_bi import cli
from gradcheck_bi.gate import baseline as bl

ROOT = Path(__file__).resolve().parents[1]
CI = ROOT / "cases" / "ci.toml"
SHIPPED = ROOT / "cases" / "baselines" / "ci-after-cpu-fp64.json"
RUN = ["run", "--kernel", "after", "--shape", "2,3,24", "--layout", "contiguous",
       "--check", "forward", "--check", "dx",
       "--no-progress", "--format", "json"]


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = cli.main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def _record(capsys: pytest.CaptureFixture[str], path: Path) -> None:
    code, _, err = run(capsys, *RUN, "--baseline", str(path), "--update-baseline")
    assert code == 0 and "recorded baseline" in err
    assert not list(path.parent.glob(".*.tmp")), "temporary file left behind"


def _edit(path: Path, pick: str, field: str, value: object) -> dict:
    doc = json.loads(path.read_text())
    candidates = [r for r in doc["results"] if r["check"] == pick and r["max_abs_err"]]
    # Any of them, as long as it sits above the floor (1e-6 × tolerance) by 1000×.
    candidates = [r for r in candidates if r["max_abs_err"] > 1e-3 * r["tolerance"]]
    row = random.choice(candidates)
    row[field] = value(row[field]) if callable(value) else value
    path.write_text(json.dumps(doc))
    return row


def test_round_trip_then_perturbed_error_then_status(capsys: pytest.CaptureFixture[str],
                                                     tmp_path: Path) -> None:
    path = tmp_path / "base.json"
    _record(capsys, path)
    code, out, err = run(capsys, *RUN, "--baseline", str(path))
    assert code == 0, err
    assert json.loads(out)["baseline"]["drift"] == []

    row = _edit(path, "dx", "max_abs_err", lambda e: e / 1000)
    code, out, err = run(capsys, *RUN, "--baseline", str(path))
    assert code == 1
    drift_lines = [ln for ln in err.splitlines() if "drift:" in ln]
    assert len(drift_lines) == 1, err
    line = drift_lines[0]
    assert f"after dx cpu/fp64 shape (2, 3, 24) γ={row['weight']}" in line
    assert "grew 1e+03×" in line and "10×" in line
    assert json.loads(out)["ok"] is False

    _record(capsys, path)
    row = _edit(path, "forward", "status", "fail")
    code, _, err = run(capsys, *RUN, "--baseline", str(path))
    assert code == 1 and "status fail → pass" in err and f"γ={row['weight']}" in err


def test_new_and_missing_results_are_drift(capsys: pytest.CaptureFixture[str],
                                           tmp_path: Path) -> None:
    path = tmp_path / "base.json"
    _record(capsys, path)
    code, _, err = run(capsys, *RUN, "--check", "dw", "--baseline", str(path))
    assert code == 1 and err.count("not in the baseline") == 6
    narrowed = ["run", "--kernel", "after", "--shape", "2,3,24", "--check", "forward",
                "--no-progress", "--format", "json", "--baseline", str(path)]
    code, _, err = run(capsys, *narrowed)
    assert code == 1 and err.count("recorded in the baseline but not run") == 6


def test_growth_within_the_factor_and_shrinking_errors_are_not_drift() -> None:
    from gradcheck_bi.vocab import Result

    def res(err: float, status: str = "pass") -> Result:
        return Result("k", "dx", "cpu", "fp64", [2, 4], 1e-6, 0, "randn", False, err, 1e-10,
                      status, "pass", status == "pass")

    base = bl.Baseline.from_results([res(1e-13)])
    assert bl.compare([res(9e-13)], base) == []
    assert bl.compare([res(1e-16)], base) == []
    assert [d.kind for d in bl.compare([res(2e-12)], base)] == ["error grew"]
    zero = bl.Baseline.from_results([res(0.0)])
    assert bl.compare([res(5e-16)], zero) == []  # under 10 × 1e-6 × tolerance
    assert [d.kind for d in bl.compare([res(2e-15)], zero)] == ["error grew"]


def test_a_looser_tolerance_is_drift_a_tighter_one_is_not() -> None:
    from gradcheck_bi.vocab import Result

    def res(tol: float) -> Result:
        return Result("k", "dx", "cpu", "fp64", [2, 4], 1e-6, 0, "randn", False, 1e-13, tol,
                      "pass", "pass", True)

    base = bl.Baseline.from_results([res(1e-10)])
    drifts = bl.compare([res(2e-10)], base)
    assert [d.kind for d in drifts] == ["tolerance loosened"]
    assert "tolerance loosened 2×, 1.000e-10 → 2.000e-10" in drifts[0].line
    assert bl.compare([res(1e-10 * (1 + bl.TOLERANCE_SLACK / 2))], base) == []
    assert bl.compare([res(1e-10 * (1 + 2 * bl.TOLERANCE_SLACK))], base) != []
    assert bl.compare([res(1e-12)], base) == []  # tighter: not drift
    bitwise = bl.Baseline.from_results([res(0.0)])
    assert bl.compare([res(0.0)], bitwise) == []
    assert "loosened ∞" in bl.compare([res(1e-30)], bitwise)[0].line


def test_recorded_tolerance_is_compared_end_to_end(capsys: pytest.CaptureFixture[str],
                                                   tmp_path: Path) -> None:
    """A recorded tolerance tighter than today's (what a run shows after a formula or default
    was loosened) drifts; a recorded one looser than today's (today tightened) does not."""
    path = tmp_path / "base.json"
    _record(capsys, path)
    row = _edit(path, "dx", "tolerance_max", lambda t: t / 3)
    code, out, err = run(capsys, *RUN, "--baseline", str(path))
    assert code == 1
    drifts = json.loads(out)["baseline"]["drift"]
    assert [d["kind"] for d in drifts] == ["tolerance loosened"]
    assert f"γ={row['weight']}" in drifts[0]["line"] and "loosened 3×" in drifts[0]["line"]
    _record(capsys, path)
    _edit(path, "dx", "tolerance_max", lambda t: t * 1.5)
    code, _, err = run(capsys, *RUN, "--baseline", str(path))
    assert code == 0, err


@pytest.mark.parametrize(("extra", "drifting"), [
    (["--atol", "1"], {"forward", "dx"}),
    (["--rtol", "1e-3"], {"forward", "dx"}),
    (["--mode", "directional"], {"dx"}),
])
def test_settings_that_set_a_tolerance_are_part_of_the_key(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, extra: list[str],
        drifting: set[str]) -> None:
    """A run with --atol 1 or --mode directional is not the recorded full-mode run: each
    result it touches drifts once, as a change of its tolerance settings (never as a new
    result plus a missing one). batch_invariance (bitwise) and checks a setting does not act
    on keep their keys."""
    path = tmp_path / "base.json"
    code, _, _ = run(capsys, *RUN, "--check", "batch_invariance", "--baseline", str(path),
                     "--update-baseline")
    assert code == 0
    code, out, _ = run(capsys, *RUN, "--check", "batch_invariance", *extra,
                       "--baseline", str(path))
    assert code == 1
    drifts = json.loads(out)["baseline"]["drift"]
    assert {d["result"]["check"] for d in drifts} == drifting
    assert {d["kind"] for d in drifts} <= {"tolerance loosened", "settings changed"}
    assert len(drifts) == 6 * len(drifting)  # 3 γ × 2 zcg, one drift each
    if "--mode" not in extra:  # an absolute 1 or 1e-3 × |reference| passes far more
        assert "tolerance loosened" in {d["kind"] for d in drifts}
    assert all(f"{extra[0][2:]} " in d["line"] for d in drifts)


def test_kernel_refs_are_normalised(capsys: pytest.CaptureFixture[str],
                                    monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(ROOT)
    path = tmp_path / "base.json"
    small = ["run", "--shape", "2,24", "--layout", "contiguous", "--check", "forward",
             "--no-progress", "--format", "json", "--baseline", str(path)]
    code, _, _ = run(capsys, *small, "--kernel", "./tests/kernels/user_rmsnorm.py:Correct",
                     "--update-baseline")
    assert code == 0
    kernels = {r["kernel"] for r in json.loads(path.read_text())["results"]}
    assert kernels == {"tests/kernels/user_rmsnorm.py:Correct"}
    for ref in ("tests/kernels/user_rmsnorm.py:Correct",
                f"{ROOT}/tests/kernels/../kernels/user_rmsnorm.py:Correct"):
        code, out, err = run(capsys, *small, "--kernel", ref)
        assert code == 0, err
        assert {r["kernel"] for r in json.loads(out)["results"]} == kernels
    # Two spellings of one kernel in one run: one kernel, checked once.
    code, out, _ = run(capsys, "run", "--shape", "2,24", "--layout", "contiguous",
                       "--check", "forward", "--no-progress",
                       "--format", "json", "--kernel", "./tests/kernels/user_rmsnorm.py:Correct",
                       "--kernel", "tests/kernels/user_rmsnorm.py:Correct")
    assert code == 0 and len(json.loads(out)["results"]) == 6


@pytest.mark.parametrize(("text", "needle"), [
    ("{not json", "cannot read"),
    ('{"format": "something else"}', "not a gradcheck-bi baseline"),
    ('{"format": "gradcheck-bi baseline", "schema": 2, "results": [{"kernel": "x"}]}',
     "result #1"),
    ('{"format": "gradcheck-bi baseline", "schema": 1, "results": []}',
     "re-record it with --update-baseline"),
    ('{"format": "gradcheck-bi baseline", "schema": 99, "results": []}', "schema 2"),
])
def test_bad_baseline_is_exit_2_and_writes_nothing(capsys: pytest.CaptureFixture[str],
                                                   tmp_path: Path, text: str,
                                                   needle: str) -> None:
    path = tmp_path / "base.json"
    path.write_text(text)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    code, out, err = run(capsys, *RUN, "--baseline", str(path), "--output",
                         str(out_dir / "r.json"))
    assert code == 2 and out == "" and list(out_dir.iterdir()) == []
    assert len(err.strip().splitlines()) == 1 and needle in err and "base.json" in err


def test_update_baseline_needs_a_file(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, *RUN, "--update-baseline")
    assert code == 2 and "--update-baseline needs --baseline" in err


def test_shipped_ci_baseline_matches_a_fresh_run(capsys: pytest.CaptureFixture[str]) -> None:
    """cases/baselines/ci-after-cpu-fp64.json is what cases/ci.toml gives `after` today."""
    code, out, err = run(capsys, "run", "--case", str(CI), "--baseline", str(SHIPPED),
                         "--no-progress", "--format", "json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["baseline"]["drift"] == [] and len(doc["results"]) == len(
        bl.load(SHIPPED).entries)


def test_drift_lines_end_the_text_report_on_stdout(capsys: pytest.CaptureFixture[str],
                                                   tmp_path: Path) -> None:
    # cases/README.md: in the closing block — stdout for table/text, stderr when stdout
    # carries a json/markdown/junit/github report.
    path = tmp_path / "b.json"
    assert run(capsys, *RUN, "--baseline", str(path), "--update-baseline")[0] == 0
    _edit(path, "dx", "max_abs_err", lambda e: e / 1000)
    text = [a if a != "json" else "text" for a in RUN]
    code, out, err = run(capsys, *text, "--baseline", str(path))
    assert code == 1 and "drift:" not in err
    lines = out.rstrip().splitlines()
    assert any("drift:" in ln for ln in lines[-4:]), out
    assert lines[-2].startswith("BASELINE: 1 result drifted") and lines[-1].startswith(
        "VERDICT")


def test_other_ops_results_keep_their_own_keys(capsys: pytest.CaptureFixture[str],
                                               tmp_path: Path) -> None:
    """Two results of the gated norm that differ only in group size or norm_before_gate, or
    of the layer norm only in β, are two baseline rows (they once shared a key, so one
    result's drift hid behind the other's record); a rerun is drift-free."""
    path = tmp_path / "base.json"
    args = ["run", "--kernel", "tests/kernels/rms_norm_gated.py:RMSNormGated",
            "--kernel", "tests/kernels/layer_norm.py:LayerNorm", "--shape", "3,40",
            "--check", "forward", "--no-progress", "--format", "json"]
    code, out, _ = run(capsys, *args, "--baseline", str(path), "--update-baseline")
    assert code == 0
    results = json.loads(out)["results"]
    rows = json.loads(path.read_text())["results"]
    assert len({bl.key_of(r) for r in results}) == len(results) == len(rows)
    assert {r.get("group_size") for r in rows} > {None}
    assert {r.get("norm_before_gate") for r in rows} >= {True, False}
    assert {r.get("bias") for r in rows} >= {"randn", "zeros"}
    code, out, _ = run(capsys, *args, "--baseline", str(path))
    assert code == 0 and json.loads(out)["baseline"]["drift"] == []
    gated = next(r for r in rows if r.get("norm_before_gate") is False)
    assert "norm_before_gate False" in bl.describe_key(bl.key_of(gated))


def test_an_op_of_any_shape_keys_each_variant(capsys: pytest.CaptureFixture[str],
                                              tmp_path: Path) -> None:
    """Results of an op of any shape differ by their options alone (reduction, cotangent…):
    each is its own entry, written with its variant, read back to the same key; a loosened
    tolerance at one variant names that variant."""
    path = tmp_path / "ce.json"
    args = ["run", "--kernel", "tests/kernels/cross_entropy.py:CrossEntropy", "--shape", "4,64",
            "--check", "forward", "--no-progress", "--format", "json",
            "--baseline", str(path)]
    code, out, _ = run(capsys, *args, "--update-baseline")
    assert code == 0
    results = json.loads(out)["results"]
    doc = json.loads(path.read_text())
    assert len(doc["results"]) == len(results) > 1
    assert len({bl.key_of(r) for r in results}) == len(results)
    assert {bl.key_of(r) for r in results} == set(bl.load(path).entries)
    row = next(r for r in doc["results"] if r["variant"]["reduction"] == "sum")
    row["tolerance_max"] = row["tolerance"] * 0.5
    path.write_text(json.dumps(doc))
    code, _, err = run(capsys, *args)
    assert code == 1 and "reduction=sum" in err
