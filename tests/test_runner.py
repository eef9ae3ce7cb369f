"""The runner: points measured in order, in worker processes or here, one report either way."""

from __future__ import annotations

import json

import pytest
import torch

from gradcheck_bi import workers
from gradcheck_bi.kernels import resolve
from gradcheck_bi.report.render import to_json
from gradcheck_bi.runner import run_points, visible_gpus
from gradcheck_bi.sweep import Sweep, grid


def _points(device: str, dtype: str, seeds: list[int]) -> list:
    sweep = Sweep(kernels=["before", "after"], targets=[(device, dtype)], shapes=[(3, 48)],
                  seeds=seeds, checks=["forward", "dx", "dw", "batch_invariance"])
    specs = [resolve(k) for k in sweep.kernels]
    return [(spec, cfg, sweep) for spec, cfg in grid(sweep, specs)]


def _json(results: list) -> str:
    return to_json(results, True, {}, {})


def _first_difference(a: str, b: str) -> str:
    la, lb = a.splitlines(), b.splitlines()
    for n, (x, y) in enumerate(zip(la, lb, strict=False)):
        if x != y:
            return f"line {n}: {x!r} != {y!r}"
    return f"{len(la)} vs {len(lb)} lines"


def _here(points: list, monkeypatch: pytest.MonkeyPatch) -> list:
    with monkeypatch.context() as m:
        m.setenv("GRADCHECK_BI_ISOLATE", "0")
        return run_points(points, devices=[])


@pytest.mark.parametrize("start", ["fork", "spawn"])
def test_a_worker_process_gives_the_one_process_report(
        start: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # fork: the CPU worker of every Linux run; spawn: a CUDA worker's start (and the CPU
    # worker's where fork is missing), loading the kernels by reference.
    points = _points("cpu", "fp64", seeds=[3, 11] if start == "fork" else [3])
    seen: list[int] = []
    here = _here(points, monkeypatch)
    there = workers.measure(points, lambda r, n, total: seen.append(n), cpu_start=start)
    assert [(r.kernel, r.check, r.seed, r.weight) for r in there] == \
        [(r.kernel, r.check, r.seed, r.weight) for r in here], "results out of order"
    a, b = _json(here), _json(there)
    assert a == b, f"reports differ: {_first_difference(a, b)}"
    assert seen == list(range(1, len(points) + 1)), f"progress counts {seen}"
    assert {r.status for r in here} >= {"pass", "fail"}, "the sweep should hold both verdicts"


def test_a_worker_failing_on_its_own_is_gradcheck_bis_failure(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Not the kernel's doing (here: the worker's thread setup breaks before any point, as a
    # missing GPU would): exit 4's exception with the worker's traceback, not a hang and not
    # results blamed on the kernel. The forked worker inherits the patch.
    def broken(threads: int | None) -> None:
        raise OSError("no such device")

    monkeypatch.setattr("gradcheck_bi.fd.threads.apply_policy", broken)
    with pytest.raises(workers.WorkerFailure, match="worker on cpu: OSError: no such device"):
        workers.measure(_points("cpu", "fp64", seeds=[0])[:2])


def test_one_gpu_or_none_means_one_process() -> None:
    points = _points("cpu", "fp64", seeds=[0])
    assert visible_gpus(points) == [], "CPU points are never spread over GPUs"


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                    reason="needs >= 2 CUDA GPUs")
def test_points_spread_over_every_gpu_give_the_one_gpu_report() -> None:
    points = _points("cuda", "fp32", seeds=[1, 2, 5])
    assert len(visible_gpus(points)) == torch.cuda.device_count()
    one = run_points(points, devices=[])
    every = run_points(points)  # spread over every visible GPU by default
    a, b = _json(one), _json(every)
    assert a == b, f"reports differ: {_first_difference(a, b)}"
    assert json.loads(a)["results"], "no results"


def test_a_fresh_worker_loads_the_kernel_with_its_own_arguments() -> None:
    # A kernel resolved with kernel arguments (here --op, which its parameter names do not
    # say) and run from a sweep that does not carry them (the API, the mutant catalogues):
    # a spawned worker (every CUDA worker) reloads it from its reference with the arguments
    # it was loaded with, not the sweep's. Before, it was read as RMSNorm there and every
    # point errored: "cannot tell what 'weight', 'eps' should be".
    spec = resolve("tests/kernels/log_softmax.py:LogSoftmax", {"op": "log_softmax"})
    sweep = Sweep(kernels=[], targets=[("cpu", "fp64")], shapes=[(3, 40)],
                  checks=["forward", "dx"], weights=["randn"], zcg=[False])
    points = [(spec, cfg, sweep) for spec, cfg in grid(sweep, [spec])]
    results = workers.measure(points, cpu_start="spawn")
    assert {r.check for r in results} == {"forward", "dx"}
    assert all(r.status == "pass" for r in results), [(r.status, r.message) for r in results]


def test_an_op_of_any_shape_runs_by_draw_gradients_first_and_reports_in_grid_order(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The checks of one draw (any check, any layout) run one after another, gradient checks
    first, so that they share the draw and its error model; the results come back in the
    grid's order, each the one its point gives measured alone."""
    from gradcheck_bi.checks import shaped
    from gradcheck_bi.runner import execution_order

    sweep = Sweep(kernels=["tests/kernels/log_softmax.py:LogSoftmax"],
                  targets=[("cpu", "fp64")], shapes=[(3, 40)])
    spec = resolve(sweep.kernels[0])
    points = [(spec, cfg, sweep) for spec, cfg in grid(sweep, [spec])]
    order = execution_order(points)
    assert sorted(order) == list(range(len(points))) and order != list(range(len(points)))
    ran = [points[i][1] for i in order]
    draws = [(c.variant, c.seed, c.shape) for c in ran]
    for n in range(1, len(ran)):  # a draw's points are consecutive
        if draws[n] != draws[n - 1]:
            assert draws[n] not in draws[:n]
    for n in range(1, len(ran)):  # within one draw: gradients, then forward, then batch
        if draws[n] == draws[n - 1]:
            rank = {"forward": 1, "batch_invariance": 2}
            assert rank.get(ran[n - 1].check, 0) <= rank.get(ran[n].check, 0)
    derived: list[int] = []
    real = shaped.derived
    monkeypatch.setattr(shaped, "derived", lambda *a, **k: derived.append(1) or real(*a, **k))
    together = _json(_here(points, monkeypatch))
    shared, derived[:] = len(derived), []
    shaped._kept_model.clear()
    from gradcheck_bi import runner  # the grid's order: the checks of one draw apart

    monkeypatch.setattr(runner, "execution_order", lambda ps: list(range(len(ps))))
    apart = _json(_here(points, monkeypatch))
    assert together == apart, _first_difference(together, apart)
    assert shared < len(derived)  # fewer models derived
