"""The generic false-alarm harness of the ops of any shape (benchmarks/shaped_false_alarms.py):
its correct kernels pass every check at random configurations, every op in SHAPED is either
run or named as having no correct kernel, and a relative gradient defect is caught.

The fast test runs 2 configurations per op in fp64 (shapes of at most 10 colours a check);
the slow one 10 per op and dtype; the full run (200 per dtype) is recorded in docs/false_alarms.md.
"""

from __future__ import annotations

import importlib.util
import random
import sys
from pathlib import Path
from types import ModuleType

import pytest

from gradcheck_bi.checks.shaped import run_shaped_check
from gradcheck_bi.kernels import resolve
from gradcheck_bi.ops import SHAPED
from gradcheck_bi.ops.shaped import Variant


def _load() -> ModuleType:
    path = Path(__file__).resolve().parent.parent / "benchmarks" / "shaped_false_alarms.py"
    spec = importlib.util.spec_from_file_location("shaped_false_alarms", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["shaped_false_alarms"] = module
    spec.loader.exec_module(module)
    return module


harness = _load()


def _kernel(op: str) -> str:
    return str(harness.ROOT / harness.KERNELS[op])


def test_every_op_has_a_correct_kernel_or_is_named() -> None:
    """An op added without a correct kernel shows as such in the table, never dropped."""
    assert set(harness.KERNELS) <= set(SHAPED)
    rows = harness.table({("new_op", "fp64"): None}, {})
    assert "| new_op | fp64 | no correct kernel |" in rows


def test_draws_are_valid_and_vary() -> None:
    for name, op in SHAPED.items():
        if name not in harness.KERNELS:
            continue
        spec = resolve(_kernel(name))
        fixed = dict(spec.fixed)
        cfgs = list(harness.configs(op, spec, "fp64", 12, seed=3))
        shapes = {c[0].shape for c in cfgs}
        assert len(shapes) > 6
        for c in cfgs:
            v = Variant(c[0].variant)
            assert all(v[k] == x for k, x in fixed.items())
            assert harness.forward_calls(op, c[0].shape, v) <= harness.MAX_CALLS
            assert {x.check for x in c} <= set(op.checks)
        # a random shape of every op passes its own sizes(): 1–3 leading dims
        rng = random.Random(0)
        assert all(op.sizes(harness.random_shape(op, rng)) for _ in range(20))


@pytest.mark.parametrize("op", sorted(harness.KERNELS))
def test_two_random_configurations_fp64(op: str) -> None:
    tally = harness.false_alarms(op, "fp64", 2, seed=7, max_calls=60)  # small: a fast test
    assert tally.configs == 2 and tally.results >= 4
    assert not tally.alarms, "false alarms:\n" + "\n".join(tally.alarms)


def test_a_relative_gradient_defect_is_caught() -> None:
    """The wrapped kernel's gradients are off by 1 %: a gradient check fails; at δ = 0 it
    is the correct kernel and passes."""
    from gradcheck_bi.vocab import Config

    spec = resolve(_kernel("gelu_and_mul"))
    op = SHAPED["gelu_and_mul"]
    cfg = Config(check="da", dtype="fp64", shape=(3, 40), op=op.name,
                 variant=op.variants()[0].values)
    assert run_shaped_check(harness.Defective(spec.fn, 0.0), cfg).passed
    assert not run_shaped_check(harness.Defective(spec.fn, 1e-2), cfg).passed


@pytest.mark.slow
@pytest.mark.parametrize("dtype", harness.DTYPES)
@pytest.mark.parametrize("op", sorted(harness.KERNELS))
def test_ten_random_configurations(op: str, dtype: str) -> None:
    tally = harness.false_alarms(op, dtype, 10, seed=2026)
    assert tally.configs == 10
    assert not tally.alarms, "false alarms:\n" + "\n".join(tally.alarms)
