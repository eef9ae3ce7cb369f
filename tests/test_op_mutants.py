"""The family's mutants (tests/mutants/ops/): each caught by its check, hidden at its blind
points, the correct kernel passing both; the catalogue is the files and docs/mutants.md."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "mutants" / "ops"))
import ops_catalog

STEMS = [m.stem for m in ops_catalog.MUTANTS]


def _describe(results: list) -> str:
    return "; ".join(f"{r.check} {r.dtype} γ={r.weight} β={r.bias} G={r.group_size} "
                     f"nbg={r.norm_before_gate}: {r.status} {r.max_abs_err} {r.tolerance} "
                     f"{r.message}" for r in results)


def test_catalog_is_the_files_and_the_published_table() -> None:
    files = {p.stem for p in ops_catalog.HERE.glob("[a-z][a-z][0-9][0-9]_*.py")}
    assert files == set(STEMS), files ^ set(STEMS)
    for m in ops_catalog.MUTANTS:
        marked = [line for line in m.path.read_text().splitlines()
                  if "# MUTANT" in line and not line.lstrip().startswith(("#", '"'))]
        assert marked, f"no code line marked # MUTANT in {m.stem}"
    doc = (ops_catalog.REPO / "docs" / "mutants.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| ([a-z]{2}\d\d) \| (\S+) \| (.+?) \|", doc, re.MULTILINE)
    assert rows == [(m.stem[:4], m.op, m.title) for m in ops_catalog.MUTANTS], rows
    for op in sorted({m.op for m in ops_catalog.MUTANTS}):
        mine = [m for m in ops_catalog.MUTANTS if m.op == op]
        assert len(mine) >= 3, op
        assert any(_blind_at_a_control(m) for m in mine), f"{op}: no mutant blind at a control"


def _blind_at_a_control(m: ops_catalog.OpMutant) -> bool:
    """Its own check passes at another γ control, option value or shape (ones, group_size =
    D, a single row…)."""
    f = m.fast
    return any(b.check == f.check and (b.weight, b.group_size, b.norm_before_gate, b.shape,
                                       b.cotangent)
               != (f.weight, f.group_size, f.norm_before_gate, f.shape, f.cotangent)
               for b in m.blind)


@pytest.mark.parametrize("stem", STEMS)
def test_op_mutant_caught_by_its_check(stem: str) -> None:
    m = ops_catalog.BY_STEM[stem]
    results = ops_catalog.run_points(m.ref, [m.fast], op=m.op)
    assert results and all(r.status == "fail" for r in results), _describe(results)


@pytest.mark.parametrize("stem", [m.stem for m in ops_catalog.MUTANTS if m.blind])
def test_op_mutant_hidden_at_its_blind_points(stem: str) -> None:
    m = ops_catalog.BY_STEM[stem]
    results = ops_catalog.run_points(m.ref, list(m.blind), op=m.op)
    assert results and all(r.status == "pass" for r in results), _describe(results)


@pytest.mark.parametrize("op", sorted(ops_catalog.CORRECT))
def test_correct_kernel_passes_every_catalogue_point(op: str) -> None:
    points = [p for m in ops_catalog.MUTANTS if m.op == op for p in (m.fast, *m.blind)]
    results = ops_catalog.run_points(ops_catalog.CORRECT[op], points, op=op)
    assert results and all(r.status == "pass" for r in results), _describe(results)
