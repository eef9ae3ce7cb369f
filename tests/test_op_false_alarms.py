"""False alarms of the row ops' engine: the correct kernels pass every check of their op
at seeded random configurations (fp64 and fp32, CPU). A few small ones here; the ≥ 200
per dtype run is ``benchmarks/op_false_alarms.py`` (docs/false_alarms.md records it)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from conftest import load_benchmark

sys.path.insert(0, str(Path(__file__).resolve().parent / "independent"))
import op_false_alarms


def test_a_few_random_configurations_per_op() -> None:
    tallies = op_false_alarms.run(4, ("fp64", "fp32"), "cpu", seed=11,
                                  widths=tuple(w for w in op_false_alarms.WIDTHS if w <= 128))
    bad = [m for t in tallies.values() for m in t["messages"]]
    assert not bad, "false alarms:\n" + "\n".join(bad)


@pytest.mark.parametrize(("op", "check"), [("rms_norm", "dw"),  # Megatron's apply
                                           ("fused_add_rms_norm", "dresidual")])  # 2 outputs
def test_a_relative_gradient_defect_is_caught(op: str, check: str) -> None:
    """The wrapped kernel's gradients are off by 1 %: the check fails; at δ = 0 it is the
    correct kernel and passes."""
    from gradcheck_bi.checks import run_check
    from gradcheck_bi.vocab import Config

    bench = load_benchmark("op_false_alarms", "op_false_alarms_bench")
    fn = op_false_alarms.kernel(op_false_alarms.KERNELS[op]).fn
    cfg = Config(check=check, op=op, shape=(3, 40))
    assert run_check(bench.DefectiveNorm(fn, 0.0), cfg).passed
    assert not run_check(bench.DefectiveNorm(fn, 1e-2), cfg).passed
