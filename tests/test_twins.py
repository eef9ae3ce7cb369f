"""checks/twins.py: a layout point's gradient judged by its contiguous twin gives the verdict
its own finite differences give — bitwise where the kernel is layout-blind, within the twin's
margin where a layout only reorders a sum — and never passes a layout the kernel gets wrong."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from gradcheck_bi.checks.rows.point import make_point
from gradcheck_bi.checks.twins import Twins
from gradcheck_bi.inputs import make_inputs
from gradcheck_bi.kernels import resolve
from gradcheck_bi.kernels.calling.layout import LAYOUTS, lay_out
from gradcheck_bi.measure import PointMeasurer
from gradcheck_bi.shard import assign, twin_groups
from gradcheck_bi.sweep import Sweep, grid
from gradcheck_bi.vocab import Config, Result

KERNELS = Path(__file__).resolve().parent / "kernels"
ORDERS = f"{KERNELS}/layout_orders.py"


def _decided(r: Result) -> str:
    return str((r.details.get("twin") or {}).get("decided_by", "no twin"))


def _both(kernel: str, dtype: str = "fp64", shape: tuple[int, ...] = (2, 3, 40),
          layouts: tuple[str, ...] = LAYOUTS) -> list[tuple[Result, Result]]:
    """Every point of a small sweep measured with twins and with its own finite
    differences alone (a measurer that keeps no twin), pairwise."""
    sweep = Sweep(kernels=[kernel], targets=[("cpu", dtype)], shapes=[shape],
                  weights=["randn"], layouts=list(layouts), checks=None)
    spec = resolve(kernel)
    twins, alone = PointMeasurer(), PointMeasurer()
    alone.twins = Twins(keep_bytes=-1)
    return [(twins(spec, cfg, sweep), alone(spec, cfg, sweep)) for _, cfg in grid(sweep, [spec])]


def test_a_twin_sees_bitwise_the_same_inputs() -> None:
    for layout in LAYOUTS:
        cfg = Config(check="dx", layout=layout, shape=(2, 3, 40), control="randn", seed=3)
        twin = replace(cfg, layout="contiguous")
        for a, b in zip(make_inputs(cfg), make_inputs(twin), strict=True):
            for name in ("x", "weight", "grad"):
                laid = lay_out(a, layout, name)
                assert laid.dtype == b.dtype and torch.equal(
                    laid.contiguous().view(torch.int64), b.view(torch.int64)), (layout, name)
        fam = replace(cfg, op="fused_add_rms_norm", bias=None)
        pa, pb = make_point(fam), make_point(replace(fam, layout="contiguous"))
        for ta, tb in ((pa.inputs, pb.inputs), (pa.params, pb.params),
                       (pa.cotangents, pb.cotangents)):
            assert all(torch.equal(ta[n].view(torch.int64), tb[n].view(torch.int64)) for n in ta)


@pytest.mark.parametrize(("kernel", "dtype"), [("after", "fp64"), ("before", "fp64"),
                                               ("after", "fp32")])
def test_a_layout_blind_kernel_gets_its_twins_measurement(kernel: str, dtype: str) -> None:
    """Bitwise equal: the same numbers and verdict as the point's own finite differences —
    ``before``'s failures at every layout included."""
    pairs = _both(kernel, dtype, layouts=("contiguous", "x-strided", "grad-strided",
                                          "weight-offset", "grad-offset"))
    judged = [(t, a) for t, a in pairs if t.layout != "contiguous" and t.check in ("dx", "dw")]
    assert judged and all(_decided(t).startswith("bitwise") for t, _ in judged)
    for t, a in pairs:
        assert (t.status, t.max_abs_err, t.tolerance, t.message) == (
            a.status, a.max_abs_err, a.tolerance, a.message), (t.check, t.layout)
        assert {k: v for k, v in t.details.items() if k != "twin"} == a.details
    if kernel == "before":
        assert any(t.status == "fail" for t, _ in judged)


def test_a_reordered_sum_passes_within_the_twins_margin() -> None:
    """A backward that sums in another order on a strided cotangent: other last bits, the
    same verdict (pass) as its own finite differences; a forward that does so on a
    transposed x: no twin decides, its own finite differences pass it."""
    pairs = _both(f"{ORDERS}:SumsByLayout", shape=(2, 8, 256))
    by = {(t.check, t.layout): t for t, _ in pairs}
    assert _decided(by["dw", "grad-strided"]).startswith("within the twin's margin")
    assert _decided(by["dx", "grad-transposed"]).startswith("within the twin's margin")
    assert _decided(by["dx", "x-strided"]).startswith("bitwise")
    assert all(t.status == a.status == "pass" for t, a in pairs), [
        (t.check, t.layout, t.message) for t, _ in pairs if t.status != "pass"]
    fwd = _both(f"{ORDERS}:ForwardSumsByLayout", shape=(2, 8, 256),
                layouts=("contiguous", "x-strided"))
    own = [t for t, _ in fwd if t.layout == "x-strided" and t.check in ("dx", "dw")]
    assert own and all(_decided(t) == "own finite differences" and "y: " in
                       t.details["twin"]["why"] and t.status == "pass" for t in own)


def test_a_small_layout_slip_is_not_absorbed_by_the_margin() -> None:
    pairs = _both(f"{ORDERS}:SlipsOnStridedGrad", shape=(2, 8, 256),
                  layouts=("contiguous", "grad-strided", "grad-transposed", "x-strided"))
    failed = {(t.check, t.layout) for t, _ in pairs if t.status == "fail"}
    assert failed == {("dx", "grad-strided"), ("dx", "grad-transposed")}, failed
    assert all(t.status == a.status for t, a in pairs)
    for t, a in pairs:
        if (t.check, t.layout) in failed:  # its own finite differences, and say why
            assert "beyond the twin's margin" in t.details["twin"]["why"], t.details
            assert (t.max_abs_err, t.tolerance) == (a.max_abs_err, a.tolerance)


@pytest.mark.parametrize("kernel", ["fused_add_rms_norm.py:FusedAddRMSNorm",
                                    "layer_norm.py:LayerNorm"])
def test_the_other_row_ops_are_judged_by_twins_too(kernel: str) -> None:
    pairs = _both(f"{KERNELS}/{kernel}", layouts=("contiguous", "x-strided", "grad-strided"))
    judged = [t for t, _ in pairs if t.layout != "contiguous" and t.check != "forward"]
    # The layer norm's dbias sums a strided cotangent in another order: within the margin.
    assert judged and all(_decided(t).startswith(("bitwise", "within the twin's margin"))
                          for t in judged)
    assert any(_decided(t).startswith("bitwise") for t in judged)
    assert all(t.status == a.status == "pass" for t, a in pairs)
    assert all((t.max_abs_err, t.tolerance) == (a.max_abs_err, a.tolerance)
               for t, a in pairs if not _decided(t).startswith("within"))


@pytest.mark.parametrize("attr", ["ResidualAssumedContiguous", "ResidualGradAssumedContiguous"])
def test_the_fused_add_layout_mutants_fail_at_their_layout(attr: str) -> None:
    pairs = _both(f"{KERNELS}/norm_layouts.py:{attr}",
                  layouts=("contiguous", "x-strided", "grad-strided"))
    assert {t.status for t, _ in pairs if t.layout == "contiguous"} == {"pass"}
    assert any(t.status == "fail" for t, _ in pairs)
    assert [(t.status, t.message) for t, _ in pairs] == [(a.status, a.message) for _, a in pairs]


def test_a_shard_keeps_a_layout_point_with_its_twin() -> None:
    """gradcheck_bi.shard deals a layout point to its twin's shard (same kernel), so a
    sharded run says what the unsharded one says (tests/test_shard.py merges ci.toml)."""
    cfgs = [Config(check="dx", control="randn", layout=lay)
            for lay in ("contiguous", "x-strided", "grad-strided")]
    assert twin_groups(cfgs * 2, ["a"] * 3 + ["b"] * 3) == [0, 0, 0, 3, 3, 3]
    owner = assign(cfgs * 2, 2, ["a"] * 3 + ["b"] * 3)
    assert owner[:3] == [owner[0]] * 3 and owner[3:] == [owner[3]] * 3 != owner[:3]


def test_the_points_of_one_layout_share_their_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    """dx's and dw's points at one layout make the kernel's two calls once: dw's reads dx's
    outputs and gradients (the draw never depends on the check), and every result is the
    one it gets from its own calls."""
    from gradcheck_bi.checks import twins

    sweep = Sweep(kernels=["after"], targets=[("cpu", "fp64")], shapes=[(2, 3, 40)],
                  weights=["randn", "ones"], layouts=["contiguous", "x-strided", "grad-strided"],
                  checks=["dx", "dw"])
    spec = resolve("after")
    real, made = twins._both_layouts, []

    def counted(fn, cfg):  # type: ignore[no-untyped-def]
        made.append((cfg.check, cfg.layout, cfg.control, cfg.zero_centered_gamma))
        return real(fn, cfg)

    monkeypatch.setattr(twins, "_both_layouts", counted)
    points = list(grid(sweep, [spec]))
    measure = PointMeasurer()
    shared = [measure(spec, cfg, sweep).to_dict() for _, cfg in points]
    n_shared, made[:] = len(made), []
    monkeypatch.setattr(twins, "KEEP_CALLS", 0)  # nothing kept: each point its own calls
    measure = PointMeasurer()
    alone = [measure(spec, cfg, sweep).to_dict() for _, cfg in points]
    assert shared == alone
    laid_points = sum(cfg.layout != "contiguous" for _, cfg in points)
    assert len(made) == laid_points and n_shared == laid_points // 2, (n_shared, len(made))


def test_a_shared_call_keeps_the_notes_of_declared_writes(monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    """A kernel that writes into its cotangent, declared: dw's layout points, which read
    dx's calls, carry the same note as when they make their own."""
    from gradcheck_bi.checks import twins

    sweep = Sweep(kernels=[f"{KERNELS}/side_effects.py:InPlaceDeclared"],
                  targets=[("cpu", "fp64")], shapes=[(2, 4, 64)], weights=["randn"],
                  layouts=["contiguous", "x-strided", "grad-strided"], checks=["dx", "dw"],
                  allow_mutation=["grad_output"])
    spec = resolve(sweep.kernels[0])
    points = list(grid(sweep, [spec]))

    def run() -> list[dict]:  # type: ignore[type-arg]
        measure = PointMeasurer()
        return [measure(spec, cfg, sweep).to_dict() for _, cfg in points]

    shared = run()
    monkeypatch.setattr(twins, "KEEP_CALLS", 0)
    assert shared == run()
    laid = [r for r in shared if r["layout"] != "contiguous"]
    assert laid and all("declared mutation" in (r["message"] or "") for r in laid), laid[:1]
