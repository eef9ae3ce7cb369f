"""The mutant catalogue and the helpers that run it: shared by tests/test_mutants.py and
tests/mutants/make_table.py (which writes docs/mutants.md).

Each mutant is a correct batch-invariant RMSNorm with one defect (``# MUTANT`` in its file).
``primary`` is the check that should catch it; ``fast`` is one (check, γ, zcg, shape) point
where that check must fail, cheap enough for the default test suite; ``blind`` lists points
where the defect is invisible by construction (a γ control that hides it), which is what
makes the controls a discriminator and not a measurement. ``dtype`` is where those points
run: fp64 for most; bf16 for the low-precision mutants (m31-m35), whose casts are no-ops
in fp64 — there they must pass.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import math
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
CI_CASE = REPO / "cases" / "ci.toml"
# Fast points run a smaller shape than the CLI default (2, 8, 256): still 3-D, D a
# multiple of 128. ODD_SHAPE has D not a multiple of 128 (nor a power of two): the regime
# that tail-dropping reductions need.
DEFAULT_SHAPE = (2, 4, 128)
ODD_SHAPE = (2, 3, 200)
# WIDE_SHAPE has D above 1024 (a second 1024-wide block), for defects only wide rows show.
WIDE_SHAPE = (2, 1030)

Point = tuple[str, str, bool, tuple[int, ...]]  # check, γ control, zcg, shape


@dataclass(frozen=True)
class Mutant:
    stem: str
    primary: str
    fast: Point
    blind: tuple[Point, ...] = field(default=())
    attr: str = "Mutant"
    dtype: str = "fp64"
    # How rounding is judged: m13 computes in fp32 inside an fp64 call, which the default
    # (measured) judges at fp32 by design; only --precision exact calls it a defect.
    precision: str = "measured"

    @property
    def path(self) -> Path:
        return HERE / f"{self.stem}.py"

    @property
    def ref(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.attr}"

    @property
    def title(self) -> str:
        """The defect, from the first line of the mutant's docstring."""
        doc = ast.get_docstring(ast.parse(self.path.read_text())) or ""
        return doc.splitlines()[0].split(":", 1)[1].strip().rstrip(".")


def _p(check: str, weight: str = "randn", zcg: bool = False,
       shape: tuple[int, ...] = DEFAULT_SHAPE) -> Point:
    return (check, weight, zcg, shape)


MUTANTS: list[Mutant] = [
    Mutant("m01_dx_double_weight", "dx", _p("dx"), (_p("dx", "ones"), _p("dx", "zeros"))),
    Mutant("m02_forward_ignores_zcg", "forward", _p("forward", zcg=True),
           (_p("forward", zcg=False), _p("dw", zcg=True))),
    Mutant("m03_dx_first_term_no_gamma", "dx", _p("dx"), (_p("dx", "ones"),)),
    Mutant("m04_dx_no_variance_term", "dx", _p("dx", "ones"), (_p("dx", "zeros"),)),
    Mutant("m05_dx_variance_sign", "dx", _p("dx", "ones"), (_p("dx", "zeros"),)),
    Mutant("m06_dx_r_squared", "dx", _p("dx")),
    Mutant("m07_dx_s_wrong_dim", "dx", _p("dx")),
    Mutant("m08_forward_mean_wrong_dims", "forward", _p("forward")),
    Mutant("m09_dw_no_rsigma", "dw", _p("dw")),
    Mutant("m10_dw_times_gamma", "dw", _p("dw"), (_p("dw", "ones"),)),
    Mutant("m11_backward_ignores_zcg", "dx", _p("dx", zcg=True), (_p("dx", zcg=False),)),
    Mutant("m12_s_raw_weight_zcg", "dx", _p("dx", zcg=True), (_p("dx", zcg=False),)),
    Mutant("m13_compute_in_fp32", "forward", _p("forward"), precision="exact"),
    Mutant("m14_dw_fp32_accumulation", "dw", _p("dw")),
    Mutant("m15_eps_outside_sqrt", "forward", _p("forward")),
    Mutant("m16_backward_recomputes_r_without_eps", "dx", _p("dx")),
    # D = 200: on CUDA in fp64 at D = 128 the two half-row sums are bitwise the compiled
    # Triton row sum (its tree's last step adds the halves), so no batch-dependence exists
    # there to catch (docs/gpu_validation.md, "m17 on CUDA"); at D = 200 it shows on CPU and CUDA.
    Mutant("m17_batch_dependent_order", "batch_invariance",
           _p("batch_invariance", shape=ODD_SHAPE), (_p("dx"), _p("forward"))),
    Mutant("m18_dx_wrong_d", "dx", _p("dx")),
    Mutant("m19_reduction_drops_tail", "forward", _p("forward", shape=ODD_SHAPE),
           (_p("forward"),)),
    Mutant("m20_backward_sum_drops_tail", "dx", _p("dx", shape=ODD_SHAPE), (_p("dx"),)),
    # Small defects (docs/small_defects.md): above the measured floor, below the tolerances
    # before it.
    # Fast points run in fp64 (the catalog's dtype). m23 is an fp64-only catch: its effect
    # (~5e-9 relative) sits under the fp32 floor (~1e-6 relative), where no finite
    # difference can see it (docs/mutants.md has both dtypes).
    Mutant("m21_dx_approx_rsqrt", "dx", _p("dx"), (_p("dx", "zeros"),)),
    Mutant("m22_dw_rsigma_18_bits", "dw", _p("dw")),
    Mutant("m23_dx_eps_scaled", "dx", _p("dx")),
    Mutant("m24_dx_variance_d_minus_1_wide", "dx", _p("dx", shape=WIDE_SHAPE), (_p("dx"),)),
    # Low precision: each is the correct kernel in fp64 and rounds wrong in bf16/fp16.
    Mutant("m31_lowp_zcg_offset_in_input_dtype", "forward", _p("forward", zcg=True),
           (_p("forward", "ones", zcg=True), _p("forward", "zeros", zcg=True),
            _p("forward", zcg=False)), dtype="bf16"),
    Mutant("m32_lowp_rsigma_rounded", "forward", _p("forward", "ones"), dtype="bf16"),
    Mutant("m33_lowp_normalised_row_cast_down", "forward", _p("forward"),
           (_p("forward", "ones"), _p("forward", "zeros")), dtype="bf16"),
    Mutant("m34_lowp_dx_sum_in_input_dtype", "dx", _p("dx", "ones"), (_p("dx", "zeros"),),
           dtype="bf16"),
    Mutant("m35_lowp_dw_accumulated_in_input_dtype", "dw", _p("dw"), (_p("forward"),),
           dtype="bf16"),
]
BY_STEM = {m.stem: m for m in MUTANTS}

_modules: dict[str, Any] = {}


def load(stem: str, attr: str = "Mutant") -> Any:
    """Import ``tests/mutants/<stem>.py`` by path (or tests/independent) → the Function."""
    path = HERE / f"{stem}.py"
    if not path.exists():
        path = REPO / "tests" / "independent" / f"{stem}.py"
    name = f"gradcheck_bi_test_{stem}"
    if name not in _modules:
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _modules[name] = module
    return getattr(_modules[name], attr)


def run_points(fn: Any, name: str, points: list[Point], dtype: str = "fp64",
               device: str = "cpu", precision: str = "measured") -> list[Any]:
    """Run single (check, γ, zcg, shape) points through the library (on CPU by default)."""
    from gradcheck_bi.runner import run
    from gradcheck_bi.sweep import Sweep
    from gradcheck_bi.vocab import KernelSpec

    spec = KernelSpec(name, fn, source="api")  # an object loaded here, never by reference
    results = []
    for check, weight, zcg, shape in points:
        sweep = Sweep(kernels=[], targets=[(device, dtype)], shapes=[shape], checks=[check],
                      weights=[weight], zcg=[zcg], precision=precision)
        results.extend(run(sweep, [spec]))
    return results


def run_ci(ref: str, extra: list[str] | None = None,
           dtype: str = "fp64") -> tuple[int, dict[str, Any]]:
    """``gradcheck-bi run --case cases/ci.toml --kernel REF`` on CPU in ``dtype`` → (exit, JSON)."""
    from gradcheck_bi.cli import main

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "report.json"
        code = main(["run", "--case", str(CI_CASE), "--kernel", ref, "--device", "cpu",
                     "--dtype", dtype, "--format", "json", "--output", str(out),
                     "--no-progress", *(extra or [])])
        doc = json.loads(out.read_text()) if out.exists() else {}
    return code, doc


def regime(r: dict[str, Any]) -> str:
    """A short label for the data regime of one result: shape, scales, eps."""
    shape = "×".join(str(d) for d in r["shape"])
    label = f"{shape}"
    if r.get("input_scale", 1.0) != 1.0:
        label += f" x·{r['input_scale']:g}"
    if r.get("weight_scale", 1.0) != 1.0:
        label += f" γ·{r['weight_scale']:g}"
    return label + f" eps {r['eps']:g}"


def caught_by(results: list[dict[str, Any]]) -> dict[str, dict[str, set[str]]]:
    """check → {"controls": {"γ=randn zcg off", ...}, "regimes": {...}} for every result
    that was not as expected (the kernel is expected to pass everywhere)."""
    out: dict[str, dict[str, set[str]]] = {}
    for r in results:
        if r["as_expected"]:
            continue
        entry = out.setdefault(r["check"], {"controls": set(), "regimes": set()})
        zcg = "on" if r["zero_centered_gamma"] else "off"
        entry["controls"].add(f"γ={r['weight']} zcg {zcg}")
        entry["regimes"].add(regime(r))
    return out


def torch_gradcheck(fn: Any, zcg: bool, shape: tuple[int, ...] = (2, 3, 16),
                    seed: int = 0) -> str:
    """``torch.autograd.gradcheck`` with default arguments on (x, w), γ = randn, fp64."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=gen, dtype=torch.float64, requires_grad=True)
    gamma = torch.randn(shape[-1], generator=gen, dtype=torch.float64)
    w = (gamma - 1 if zcg else gamma).requires_grad_(True)
    f: Callable[..., torch.Tensor] = lambda a, b: fn.apply(a, b, 1e-6, zcg)  # noqa: E731
    try:
        torch.autograd.gradcheck(f, (x, w))
    except Exception as exc:  # GradcheckError: report which input it blamed
        text = str(exc)
        which = "x" if "respect to input 0" in text else "w" if "respect to input 1" in text \
            else "?"
        return f"fails (d/d{which})"
    return "passes"


def fmt(v: float | None) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "—"
    return f"{v:.2e}"
