"""The family's mutant catalogue: single-defect kernels of fused add + RMSNorm, LayerNorm,
gated RMSNorm and the ops beyond norms (tests/mutants/ops/), each a copy of the correct kernel
in tests/kernels/ with one defect marked ``# MUTANT``; shared by tests/test_op_mutants.py and
make_table.py (which writes the family section of docs/mutants.md).

``fast`` is one point where the ``primary`` check must fail; ``blind`` lists points where
the defect is invisible by construction — a γ control (γ = ones hides a defect multiplied
by γ − 1), an option (group_size = D hides a backward that ignores the groups;
norm_before_gate = True one that ignores the mode), a shape (a single row hides a backward
that mixes rows up), a cotangent (all ones: every row's alike hides a backward that reads
another row's) or a check the defect does not touch.
"""

from __future__ import annotations

import ast
import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
SHAPE = (2, 3, 32)  # 3-D; D = 32 gives group sizes 8 (= D/4) and 32 (= D)


@dataclass(frozen=True)
class Point:
    check: str
    weight: str = "randn"
    bias: str | None = None
    group_size: int | None = None
    norm_before_gate: bool | None = None
    dtype: str = "fp64"
    shape: tuple[int, ...] = SHAPE
    # An op of any shape with a cotangent axis (log_softmax, silu_and_mul): the results at
    # this value alone (None: every variant its sweep runs).
    cotangent: str | None = None

    def label(self) -> str:
        extra = [self.dtype if self.dtype != "fp64" else "",
                 "×".join(map(str, self.shape)) if self.shape != SHAPE else "",
                 f"β={self.bias}" if self.bias else "",
                 f"group_size={self.group_size}" if self.group_size else "",
                 "" if self.norm_before_gate is None else
                 f"norm_before_gate={self.norm_before_gate}",
                 f"cotangent={self.cotangent}" if self.cotangent else ""]
        return " ".join([self.check, f"γ={self.weight}", *[e for e in extra if e]])


@dataclass(frozen=True)
class OpMutant:
    stem: str
    op: str
    fast: Point
    blind: tuple[Point, ...] = field(default=())
    # Recognised from its parameter names; else named with --op (the ops beyond norms are
    # recognised by name too).
    by_name: bool = True

    @property
    def primary(self) -> str:
        return self.fast.check

    @property
    def path(self) -> Path:
        return HERE / f"{self.stem}.py"

    @property
    def ref(self) -> str:
        return f"{self.path.relative_to(REPO)}:Mutant"

    @property
    def title(self) -> str:
        doc = ast.get_docstring(ast.parse(self.path.read_text())) or ""
        return doc.splitlines()[0].split(":", 1)[1].strip().rstrip(".")


FUSED, LAYER, GATED = "fused_add_rms_norm", "layer_norm", "rms_norm_gated"
LOG, SWI, SAM = "log_softmax", "swiglu", "silu_and_mul"
ROW = (1, 32)  # a single row: a backward that mixes rows up is right there
RANDOM = "random"  # a random cotangent on every row (an op of any shape's default)
MUTANTS: list[OpMutant] = [
    # A None gradient fails every gradient check (the contract is broken at each call).
    OpMutant("fa01_no_residual_gradient", FUSED, Point("dresidual"), (Point("forward"),)),
    OpMutant("fa02_residual_cotangent_through_the_norm", FUSED, Point("dx"),
             (Point("forward"),)),
    OpMutant("fa03_ignores_residual_out_cotangent", FUSED, Point("dresidual", "ones"),
             (Point("dw"), Point("forward"))),
    OpMutant("fa04_dx_double_weight", FUSED, Point("dx"),
             (Point("dx", "ones"), Point("dresidual", "ones"), Point("dx", "zeros"))),
    OpMutant("fa05_dw_from_x_not_the_sum", FUSED, Point("dw"), (Point("dx"),)),
    # bf16 mis-roundings: blind in fp64, where every cast is a no-op.
    OpMutant("fa06_lowp_residual_out_truncated", FUSED, Point("forward", dtype="bf16"),
             (Point("forward"), Point("dx", dtype="bf16"))),
    OpMutant("ln01_mean_subtracted_twice", LAYER, Point("dx"), (Point("dbias"),)),
    OpMutant("ln02_dbias_times_gamma", LAYER, Point("dbias"),
             (Point("dbias", "ones"), Point("dbias", "ones", "zeros"))),
    OpMutant("ln03_dx_drops_the_mean_term", LAYER, Point("dx", "ones"), (Point("dx", "zeros"),)),
    OpMutant("ln04_variance_not_centred", LAYER, Point("forward"), (Point("dbias"),)),
    OpMutant("ln05_lowp_normalised_row_cast_down", LAYER, Point("forward", dtype="bf16"),
             (Point("forward"), Point("dx"), Point("dbias", dtype="bf16"))),
    OpMutant("gn01_dz_written_as_dx", GATED, Point("dz"), (Point("dx"),)),
    OpMutant("gn02_backward_ignores_group_size", GATED, Point("dx", group_size=8),
             (Point("dx", group_size=32), Point("dz", group_size=32))),
    OpMutant("gn03_dx_double_weight", GATED, Point("dx"), (Point("dx", "ones"),)),
    OpMutant("gn04_backward_ignores_norm_before_gate", GATED,
             Point("dx", norm_before_gate=False), (Point("dx", norm_before_gate=True),
                                                    Point("dz", norm_before_gate=True))),
    OpMutant("gn05_lowp_dw_accumulated_in_input_dtype", GATED, Point("dw", dtype="bf16"),
             (Point("dw"), Point("forward", dtype="bf16"), Point("dx", dtype="bf16"))),
    # Beyond norms: no parameter, so no γ control; the row mix-ups are blind on one row, a
    # misread cotangent under the all-ones one too.
    OpMutant("ls01_backward_without_row_sum", LOG, Point("dx", cotangent=RANDOM),
             (Point("forward"),), False),
    OpMutant("ls02_cotangent_of_the_first_row", LOG, Point("dx", cotangent=RANDOM),
             (Point("dx", shape=ROW), Point("dx", cotangent="ones"), Point("forward")), False),
    OpMutant("ls03_gradient_stored_in_row_zero", LOG, Point("dx", cotangent=RANDOM),
             (Point("dx", shape=ROW),), False),
    OpMutant("sw01_silu_derivative_missing_its_product_term", SWI, Point("da"),
             (Point("db"), Point("forward")), False),
    OpMutant("sw02_gradient_stored_in_row_zero", SWI, Point("da"),
             (Point("da", shape=ROW), Point("db", shape=ROW)), False),
    OpMutant("sw03_cotangent_of_the_first_row", SWI, Point("db"),
             (Point("db", shape=ROW), Point("da", shape=ROW)), False),
    OpMutant("sm01_silu_derivative_missing_its_product_term", SAM, Point("dx", cotangent=RANDOM),
             (Point("forward"),), False),
    OpMutant("sm02_gradient_stored_in_row_zero", SAM, Point("dx", cotangent=RANDOM),
             (Point("dx", shape=ROW),), False),
    OpMutant("sm03_cotangent_of_the_first_row", SAM, Point("dx", cotangent=RANDOM),
             (Point("dx", shape=ROW), Point("dx", cotangent="ones")), False),
]
BY_STEM = {m.stem: m for m in MUTANTS}
CORRECT = {FUSED: "tests/kernels/fused_add_rms_norm.py", LAYER: "tests/kernels/layer_norm.py",
           GATED: "tests/kernels/rms_norm_gated.py", LOG: "tests/kernels/log_softmax.py",
           SWI: "tests/kernels/swiglu.py", SAM: "tests/kernels/silu_and_mul.py"}


def run_points(ref: str, points: list[Point], device: str = "cpu", op: str | None = None
               ) -> list[Any]:
    """Run each point (zcg off, at its shape) through the library (on CPU by default), the
    kernel read as ``op`` (``None``: from its parameter names)."""
    from gradcheck_bi.kernels import resolve
    from gradcheck_bi.runner import run
    from gradcheck_bi.sweep import sweep_of

    spec = resolve(ref, {"op": op} if op else None)
    results = []
    for p in points:
        sweep = sweep_of(kernels=[], targets=[(device, p.dtype)], shapes=[p.shape],
                      checks=[p.check],
                      weights=[p.weight], zcg=[False],
                      biases=[p.bias] if p.bias else ["randn"],
                      group_sizes=[p.group_size] if p.group_size else [None],
                      norm_before_gate=[True if p.norm_before_gate is None
                                        else p.norm_before_gate])
        results.extend(r for r in run(sweep, [spec]) if p.cotangent is None
                       or (r.variant or {}).get("cotangent") == p.cotangent)
    return results


def load_module(stem: str) -> Any:
    spec = importlib.util.spec_from_file_location(f"gradcheck_bi_op_mutant_{stem}",
                                                  HERE / f"{stem}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
