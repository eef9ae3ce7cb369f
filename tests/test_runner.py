"""The runner: points measured in order, in one process or spread over worker processes."""

from __future__ import annotations

import json

import pytest
import torch

from gradcheck_bi.kernels import resolve
from gradcheck_bi.report.render import to_json
from gradcheck_bi.runner import run_points, spread, visible_gpus
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


def test_spread_over_two_cpu_workers_gives_the_one_process_report() -> None:
    # Two spawned workers share one queue of CPU points: the split, the worker loop and the
    # merge are those a multi-GPU run uses; only the device each worker pins differs.
    points = _points("cpu", "fp64", seeds=[3, 11])
    seen: list[int] = []
    one = run_points(points, devices=[])
    two = spread(points, ["cpu", "cpu"], on_result=lambda r, n, total: seen.append(n))
    assert [(r.kernel, r.check, r.seed, r.weight) for r in two] == \
        [(r.kernel, r.check, r.seed, r.weight) for r in one], "results out of order"
    a, b = _json(one), _json(two)
    assert a == b, f"reports differ: {_first_difference(a, b)}"
    assert seen == list(range(1, len(points) + 1)), f"progress counts {seen}"
    assert {r.status for r in one} >= {"pass", "fail"}, "the sweep should hold both verdicts"


def test_a_failed_worker_is_reported_and_its_points_run_here() -> None:
    # A worker that cannot start (here: no such GPU) must neither hang the run nor lose
    # points: it is named in a warning and this process measures what it left.
    points = _points("cpu", "fp64", seeds=[0])[:6]
    with pytest.warns(RuntimeWarning, match="cuda:99"):
        results = spread(points, ["cpu", "cuda:99"])
    a, b = _json(run_points(points, devices=[])), _json(results)
    assert a == b, f"reports differ: {_first_difference(a, b)}"


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
