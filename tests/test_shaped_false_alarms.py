"""The generic false-alarm harness of the ops of any shape (benchmarks/shaped_false_alarms.py):
its correct kernels pass every check at random configurations, every op in SHAPED has one
(an op without is named in the table, never dropped), a relative gradient defect is caught,
and its rows (--deadline, --shard, --json) join into one table (benchmarks/merge_false_alarms.py).

The fast test runs 2 configurations per op in fp64 (shapes of at most 10 colours a check);
the slow one 10 per op and dtype; the full run (200 per dtype) is recorded in docs/false_alarms.md.
"""

from __future__ import annotations

import json
import random
import sys
import time
from pathlib import Path

import pytest
from conftest import load_benchmark

from gradcheck_bi.checks.shaped import run_shaped_check
from gradcheck_bi.kernels import resolve
from gradcheck_bi.ops import SHAPED
from gradcheck_bi.ops.shaped import Variant

harness = load_benchmark("shaped_false_alarms")
merge = sys.modules["merge_false_alarms"]  # imported by the harness from benchmarks/


def _kernel(op: str) -> str:
    return str(harness.ROOT / harness.KERNELS[op])


def test_every_op_has_a_correct_kernel_or_is_named() -> None:
    """Every op of SHAPED has a correct kernel here; one added without shows as such in the
    table, never dropped."""
    # the ops modules define (a generic check registers its "generic:" op in SHAPED when it
    # runs: one that ran earlier in this process is no op of the package)
    ops = {name for name in SHAPED if not name.startswith("generic:")}
    assert set(harness.KERNELS) == ops, ops ^ set(harness.KERNELS)
    rows = harness.table({("new_op", "fp64"): None}, {})
    assert "| new_op | fp64 | cpu | no correct kernel |" in rows


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


def test_a_deadline_counts_the_configurations_completed() -> None:
    tally = harness.false_alarms("log_softmax", "fp64", 5, seed=7, until=time.perf_counter())
    assert (tally.asked, tally.configs, tally.results) == (5, 0, 0)
    row = harness.row("log_softmax", "fp64", "cpu", tally, n=5)
    assert "| log_softmax | fp64 | cpu | 0 of 5 | 0 | 0 |" in merge.markdown([row])


def test_shards_split_the_same_draws_and_join_into_one_row() -> None:
    op = SHAPED["token_logprobs"]
    spec = resolve(_kernel("token_logprobs"))
    whole = list(harness.configs(op, spec, "fp64", 5, seed=3, device="cuda"))
    assert all(c.device == "cuda" for cfgs in whole for c in cfgs)  # drawn, never run here
    asked = [harness.false_alarms("token_logprobs", "fp64", 5, seed=3, shard=(i, 2),
                                  until=time.perf_counter()).asked for i in (0, 1)]
    assert asked == [3, 2]
    rows = []
    for i, (done, worst) in enumerate([(3, 0.2), (2, 0.4)]):
        t = harness.Tally(asked=asked[i], configs=done, results=3 * done, worst=worst,
                          seconds=float(done))
        rows.append(harness.row("token_logprobs", "fp64", "cuda", t, 1e-11 if i == 0 else None,
                                i == 0, 5, (i, 2), seed=3))
    (joined,) = merge.joined(rows)
    assert (joined["configurations"], joined["results"], joined["worst_err_tol"]) == (5, 15, 0.4)
    assert "| token_logprobs | fp64 | cuda | 5 | 15 | 0 | 0.40 | 1.00 | 1.0e-11 |" in \
        merge.markdown([joined])


def test_merge_reads_json_rows_and_refuses_a_shard_twice(tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]
                                                         ) -> None:
    t = harness.Tally(asked=2, configs=2, results=6, seconds=1.0)
    t.alarms.append("line")
    t.alarm_configs.append({"configuration": 1, "check": "dx", "status": "fail",
                            "message": "dx off", "reproduce": "run_shaped_check(...)"})
    path = tmp_path / "a.json"
    path.write_text(json.dumps({"rows": [harness.row("log_softmax", "bf16", "cuda", t, n=2)]}))
    assert merge.main([str(path)]) == 1  # a false alarm
    out = capsys.readouterr().out
    assert "| log_softmax | bf16 | cuda | 2 | 6 | 1 |" in out
    assert "FALSE ALARM: log_softmax bf16 cuda #1 dx fail: dx off" in out
    assert merge.main([str(path), str(path)]) == 2
    assert "in two files" in capsys.readouterr().err
