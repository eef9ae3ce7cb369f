"""The mutation suite: single-defect RMSNorms (tests/mutants/) must each be caught.

Default suite: every mutant fails at its one ``fast`` point (the check and γ control that
should see it), hides at its ``blind`` points (the controls that cannot see it), and the
correct kernels pass all those points. ``-m slow``: every mutant through the shipped sweep,
``gradcheck-bi run --case cases/ci.toml --kernel tests/mutants/X.py:Mutant`` in fp64 on CPU,
must exit 1 with its primary check among the catchers. ``tests/mutants/make_table.py``
writes the resulting table to docs/mutants.md.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "mutants"))
import catalog

from gradcheck_bi.kernels import resolve
from gradcheck_bi.kernels.bundled.rmsnorm import After

STEMS = [m.stem for m in catalog.MUTANTS]


def _describe(results: list) -> str:
    return "; ".join(
        f"{r.check} γ={r.weight} zcg={r.zero_centered_gamma} {tuple(r.shape)}: {r.status} "
        f"err {catalog.fmt(r.max_abs_err)} tol {catalog.fmt(r.tolerance)} {r.message}"
        for r in results
    )


def test_catalog_is_the_mutant_files_and_the_published_table() -> None:
    """The catalogue is the files in tests/mutants/, one entry each, each with its defect
    marked, in the order and number docs/mutants.md publishes (regenerate it with
    tests/mutants/make_table.py when a mutant is added)."""
    assert len(set(STEMS)) == len(STEMS), f"a mutant listed twice: {sorted(STEMS)}"
    files = {p.stem for p in catalog.HERE.glob("m[0-9][0-9]_*.py")}
    assert files == set(STEMS), f"catalog and tests/mutants/ differ: {files ^ set(STEMS)}"
    unmarked = [s for s in STEMS if not any(
        "# MUTANT" in line and not line.lstrip().startswith(("#", '"'))
        for line in (catalog.HERE / f"{s}.py").read_text().splitlines())]
    assert not unmarked, f"no code line marked # MUTANT in {unmarked}"
    assert [m.primary for m in catalog.MUTANTS] == [m.fast[0] for m in catalog.MUTANTS]
    doc = (catalog.REPO / "docs" / "mutants.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| (\d\d) \| (.+?) \| \d \|", doc, re.MULTILINE)
    assert rows == [(s[1:3], catalog.BY_STEM[s].title) for s in STEMS], (
        "docs/mutants.md lists other mutants than the catalogue: "
        f"{sorted(set(rows) ^ {(s[1:3], catalog.BY_STEM[s].title) for s in STEMS})}")
    assert f"_{len(STEMS)} mutants, {len(STEMS)} caught (exit 1)" in doc


@pytest.mark.parametrize("stem", STEMS)
def test_mutant_caught_by_its_check(stem: str) -> None:
    m = catalog.BY_STEM[stem]
    results = catalog.run_points(catalog.load(stem), stem, [m.fast], m.dtype,
                                 precision=m.precision)
    assert all(r.status == "fail" for r in results), (
        f"{stem} escaped its {m.primary} check: {_describe(results)}")


@pytest.mark.parametrize("stem", STEMS)
def test_mutant_is_read_as_rms_norm_by_a_run(stem: str) -> None:
    """As ``run --kernel REF`` loads it (no --op): every mutant keeps Megatron's call
    ``(x, weight, eps, zero_centered_gamma)``, so a forward defect is held to RMSNorm and
    fails its forward (exit 1) — never refused as computing no op (exit 2), which the CI
    sweep below (slow) once showed for m08 and m19."""
    spec = resolve(str(catalog.REPO / catalog.BY_STEM[stem].ref))
    assert spec.op == "rms_norm", (stem, spec.op, spec.recognised)


@pytest.mark.parametrize("stem", [m.stem for m in catalog.MUTANTS if m.blind])
def test_mutant_hidden_at_its_blind_controls(stem: str) -> None:
    """A blind control passes a mutant whose defect vanishes there: the discriminator."""
    m = catalog.BY_STEM[stem]
    results = catalog.run_points(catalog.load(stem), stem, list(m.blind), m.dtype,
                                 precision=m.precision)
    assert all(r.status == "pass" for r in results), (
        f"{stem} was flagged where its defect cannot show: {_describe(results)}")


@pytest.mark.parametrize("stem", [m.stem for m in catalog.MUTANTS if m.dtype != "fp64"])
def test_low_precision_mutant_passes_every_check_in_fp64(stem: str) -> None:
    """Its casts are no-ops in fp64: an fp64 gate passes it (why the bf16 checks exist)."""
    m = catalog.BY_STEM[stem]
    _, weight, zcg, shape = m.fast
    points = [(check, weight, zcg, shape) for check in ("forward", "dx", "dw")]
    results = catalog.run_points(catalog.load(stem), stem, points, "fp64")
    assert all(r.status == "pass" for r in results), (
        f"{stem} failed in fp64, where its defect cannot show: {_describe(results)}")


@pytest.mark.parametrize("name", ["after", "independent"])
def test_correct_kernels_pass_every_mutant_point(name: str) -> None:
    fn = After if name == "after" else catalog.load("rmsnorm_ref", "IndependentRMSNorm")
    bad = []
    for dtype in sorted({m.dtype for m in catalog.MUTANTS}):
        mine = [m for m in catalog.MUTANTS if m.dtype == dtype]
        points = sorted({m.fast for m in mine} | {p for m in mine for p in m.blind})
        bad += [r for r in catalog.run_points(fn, name, points, dtype) if r.status != "pass"]
    assert not bad, f"correct kernel {name} flagged: {_describe(bad)}"


@pytest.mark.parametrize(("stem", "zcg", "verdict"), [
    ("m01_dx_double_weight", False, "fails (d/dx)"),
    ("m02_forward_ignores_zcg", False, "passes"),  # a wrong forward is not its business
    ("m14_dw_fp32_accumulation", False, "passes"),  # 1e-6 relative < its rtol 1e-3
    ("m15_eps_outside_sqrt", False, "passes"),
    ("m16_backward_recomputes_r_without_eps", False, "passes"),
    ("m17_batch_dependent_order", False, "passes"),  # never looks at batch invariance
])
def test_torch_gradcheck_verdicts_quoted_in_readme(stem: str, zcg: bool, verdict: str) -> None:
    assert catalog.torch_gradcheck(catalog.load(stem), zcg) == verdict


def _require_ci_inputs() -> None:
    """The shipped sweep and the loader the slow tests run through: missing is a failure."""
    assert catalog.CI_CASE.is_file(), f"{catalog.CI_CASE} is missing: the CI sweep needs it"
    assert importlib.util.find_spec("gradcheck_bi.kernels.adapting.loader") is not None, (
        "gradcheck_bi.kernels.adapting.loader is missing: --kernel FILE.py:ATTR needs it")


def test_ci_sweep_inputs_exist() -> None:
    _require_ci_inputs()


@pytest.mark.slow
@pytest.mark.parametrize("stem", STEMS)
def test_ci_sweep_catches_mutant(stem: str) -> None:
    _require_ci_inputs()
    m = catalog.BY_STEM[stem]
    code, doc = catalog.run_ci(m.ref, ["--precision", m.precision], dtype=m.dtype)
    assert code == 1, f"{stem}: gradcheck-bi exited {code}, expected 1 (defect found)"
    caught = catalog.caught_by(doc["results"])
    assert m.primary in caught, f"{stem}: caught by {sorted(caught)}, not by {m.primary}"
    errors = [r for r in doc["results"] if r["status"] == "error"]
    assert not errors, f"{stem}: the tool errored instead of measuring: {errors[0]['message']}"


@pytest.mark.slow
@pytest.mark.parametrize("name", ["after", "independent"])
def test_ci_sweep_passes_correct_kernels(name: str) -> None:
    _require_ci_inputs()
    ref = "after" if name == "after" else "tests/independent/rmsnorm_ref.py:IndependentRMSNorm"
    code, doc = catalog.run_ci(ref)
    bad = [r for r in doc["results"] if not r["as_expected"]]
    assert code == 0 and not bad, f"{name}: exit {code}; {bad[:3]}"
