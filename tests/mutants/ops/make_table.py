"""Run every family mutant through ``cases/family.toml`` and write the family section of
docs/mutants.md (between its ``ops-mutants`` markers).

    PYTHONPATH=. python tests/mutants/ops/make_table.py        # ~1 minute per mutant
    PYTHONPATH=. python tests/mutants/ops/make_table.py ls01 sw02   # those rows only

Each mutant is run as a user would: ``gradcheck-bi run --case cases/family.toml --kernel
tests/mutants/ops/X.py:Mutant`` (no --op: recognised from its parameters and output; ``--op``
for the ops beyond norms, whose mutants' names say nothing), and must exit 1.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ops_catalog as catalog

DOC = catalog.REPO / "docs" / "mutants.md"
BEGIN, END = "<!-- ops-mutants:begin -->", "<!-- ops-mutants:end -->"


def run_case(ref: str, op: str | None = None) -> tuple[int, list[dict]]:
    from gradcheck_bi.cli import main

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "r.json"
        code = main(["run", "--case", str(catalog.REPO / "cases" / "family.toml"),
                     "--kernel", ref, "--format", "json", "--output", str(out),
                     "--no-progress", *(["--op", op] if op else [])])
        doc = json.loads(out.read_text()) if out.exists() else {}
    return code, doc.get("results", [])


def _where(r: dict) -> str:
    parts = [r["dtype"]] if r["dtype"] != "fp64" else []
    if r.get("weight") is not None:  # an op with γ (an op of any shape says its variant)
        parts.append(f"γ={r['weight']}")
    variant = r.get("variant")
    if isinstance(variant, dict):
        parts.extend(f"{k}={v}" for k, v in variant.items())
    if r.get("bias"):
        parts.append(f"β={r['bias']}")
    if r.get("norm_before_gate") is not None:
        parts.append(f"G={'D' if r['group_size'] == r['shape'][-1] else 'D/4'}")
        parts.append("before" if r["norm_before_gate"] else "after")
    return " ".join(parts)


def row(m: catalog.OpMutant) -> tuple[str, bool]:
    code, results = run_case(m.ref, None if m.by_name else m.op)
    bad = [r for r in results if not r["as_expected"]]
    checks = sorted({r["check"] for r in bad}, key=lambda c: [r["check"] for r in results]
                    .index(c))
    where = sorted({_where(r) for r in bad})
    passed = sorted({_where(r) for r in results if r["check"] == m.primary
                     and r["as_expected"]})
    blind = ", ".join(passed) if passed else "—"
    caught = code == 1 and m.primary in checks
    cells = [m.stem[:4], m.op, m.title, ", ".join(checks) or "—",
             f"{len(bad)} of {len(results)}", ", ".join(where) or "—", blind]
    return "| " + " | ".join(cells) + " |", caught


def main(only: list[str]) -> int:
    """Every row, or only the mutants whose ids are in ``only`` (the other rows kept as the
    doc has them, caught)."""
    doc = DOC.read_text(encoding="utf-8")
    kept = {line.split(" | ")[0][2:]: line for line in doc.splitlines()
            if line.startswith("| ") and line[2:6] in BY_ID}
    lines = ["| id | op | defect | caught by | results failed | where | its check "
             "passes at |", "| --- | --- | --- | --- | ---: | --- | --- |"]
    caught = 0
    for m in catalog.MUTANTS:
        if only and m.stem[:4] not in only and m.stem[:4] in kept:
            text, ok = kept[m.stem[:4]], True
        else:
            text, ok = row(m)
            print(text, flush=True)
        lines.append(text)
        caught += ok
    n = len(catalog.MUTANTS)
    lines += ["", f"_{n} family mutants, {caught} caught (exit 1, their own check among the "
              "catchers) by `cases/family.toml` on CPU (fp64, fp32 and bf16 blocks)._"]
    head, _, rest = doc.partition(BEGIN)
    _, _, tail = rest.partition(END)
    DOC.write_text(head + BEGIN + "\n" + "\n".join(lines) + "\n" + END + tail,
                   encoding="utf-8")
    return 0 if caught == n else 1


BY_ID = {m.stem[:4] for m in catalog.MUTANTS}

if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
