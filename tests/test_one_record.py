"""One record for every op: each module's ``OP`` is a ShapedOp; a norm's carries its row plan,
and without it the shaped engine checks the norm from the record alone — the fused add and
the gated norm here (RMSNorm and LayerNorm: tests/test_norms_any_shape.py)."""

from __future__ import annotations

import importlib
import pkgutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import gradcheck_bi.ops as ops_pkg
from gradcheck_bi.kernels import resolve
from gradcheck_bi.measure import run_point
from gradcheck_bi.ops import OPS, ROWS, SHAPED, ShapedOp
from gradcheck_bi.sweep import Sweep
from gradcheck_bi.vocab import Config

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "kernels"))
import norms_any_shape as nas  # noqa: E402


def test_every_module_defines_one_shaped_record() -> None:
    found = {}
    for info in pkgutil.iter_modules(ops_pkg.__path__):
        op = getattr(importlib.import_module(f"gradcheck_bi.ops.{info.name}"), "OP", None)
        if op is not None:
            assert isinstance(op, ShapedOp), info.name
            found[op.name] = op
    # SHAPED holds a generic check's op too once a run has registered one (not a module's)
    modules = {name for name, op in SHAPED.items() if op.independent}
    assert set(found) == set(OPS) and set(OPS) == set(ROWS) | modules
    assert not set(ROWS) & set(SHAPED)
    assert set(ROWS) == {"rms_norm", "fused_add_rms_norm", "layer_norm", "rms_norm_gated"}
    for name, plan in ROWS.items():  # the record and its plan name the same checks
        assert OPS[name].rows is plan and OPS[name].checks == plan.checks, name


@pytest.mark.parametrize("name", sorted(ROWS))
def test_a_norm_record_references_the_effective_weight(name: str) -> None:
    """Under zero_centered_gamma the record's reference takes the stored γ − 1 and adds the
    1 back; it agrees with the plan's reference at γ itself."""
    record, plan = OPS[name], ROWS[name]
    gen = torch.Generator().manual_seed(3)
    x = {i: torch.randn(3, 8, generator=gen, dtype=torch.float64) for i in plan.inputs}
    gamma = torch.randn(8, generator=gen, dtype=torch.float64)
    params = {p.name: torch.randn(8, generator=gen, dtype=torch.float64)
              for p in plan.params if not p.offset}
    options = {"eps": 1e-6, "zero_centered_gamma": True, "group_size": None,
               "norm_before_gate": True, **plan.defaults()}
    ours = record.reference({**x, **params, "weight": gamma - 1}, options)
    theirs = plan.reference(x, {**params, "weight": gamma}, options)
    for out in plan.outputs:
        torch.testing.assert_close(ours[out], theirs[out], rtol=1e-15, atol=1e-15)


@pytest.fixture(scope="module")
def _registered() -> Iterator[None]:
    with nas.registered():
        yield


def _status(op: str, ref: str, check: str, **axes: object) -> tuple[str, str]:
    spec = resolve(str(ROOT / ref), {"op": op})
    record = nas.ANY[op]
    values = {**dict(record.variants({k: [v] for k, v in spec.fixed})[0].values), **axes}
    cfg = Config(check=check, dtype="fp64", shape=(2, 3, 32), op=op,
                 variant=tuple((a.name, values[a.name]) for a in record.axes))
    r = run_point(spec, cfg, Sweep(kernels=[spec.ref]), None)
    return r.status, r.message


FUSED, GATED = "fused_add_rms_norm_any", "rms_norm_gated_any"
CORRECT = {FUSED: "tests/kernels/fused_add_rms_norm.py:FusedAddRMSNorm",
           GATED: "tests/kernels/rms_norm_gated.py:RMSNormGated"}


@pytest.mark.usefixtures("_registered")
@pytest.mark.parametrize("op,check,axes", [
    (FUSED, c, a) for c in ("forward", "dx", "dresidual", "dw", "batch_invariance")
    for a in ({}, {"zero_centered_gamma": True})
] + [(GATED, c, a) for c in ("forward", "dx", "dz", "dw", "batch_invariance")
     for a in ({}, {"norm_before_gate": False}, {"group_size": "D/4"},
               {"gamma": "zeros"})])
def test_correct_norm_passes_from_its_record_alone(op: str, check: str,
                                                   axes: dict[str, object]) -> None:
    status, message = _status(op, CORRECT[op], check, **axes)
    assert status == "pass", (op, check, axes, message)


@pytest.mark.usefixtures("_registered")
@pytest.mark.parametrize("op,ref,check,shows,blind", [
    (FUSED, "tests/mutants/ops/fa04_dx_double_weight.py:Mutant", "dx", {}, {"gamma": "ones"}),
    (FUSED, "tests/mutants/ops/fa01_no_residual_gradient.py:Mutant", "dresidual", {}, None),
    (GATED, "tests/mutants/ops/gn01_dz_written_as_dx.py:Mutant", "dz", {}, None),
    (GATED, "tests/mutants/ops/gn03_dx_double_weight.py:Mutant", "dx", {}, {"gamma": "ones"}),
])
def test_norm_mutant_caught_from_its_record_alone(op: str, ref: str, check: str,
                                                  shows: dict[str, object],
                                                  blind: dict[str, object] | None) -> None:
    status, message = _status(op, ref, check, **shows)
    assert status == "fail", (ref, check, status, message)
    if blind is not None:
        status, message = _status(op, ref, check, **blind)
        assert status == "pass", (ref, check, blind, status, message)
