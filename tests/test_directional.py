"""``--mode directional`` on every op whose input moves its whole row (the norm family's
engine, and the ops of any shape's for log_softmax):
the correct kernels pass, the input-gradient mutants are caught, and an input that moves
part of a row is ``unsupported`` with the full mode named, never a silent full check."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "mutants" / "ops"))
import ops_catalog

from gradcheck_bi.kernels import resolve
from gradcheck_bi.ops import SHAPED
from gradcheck_bi.runner import run
from gradcheck_bi.sweep import sweep_of

WHOLE_ROW = [m for m in ops_catalog.MUTANTS
             if m.op in ("layer_norm", "log_softmax") and m.fast.check == "dx"]


def _directional(ref: str, op: str | None, point: ops_catalog.Point) -> list:
    spec = resolve(ref, {"op": op} if op else None)
    sweep = sweep_of(kernels=[], targets=[("cpu", point.dtype)], shapes=[point.shape],
                  checks=[point.check], weights=[point.weight], zcg=[False],
                  biases=[point.bias or "randn"], layouts=["contiguous"], mode="directional")
    return [r for r in run(sweep, [spec]) if point.cotangent is None
            or (r.variant or {}).get("cotangent") == point.cotangent]


def test_the_whole_row_mutants_are_in_the_catalogue() -> None:
    assert {m.stem[:4] for m in WHOLE_ROW} >= {"ln01", "ln03", "ls01", "ls02", "ls03"}


@pytest.mark.parametrize("stem", [m.stem for m in WHOLE_ROW])
def test_an_input_gradient_mutant_is_caught_in_directional_mode(stem: str) -> None:
    m = ops_catalog.BY_STEM[stem]
    [r] = _directional(m.ref, m.op, m.fast)
    assert r.status == "fail", (r.status, r.message, r.details)
    assert r.details["mode"] == "directional" and "not checked" in r.details["coverage"]
    [ok] = _directional(ops_catalog.CORRECT[m.op], m.op, m.fast)
    assert ok.status == "pass", (ok.message, ok.details)
    # the norm family's: 8 directions × 2·3 rows; an op of any shape's (log_softmax): 8
    # directions over the whole tensor
    per = 1 if m.op in SHAPED else 2 * 3
    assert ok.details["projections_checked"] == 8 * per, ok.details


@pytest.mark.parametrize("kernel, status", [("after", "pass"), ("before", "fail")])
def test_rms_norm_keeps_its_directional_mode(kernel: str, status: str) -> None:
    [r] = _directional(kernel, None, ops_catalog.Point("dx"))
    assert r.status == status and r.details["mode"] == "directional", (r.message, r.details)


def test_an_input_that_moves_part_of_a_row_is_not_checked_directionally() -> None:
    point = replace(ops_catalog.Point("dresidual"))
    [r] = _directional(ops_catalog.CORRECT["fused_add_rms_norm"], "fused_add_rms_norm", point)
    assert r.status == "unsupported", (r.status, r.message)
    assert "--mode full" in r.message and "dresidual" in r.message, r.message
