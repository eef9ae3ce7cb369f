"""Baseline drift → the closing verdict line, a Markdown section, the JSON's ``"baseline"`` key."""

from __future__ import annotations

import json
from pathlib import Path

from gradcheck_bi.gate.baseline import KEY_FIELDS, Drift, drifted_results


def verdict(drifts: list[Drift], path: str | Path | None) -> str:
    if not drifts:
        return f"BASELINE: no drift from {path}"
    n = drifted_results(drifts)
    return f"BASELINE: {n} result{'s' if n != 1 else ''} drifted from {path}"


def render_markdown(drifts: list[Drift], path: str | Path | None) -> str:
    """A Markdown section listing every drift, to follow the tables."""
    lines = ["", f"**{verdict(drifts, path)}**", ""]
    lines += [f"- {d.line}" for d in drifts]
    return "\n".join(lines) + ("\n" if drifts else "")


def add_to_json(text: str, drifts: list[Drift], path: str | Path | None) -> str:
    """The contract's JSON with a ``"baseline"`` key (file, drift lines) and ``ok`` updated."""
    doc = json.loads(text)
    doc["baseline"] = {"file": str(path), "drift": [
        {"kind": d.kind, "result": dict(zip(KEY_FIELDS, d.key, strict=True)), "line": d.line}
        for d in drifts]}
    doc["ok"] = bool(doc["ok"]) and not drifts
    timing = doc.pop("timing", None)  # keep timing last, apart from the stable part
    if timing is not None:
        doc["timing"] = timing
    return json.dumps(doc, indent=2) + "\n"
